package dev.cpuslot.runtime;

import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.*;
import dev.cpuslot.runtime.base.Metrics;

/**
 * The exposition page (prometheus-metrics-core's registry and text format): histograms cumulative,
 * the acquire latency's buckets, the deprecated acquire counter beside the histogram of the same
 * base name, every family typed, hostile label values escaped, the JVM's metrics beside the runtime's.
 */
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
        var h = m.histogram("cpuslot_slot_acquire_seconds", Metrics.NONE, Metrics.ACQUIRE_BUCKETS);
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
        assertEquals(4, value(p, "cpuslot_slot_acquire_seconds_bucket{le=\"1.0\"}"));
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
        assertTrue(p.contains("cpuslot_invocations_total{function=\"f\"} 1.0\n"), p);
        // every line a comment or a sample (one page a scraper parses)
        for (String l : p.lines().toList())
            assertTrue(l.startsWith("#") || SAMPLE.matcher(l).matches(), "not a sample line: " + l);
        assertEquals(1, p.lines().filter(l -> l.startsWith("# TYPE jvm_threads_current ")).count(), "one family, once");
    }

    /** Every family carries its # TYPE, described or not, and appears once: one page Prometheus parses. */
    @Test
    void everyFamilyTypedOnce() {
        Metrics m = new Metrics();
        m.describe("cpuslot_bad_requests_total", "Requests refused before running anything.");
        m.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "malformed_json"));
        m.inc("cpuslot_annotation_lookups_total"); // never described
        m.gauge("cpuslot_invocations_in_flight").inc();
        m.histogram("cpuslot_slot_acquire_seconds", Metrics.NONE, Metrics.ACQUIRE_BUCKETS).observe(0.001);
        m.counter(Metrics.ACQUIRE_SECONDS_TOTAL, Metrics.NONE).inc(0.001);
        m.gaugeFunction("cpuslot_sandboxes", s -> s.add(2, "f", "busy"), "function", "state");
        m.counterFunction("cpuslot_slot_client_events_total", s -> s.add(7, "acquire.calls"), "event");
        m.sandboxCreated("f\"\n");
        m.sandboxCreated("f\"\n");
        String p = m.scrape();
        assertEquals(2, value(p, "cpuslot_sandboxes_created_total{function=\"f\\\"\\n\"}"));
        assertEquals(1, value(p, "cpuslot_bad_requests_total{reason=\"malformed_json\"}"));
        assertEquals(1, value(p, "cpuslot_annotation_lookups_total"));
        assertEquals(1, value(p, "cpuslot_invocations_in_flight"));
        assertEquals(0.001, value(p, "cpuslot_slot_acquire_seconds_sum"));
        assertEquals(0.001, value(p, "cpuslot_slot_acquire_seconds_total"));
        assertEquals(2, value(p, "cpuslot_sandboxes{function=\"f\",state=\"busy\"}"));
        assertEquals(7, value(p, "cpuslot_slot_client_events_total{event=\"acquire.calls\"}"));
        assertTrue(p.contains("# HELP cpuslot_bad_requests_total Requests refused before running anything.\n"), p);
        for (String family : List.of("cpuslot_bad_requests_total counter", "cpuslot_annotation_lookups_total counter",
                "cpuslot_invocations_in_flight gauge", "cpuslot_slot_acquire_seconds histogram", "cpuslot_slot_acquire_seconds_total counter",
                "cpuslot_sandboxes gauge", "cpuslot_slot_client_events_total counter", "cpuslot_sandboxes_created_total counter"))
            assertEquals(1, p.lines().filter(l -> l.equals("# TYPE " + family)).count(), family + ":\n" + p);
        assertFalse(p.lines().anyMatch(l -> l.matches("[a-z_]+_created(\\{.*)? .*")), "no _created series:\n" + p);
    }

    /** A function's name is a label value: quotes, backslashes and line breaks stay inside the value, no series is forged. */
    @Test
    void hostileLabelValuesAreEscaped() {
        Metrics m = new Metrics();
        m.inc("cpuslot_invocations_total", Metrics.labels("function", "a\"} 1\ncpuslot_forged_total 9\n#\\", "status", null));
        String p = m.scrape();
        assertFalse(p.contains("\ncpuslot_forged_total"), p);
        assertEquals(1, value(p, "cpuslot_invocations_total{function=\"a\\\"} 1\\ncpuslot_forged_total 9\\n#\\\\\",status=\"\"}"));
        for (String l : p.lines().toList())
            assertTrue(l.startsWith("#") || SAMPLE.matcher(l).matches(), "not a sample line: " + l);
    }

    /** A counter that went back (a negative amount) adds nothing and does not fail the invocation that reports it. */
    @Test
    void negativeAmountsAddNothing() {
        Metrics m = new Metrics();
        m.add("cpuslot_slot_cpu_seconds_total", Metrics.labels("function", "f"), 0.5);
        m.add("cpuslot_slot_cpu_seconds_total", Metrics.labels("function", "f"), -0.25);
        assertEquals(0.5, value(m.scrape(), "cpuslot_slot_cpu_seconds_total{function=\"f\"}"));
    }

    /**
     * Two pools of one name (a registered function named as the action) give one series, not a
     * page that fails: the scrape serves every tenant's metrics, so one tenant's name cannot take it down.
     */
    @Test
    void aCallbackFamilyWithTheSameSeriesTwiceStillScrapes() {
        Metrics m = new Metrics();
        m.gaugeFunction("cpuslot_sandboxes", s -> {
            s.add(1, "f", "busy");
            s.add(2, "f", "busy");
        }, "function", "state");
        m.counterFunction("cpuslot_slot_client_events_total", s -> {
            s.add(3, "acquire.calls");
            s.add(4, "acquire.calls");
        }, "event");
        String p = m.scrape();
        assertEquals(2, value(p, "cpuslot_sandboxes{function=\"f\",state=\"busy\"}"));
        assertEquals(4, value(p, "cpuslot_slot_client_events_total{event=\"acquire.calls\"}"));
        assertEquals(1, p.lines().filter(l -> l.startsWith("cpuslot_sandboxes{")).count(), p);
    }
}
