package dev.cpuslot.slot;

/**
 * A slot's cumulative counters, read from the read-only counter fds the agent passes after a
 * slot's placement fds (spec: HELLO_OK {@code stat_fds}). On cgroup v2 one fd, {@code cpu.stat}
 * ({@code usage_usec}, {@code nr_periods}, {@code nr_throttled}, {@code throttled_usec}); on v1
 * two, {@code cpu.stat} ({@code nr_periods}, {@code nr_throttled}, {@code throttled_time} in ns)
 * then {@code cpuacct.usage} (CPU time in ns).
 */
public record SlotCounters(long cpuNanos, long throttledNanos, long periods, long throttledPeriods) {

    /** Reads the counters with pread at offset 0; acctFd &lt; 0 when there is none (v2). */
    public static SlotCounters read(int statFd, int acctFd) throws Native.NativeException {
        String stat = Native.preadText(statFd, 1024);
        String acct = acctFd >= 0 ? Native.preadText(acctFd, 64) : null;
        return parse(stat, acct);
    }

    /** Parses cpu.stat text (and, on v1, cpuacct.usage text, else null). */
    public static SlotCounters parse(String cpuStat, String cpuacctUsage) {
        long cpu = 0, thr = 0, periods = 0, thrPeriods = 0;
        int i = 0, n = cpuStat.length();
        while (i < n) {
            int eol = cpuStat.indexOf('\n', i);
            if (eol < 0) eol = n;
            int sp = cpuStat.indexOf(' ', i);
            if (sp > i && sp < eol) {
                String k = cpuStat.substring(i, sp);
                long v = number(cpuStat, sp + 1, eol);
                switch (k) {
                    case "usage_usec" -> cpu = v * 1000;
                    case "nr_periods" -> periods = v;
                    case "nr_throttled" -> thrPeriods = v;
                    case "throttled_usec" -> thr = v * 1000;
                    case "throttled_time" -> thr = v; // v1: ns
                    default -> { }
                }
            }
            i = eol + 1;
        }
        if (cpuacctUsage != null) cpu = number(cpuacctUsage, 0, cpuacctUsage.length());
        return new SlotCounters(cpu, thr, periods, thrPeriods);
    }

    private static long number(String s, int from, int to) {
        long v = 0;
        for (int i = from; i < to; i++) {
            char c = s.charAt(i);
            if (c >= '0' && c <= '9') v = v * 10 + (c - '0');
            else if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
        }
        return v;
    }

    /** What was used between {@code start} and this reading (never negative). */
    public Usage since(SlotCounters start) {
        return new Usage(true, Math.max(0, cpuNanos - start.cpuNanos), Math.max(0, throttledNanos - start.throttledNanos),
                Math.max(0, periods - start.periods), Math.max(0, throttledPeriods - start.throttledPeriods));
    }
}
