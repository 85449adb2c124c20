package dev.cpuslot.runtime.base;

import io.prometheus.metrics.core.datapoints.CounterDataPoint;
import io.prometheus.metrics.core.datapoints.DistributionDataPoint;
import io.prometheus.metrics.core.datapoints.GaugeDataPoint;
import io.prometheus.metrics.core.metrics.Counter;
import io.prometheus.metrics.core.metrics.CounterWithCallback;
import io.prometheus.metrics.core.metrics.Gauge;
import io.prometheus.metrics.core.metrics.GaugeWithCallback;
import io.prometheus.metrics.core.metrics.Histogram;
import io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter;
import io.prometheus.metrics.instrumentation.jvm.JvmMetrics;
import io.prometheus.metrics.model.registry.PrometheusRegistry;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.Consumer;

/**
 * The runtime's metrics: a prometheus-metrics-core registry of the {@code cpuslot_*} families,
 * each made at its first use with the label names of that use (counters, gauges, classic
 * histograms, no exemplars: the cheapest recording it offers), and exposed in the Prometheus
 * text format 0.0.4 with the JVM's own metrics (prometheus-metrics-instrumentation-jvm) on the
 * same page. Function code never reaches it: a Java function's class loader sees the JDK and the
 * guard only ({@link JavaFunction}).
 */
public final class Metrics {
    public static final double[] LATENCY_BUCKETS = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    /** A slot acquisition: microseconds with local leasing, a round trip to the agent, at most the budget (50 ms) and the first one's (1 s). */
    public static final double[] ACQUIRE_BUCKETS = {0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
            0.01, 0.025, 0.05, 0.1, 0.25, 1};
    /**
     * Deprecated for one release, the same value as the histogram's {@code _sum}. A registry holds
     * one family per name without its {@code _total}, which is the histogram's: this counter has a
     * registry of its own, written after the other.
     */
    public static final String ACQUIRE_SECONDS_TOTAL = "cpuslot_slot_acquire_seconds_total";

    /**
     * prometheus-metrics-core refuses a counter whose name without {@code _total} ends in
     * {@code _created} (OpenMetrics' created-timestamp suffix), so this one family, on the
     * dashboards since before the move, is written by the runtime itself as it was: per function.
     */
    static final String SANDBOXES_CREATED = "cpuslot_sandboxes_created_total";

    /** A series' labels: the label names and their values, index by index ({@link #labels} makes them from pairs). */
    public record Labels(String[] names, String[] values) {}

    public static final Labels NONE = new Labels(new String[0], new String[0]);

    /** A callback family's samples, made at scrape time. */
    public interface Samples {
        void add(double value, String... labelValues);
    }

    private final PrometheusRegistry registry = new PrometheusRegistry(), deprecated = new PrometheusRegistry();
    private final Map<String, String> help = new ConcurrentHashMap<>();
    private final Map<String, Counter> counters = new ConcurrentHashMap<>();
    private final Map<String, Gauge> gauges = new ConcurrentHashMap<>();
    private final Map<String, Histogram> histograms = new ConcurrentHashMap<>();
    private final Map<String, LongAdder> sandboxesCreated = new ConcurrentHashMap<>(); // by function

    /** The help text of a family; before its first use (the family keeps the text it was made with). */
    public void describe(String name, String text) { help.put(name, text); }

    /** Labels from names and values in pairs; a null value is empty. */
    public static Labels labels(String... kv) {
        String[] n = new String[kv.length / 2], v = new String[kv.length / 2];
        for (int i = 0; i < n.length; i++) {
            n[i] = kv[2 * i];
            v[i] = kv[2 * i + 1] == null ? "" : kv[2 * i + 1];
        }
        return new Labels(n, v);
    }

    public void inc(String name) { counter(name, NONE).inc(); }

    public void inc(String name, Labels labels) { counter(name, labels).inc(); }

    /** Adds to a counter; a negative amount (a counter that went back) adds nothing. */
    public void add(String name, Labels labels, double v) {
        if (v > 0) counter(name, labels).inc(v);
    }

    /** The counter's series itself, for a caller that adds on every invocation (no lookup then); it refuses a negative amount. */
    public CounterDataPoint counter(String name, Labels labels) {
        return counters.computeIfAbsent(name, n -> Counter.builder().name(n).help(help.get(n)).labelNames(labels.names)
                .withoutExemplars().register(n.equals(ACQUIRE_SECONDS_TOTAL) ? deprecated : registry)).labelValues(labels.values);
    }

