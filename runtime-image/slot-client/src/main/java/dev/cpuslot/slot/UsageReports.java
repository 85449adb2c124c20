package dev.cpuslot.slot;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What invocations under HOLD leases used, summed per (action, outcome) until it goes out as
 * USAGE records (spec: "USAGE"). Adding is cheap (a short lock, no I/O): the invocation path adds,
 * a background thread takes. Bounded: past {@link #MAX_KEYS} pending keys (an agent away for long
 * while many actions run) further keys are dropped and counted.
 */
final class UsageReports {
    /** Keys at which a report goes out early (spec: one USAGE early at 8 keys). */
    static final int EARLY = Protocol.MAX_USAGE_RECORDS;
    static final int MAX_KEYS = 4096;
    private static final long MAX_U32 = 0xFFFFFFFFL;

    private record Key(String action, int outcome) {}

    private static final class Sum {
        final Key key;
        long invocations, cpuNanos, throttledNanos;
        /** Taken out of pending: a new invocation of its key needs a new Sum. */
        boolean taken;
        Sum(Key key) { this.key = key; }
    }

    /**
     * The sum added to last: the next invocation is nearly always of the same action and outcome
     * (a runtime serves one action), so it adds here without a key object or a map lookup.
     */
    private Sum last;

    private final Map<Key, Sum> pending = new LinkedHashMap<>();
    private final Counters counters;

    UsageReports(Counters counters) { this.counters = counters; }

    /**
     * Adds one invocation's usage (an unmeasured one counts with zero time). True when the
     * pending keys reached {@link #EARLY}: the caller wakes the sender.
     */
    boolean add(String action, ReleaseOutcome outcome, Usage u) {
        int code = outcome.code;
        if (code > Protocol.RELEASE_TIMEOUT) return false; // PLACEMENT_FAILED: no invocation ran in the slot
        synchronized (this) {
            Sum s = last;
            if (s != null && !s.taken && s.key.outcome() == code && s.key.action().equals(action)) {
                s.invocations++;
                s.cpuNanos += u.cpuNanos();
                s.throttledNanos += u.throttledNanos();
                return pending.size() >= EARLY;
            }
        }
        return add(new Key(action, code), 1, u.cpuNanos(), u.throttledNanos());
    }

    /**
     * Adds n invocations of one action and outcome and what they used (a batch read from one
     * pair of counter readings). True when the pending keys reached {@link #EARLY}.
     */
    boolean add(String action, int code, long n, long cpu, long throttled) {
        synchronized (this) {
            Sum s = last;
            if (s != null && !s.taken && s.key.outcome() == code && s.key.action().equals(action)) {
                s.invocations += n;
                s.cpuNanos += cpu;
                s.throttledNanos += throttled;
                return pending.size() >= EARLY;
            }
        }
        return add(new Key(action, code), n, cpu, throttled);
    }

    private synchronized boolean add(Key k, long invocations, long cpu, long throttled) {
        Sum s = pending.get(k);
        if (s == null) {
            if (pending.size() >= MAX_KEYS) {
                counters.count("usage.dropped");
                return true;
            }
            s = new Sum(k);
            pending.put(k, s);
        }
        last = s;
        s.invocations += invocations;
        s.cpuNanos += cpu;
        s.throttledNanos += throttled;
        return pending.size() >= EARLY;
    }

    synchronized int keys() { return pending.size(); }

    /** Takes up to {@code max} records (the oldest keys first). */
    synchronized List<Protocol.UsageRecord> take(int max) {
        List<Protocol.UsageRecord> out = new ArrayList<>(Math.min(max, pending.size()));
        Iterator<Map.Entry<Key, Sum>> it = pending.entrySet().iterator();
        while (out.size() < max && it.hasNext()) {
            Map.Entry<Key, Sum> e = it.next();
            Sum s = e.getValue();
            long n = Math.min(s.invocations, MAX_U32); // a record's count is a u32: the rest stays
            out.add(new Protocol.UsageRecord(e.getKey().action(), e.getKey().outcome(), n,
                    n == s.invocations ? s.cpuNanos : 0, n == s.invocations ? s.throttledNanos : 0));
            if (n == s.invocations) {
                it.remove();
                s.taken = true;
            }
            else s.invocations -= n;
        }
        return out;
    }

    /** Puts records back that could not be sent. */
    void putBack(List<Protocol.UsageRecord> rs) {
        for (Protocol.UsageRecord r : rs) add(new Key(r.action(), r.outcome()), r.invocations(), r.cpuNanos(), r.throttledNanos());
    }
}
