package dev.cpuslot.slot;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * A slot's cumulative counters, read from the read-only counter fds the agent passes after a
 * slot's placement fds (spec: HELLO_OK {@code stat_fds}). On cgroup v2 one fd, {@code cpu.stat}
 * ({@code usage_usec}, {@code nr_periods}, {@code nr_throttled}, {@code throttled_usec}); on v1
 * two, {@code cpu.stat} ({@code nr_periods}, {@code nr_throttled}, {@code throttled_time} in ns)
 * then {@code cpuacct.usage} (CPU time in ns).
 */
public record SlotCounters(long cpuNanos, long throttledNanos, long periods, long throttledPeriods) {

    private static final int STAT_MAX = 1024, ACCT_MAX = 64;
    /** Per thread: the bytes of one reading (cpu.stat, then cpuacct.usage), reused. */
    private static final ThreadLocal<byte[]> BUF = ThreadLocal.withInitial(() -> new byte[STAT_MAX + ACCT_MAX]);

    /**
     * Reads the counters with pread at offset 0; acctFd &lt; 0 when there is none (v2). Parses
     * the bytes where they were read (a thread's buffer): no String or array per reading, as this
     * runs once per invocation.
     */
    public static SlotCounters read(int statFd, int acctFd) throws Native.NativeException {
        byte[] b = BUF.get();
        int n = Native.pread(statFd, b, 0, STAT_MAX);
        int m = acctFd >= 0 ? Native.pread(acctFd, b, STAT_MAX, ACCT_MAX) : -1;
        return parse(b, n, m < 0 ? -1 : STAT_MAX, m);
    }

    /** Parses cpu.stat text (and, on v1, cpuacct.usage text, else null). */
    public static SlotCounters parse(String cpuStat, String cpuacctUsage) {
        byte[] stat = cpuStat.getBytes(StandardCharsets.US_ASCII);
        byte[] acct = cpuacctUsage == null ? new byte[0] : cpuacctUsage.getBytes(StandardCharsets.US_ASCII);
        byte[] b = new byte[stat.length + acct.length];
        System.arraycopy(stat, 0, b, 0, stat.length);
        System.arraycopy(acct, 0, b, stat.length, acct.length);
        return parse(b, stat.length, cpuacctUsage == null ? -1 : stat.length, acct.length);
    }

    private static final byte[] USAGE_USEC = key("usage_usec"), NR_PERIODS = key("nr_periods"),
            NR_THROTTLED = key("nr_throttled"), THROTTLED_USEC = key("throttled_usec"), THROTTLED_TIME = key("throttled_time");

    private static byte[] key(String k) { return k.getBytes(StandardCharsets.US_ASCII); }

    /**
     * Parses cpu.stat from b[0..statLen) and, when acctAt &gt;= 0, cpuacct.usage from
     * b[acctAt..acctAt+acctLen).
     */
    static SlotCounters parse(byte[] b, int statLen, int acctAt, int acctLen) {
        long cpu = 0, thr = 0, periods = 0, thrPeriods = 0;
        int i = 0;
        while (i < statLen) {
            int eol = i;
            while (eol < statLen && b[eol] != '\n') eol++;
            int sp = i;
            while (sp < eol && b[sp] != ' ') sp++;
            if (sp > i && sp < eol) {
                long v = number(b, sp + 1, eol);
                if (is(b, i, sp, USAGE_USEC)) cpu = v * 1000;
                else if (is(b, i, sp, NR_PERIODS)) periods = v;
                else if (is(b, i, sp, NR_THROTTLED)) thrPeriods = v;
                else if (is(b, i, sp, THROTTLED_USEC)) thr = v * 1000;
                else if (is(b, i, sp, THROTTLED_TIME)) thr = v; // v1: ns
            }
            i = eol + 1;
        }
        if (acctAt >= 0) cpu = number(b, acctAt, acctAt + acctLen);
        return new SlotCounters(cpu, thr, periods, thrPeriods);
    }

    private static boolean is(byte[] b, int from, int to, byte[] key) {
        return Arrays.equals(b, from, to, key, 0, key.length);
    }

    private static long number(byte[] s, int from, int to) {
        long v = 0;
        for (int i = from; i < to; i++) {
            byte c = s[i];
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