    /** Counts a sandbox made for this function ({@link #SANDBOXES_CREATED}). */
    public void sandboxCreated(String function) {
        sandboxesCreated.computeIfAbsent(function == null ? "" : function, f -> new LongAdder()).increment();
    }

    public GaugeDataPoint gauge(String name) {
        return gauges.computeIfAbsent(name, n -> Gauge.builder().name(n).help(help.get(n)).withoutExemplars().register(registry));
    }

    /** A gauge family whose samples are made at scrape time. */
    public void gaugeFunction(String name, Consumer<Samples> f, String... labelNames) {
        GaugeWithCallback.builder().name(name).help(help.get(name)).labelNames(labelNames)
                .callback(cb -> once(f).forEach((values, v) -> cb.call(v, values.toArray(String[]::new)))).register(registry);
    }

    /** A counter family whose samples are made at scrape time (counts kept elsewhere). */
    public void counterFunction(String name, Consumer<Samples> f, String... labelNames) {
        CounterWithCallback.builder().name(name).help(help.get(name)).labelNames(labelNames)
                .callback(cb -> once(f).forEach((values, v) -> cb.call(v, values.toArray(String[]::new)))).register(registry);
    }

    /**
     * A callback's samples, one per series, the last one given winning (as a map of them did): the
     * registry refuses a series twice, and the page, every tenant's, would fail (a function
     * registered under the action's name gives two pools of one name).
     */
    private static Map<java.util.List<String>, Double> once(Consumer<Samples> f) {
        Map<java.util.List<String>, Double> m = new java.util.LinkedHashMap<>();
        f.accept((v, values) -> m.put(java.util.List.of(values), v));
        return m;
    }

    public DistributionDataPoint histogram(String name, Labels labels) { return histogram(name, labels, LATENCY_BUCKETS); }

    /** A histogram with these bucket bounds (ascending; +Inf is added); the first call's bounds stay. */
    public DistributionDataPoint histogram(String name, Labels labels, double[] bounds) {
        return histograms.computeIfAbsent(name, n -> Histogram.builder().name(n).help(help.get(n)).labelNames(labels.names)
                .classicUpperBounds(bounds).classicOnly().withoutExemplars().register(registry)).labelValues(labels.values);
    }

    /** The exposition text: the runtime's families, the deprecated counter, the JVM's. */
    public String scrape() {
        ByteArrayOutputStream out = new ByteArrayOutputStream(32768);
        PrometheusTextFormatWriter w = PrometheusTextFormatWriter.create();
        try {
            w.write(out, registry.scrape());
            w.write(out, deprecated.scrape());
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e); // a ByteArrayOutputStream does not throw
        }
        StringBuilder b = new StringBuilder(out.toString(StandardCharsets.UTF_8));
        if (!sandboxesCreated.isEmpty()) {
            String h = help.get(SANDBOXES_CREATED);
            if (h != null) b.append("# HELP ").append(SANDBOXES_CREATED).append(' ').append(h).append('\n');
            b.append("# TYPE ").append(SANDBOXES_CREATED).append(" counter\n");
            new TreeMap<>(sandboxesCreated).forEach((f, n) -> b.append(SANDBOXES_CREATED).append("{function=\"")
                    .append(f.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")).append("\"} ")
                    .append((double) n.sum()).append('\n'));
        }
        return b.append(Jvm.scrape(w)).toString();
    }

    /** The JVM's metrics: one registry per process (they describe the process, and register MXBean listeners once). */
    private static final class Jvm {
        private static final PrometheusRegistry REGISTRY = new PrometheusRegistry();
        static {
            JvmMetrics.builder().register(REGISTRY);
        }

        static String scrape(PrometheusTextFormatWriter w) {
            ByteArrayOutputStream out = new ByteArrayOutputStream(16384);
            try {
                w.write(out, REGISTRY.scrape());
            } catch (IOException | RuntimeException e) {
                return "# JVM metrics failed: " + String.valueOf(e).replace('\n', ' ') + "\n";
            }
            return out.toString(StandardCharsets.UTF_8);
        }
    }
}
