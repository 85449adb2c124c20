package dev.cpuslot.slot;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;

/** The client's event counters (name -> count), shared by its parts. */
final class Counters {
    private final Map<String, LongAdder> counters = new ConcurrentHashMap<>();

    void count(String name) { counters.computeIfAbsent(name, k -> new LongAdder()).increment(); }

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
