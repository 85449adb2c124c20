package dev.cpuslot.slot;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;

/** The client's event counters (name -> count), shared by its parts. */
final class Counters {
    private final Map<String, LongAdder> counters = new ConcurrentHashMap<>();

    void count(String name) { adder(name).increment(); }

    /** The counter itself, for a caller that counts on every invocation (no map lookup then). */
    LongAdder adder(String name) { return counters.computeIfAbsent(name, k -> new LongAdder()); }

    long get(String name) {
        LongAdder a = counters.get(name);
        return a == null ? 0 : a.sum();
    }

    /** Snapshot, sorted by name. */
    Map<String, Long> snapshot() {
        Map<String, Long> m = new TreeMap<>();
        counters.forEach((k, v) -> m.put(k, v.sum()));
        return m;
    }
}
