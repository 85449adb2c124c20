package dev.cpuslot.runtime;

import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.*;

/** The exposition page: histograms cumulative, the acquire latency's buckets, the JVM's metrics beside the runtime's. */
class MetricsTest {
    private static final Pattern SAMPLE = Pattern.compile("[a-zA-Z_:][a-zA-Z0-9_:]*(\\{.*\\})? -?[0-9.eE+-]+|.* (NaN|\\+Inf|-Inf)");

    private static double value(String page, String series) {
        for (String l : page.lines().toList()) if (l.startsWith(series + " ")) return Double.parseDouble(l.substring(series.length() + 1));
        fail("no " + series + " in:\n" + page);
        return 0;
    }

    @Test
    void histogramBucketsAreCumulative() {
        Metrics m = new Metrics();
        Metrics.Histogram h = m.histogram("cpuslot_slot_acquire_seconds", "", Metrics.ACQUIRE_BUCKETS);
        h.observe(0.000003); // below the first bound
        h.observe(0.00003);  // in (25us, 50us]
        h.observe(0.00003);
        h.observe(0.04);     // in (25ms, 50ms]
        h.observe(5);        // above every bound
        String p = m.scrape();
        assertEquals(1, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"5.0E-6\"}"));
        assertEquals(1, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"2.5E-5\"}"));
        assertEquals(3, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"5.0E-5\"}"));
        assertEquals(3, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"0.025\"}"));
        assertEquals(4, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"0.05\"}"));
        assertEquals(4, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"1\"}"));
        assertEquals(5, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"+Inf\"}"));
        assertEquals(5, value(p, "cpuslot_slot_acquire_seconds_count"));
        assertEquals(5.040063, value(p, "cpuslot_slot_acquire_seconds_sum"), 1e-9);
    }

    @Test
    void jvmMetricsOnTheSamePage() {
        Metrics m = new Metrics();
        m.inc("cpuslot_invocations_total", Metrics.labels("function", "f"));
        String p = m.scrape();
        for (String name : List.of("jvm_memory_used_bytes{area=\"heap\"}", "jvm_threads_current", "jvm_gc_collection_seconds_count",
                "jvm_classes_currently_loaded", "process_cpu_seconds_total"))
            assertTrue(p.contains("\n" + name), name + " missing:\n" + p);
        assertTrue(p.contains("cpuslot_invocations_total{function=\"f\"} 1"), p);
        // every line a comment or a sample (one page a scraper parses)
        for (String l : p.lines().toList())
            assertTrue(l.startsWith("#") || SAMPLE.matcher(l).matches(), "not a sample line: " + l);
        assertEquals(1, p.lines().filter(l -> l.startsWith("# TYPE jvm_threads_current ")).count(), "one family, once");
    }
}
