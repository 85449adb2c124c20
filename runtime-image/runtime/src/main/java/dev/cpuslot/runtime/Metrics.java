package dev.cpuslot.runtime;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.DoubleAdder;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.Supplier;

/**
 * A small Prometheus text-format (0.0.4) registry: counters, gauges, histograms. No reflection.
 * The JVM's own metrics (memory, GC, threads, classes, process) come from
 * prometheus-metrics-instrumentation-jvm's registry and are appended to the same page.
 */
public final class Metrics {
    static final double[] LATENCY_BUCKETS = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    /** A slot acquisition: microseconds with local leasing, a round trip to the agent, at most the budget (50 ms) and the first one's (1 s). */
    static final double[] ACQUIRE_BUCKETS = {0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
            0.01, 0.025, 0.05, 0.1, 0.25, 1};

    private record Key(String name, String labels) implements Comparable<Key> {
        public int compareTo(Key o) {
            int c = name.compareTo(o.name);
            return c != 0 ? c : labels.compareTo(o.labels);
        }
    }

    private final Map<String, String[]> help = new ConcurrentHashMap<>(); // name -> {type, help}
    private final Map<Key, DoubleAdder> counters = new ConcurrentHashMap<>();
    private final Map<Key, AtomicLong> gauges = new ConcurrentHashMap<>();
    private final Map<Key, Supplier<Map<String, Long>>> gaugeFns = new ConcurrentHashMap<>();
    private final Map<Key, Histogram> histograms = new ConcurrentHashMap<>();

    public static final class Histogram {
        final double[] bounds;
        /** Observations per bucket, not cumulative (one increment per observation; the scrape adds them up). */
        final LongAdder[] buckets;
        final DoubleAdder sum = new DoubleAdder();
        final LongAdder count = new LongAdder();
        Histogram(double[] bounds) {
            this.bounds = bounds;
            buckets = new LongAdder[bounds.length];
            for (int i = 0; i < bounds.length; i++) buckets[i] = new LongAdder();
        }
        public void observe(double v) {
            for (int i = 0; i < bounds.length; i++) {
                if (v <= bounds[i]) {
                    buckets[i].increment();
                    break;
                }
            }
            sum.add(v);
            count.increment();
        }
    }

    public void describe(String name, String type, String text) { help.put(name, new String[]{type, text}); }

    public static String labels(String... kv) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i + 1 < kv.length; i += 2) {
            if (!b.isEmpty()) b.append(',');
            b.append(kv[i]).append("=\"").append(escape(kv[i + 1])).append('"');
        }
        return b.toString();
    }

    private static String escape(String v) {
        if (v == null) return "";
        return v.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n");
    }

    public void inc(String name, String labels) { add(name, labels, 1); }

    public void add(String name, String labels, double v) {
        counter(name, labels).add(v);
    }

    /** The counter itself, for a caller that adds on every invocation (no map lookup then). */
    public DoubleAdder counter(String name, String labels) {
        return counters.computeIfAbsent(new Key(name, labels), k -> new DoubleAdder());
    }

    public AtomicLong gauge(String name, String labels) {
        return gauges.computeIfAbsent(new Key(name, labels), k -> new AtomicLong());
    }

    /** A family of gauges computed at scrape time: supplier returns labels -> value. */
    public void gaugeFunction(String name, Supplier<Map<String, Long>> f) { gaugeFns.put(new Key(name, ""), f); }

    public Histogram histogram(String name, String labels) { return histogram(name, labels, LATENCY_BUCKETS); }

    /** A histogram with these bucket bounds (ascending; +Inf is added); the first call's bounds stay. */
    public Histogram histogram(String name, String labels, double[] bounds) {
        return histograms.computeIfAbsent(new Key(name, labels), k -> new Histogram(bounds));
    }

    public double counterValue(String name, String labels) {
        DoubleAdder a = counters.get(new Key(name, labels));
        return a == null ? 0 : a.sum();
    }

    /** The exposition text. */
    public String scrape() {
        Map<String, StringBuilder> byName = new TreeMap<>();
        new TreeMap<>(counters).forEach((k, v) -> line(byName, k.name, k.labels, fmt(v.sum())));
        new TreeMap<>(gauges).forEach((k, v) -> line(byName, k.name, k.labels, Long.toString(v.get())));
        gaugeFns.forEach((k, f) -> new TreeMap<>(f.get()).forEach((l, v) -> line(byName, k.name, l, Long.toString(v))));
        new TreeMap<>(histograms).forEach((k, h) -> {
            StringBuilder b = byName.computeIfAbsent(k.name, n -> new StringBuilder());
            // count first: a scrape racing an observation never shows a bucket above +Inf
            long count = h.count.sum(), cumulative = 0;
            for (int i = 0; i < h.bounds.length; i++) {
                cumulative += h.buckets[i].sum();
                b.append(k.name).append("_bucket{").append(join(k.labels, "le=\"" + fmt(h.bounds[i]) + "\"")).append("} ")
                        .append(Math.min(cumulative, count)).append('\n');
            }
            b.append(k.name).append("_bucket{").append(join(k.labels, "le=\"+Inf\"")).append("} ").append(count).append('\n');
            b.append(k.name).append("_sum").append(braces(k.labels)).append(' ').append(fmt(h.sum.sum())).append('\n');
            b.append(k.name).append("_count").append(braces(k.labels)).append(' ').append(count).append('\n');
        });
        StringBuilder out = new StringBuilder();
        byName.forEach((name, body) -> {
            String[] h = help.get(name);
            if (h != null) {
                out.append("# HELP ").append(name).append(' ').append(h[1]).append('\n');
                out.append("# TYPE ").append(name).append(' ').append(h[0]).append('\n');
            }
            out.append(body);
        });
        out.append(Jvm.scrape());
        return out.toString();
    }

    /** The JVM's metrics: one registry per process (they describe the process, and register MXBean listeners once). */
    private static final class Jvm {
        private static final io.prometheus.metrics.model.registry.PrometheusRegistry REGISTRY =
                new io.prometheus.metrics.model.registry.PrometheusRegistry();
        static {
            io.prometheus.metrics.instrumentation.jvm.JvmMetrics.builder().register(REGISTRY);
        }

        static String scrape() {
            java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream(16384);
            try {
                io.prometheus.metrics.expositionformats.PrometheusTextFormatWriter.create().write(out, REGISTRY.scrape());
            } catch (java.io.IOException | RuntimeException e) {
                return "# JVM metrics failed: " + String.valueOf(e).replace('\n', ' ') + "\n";
            }
            return out.toString(java.nio.charset.StandardCharsets.UTF_8);
        }
    }

    private static void line(Map<String, StringBuilder> m, String name, String labels, String v) {
        m.computeIfAbsent(name, n -> new StringBuilder()).append(name).append(braces(labels)).append(' ').append(v).append('\n');
    }

    private static String braces(String labels) { return labels.isEmpty() ? "" : "{" + labels + "}"; }

    private static String join(String a, String b) { return a.isEmpty() ? b : a + "," + b; }

    private static String fmt(double d) {
        if (d == Math.rint(d) && !Double.isInfinite(d) && Math.abs(d) < 1e15) return Long.toString((long) d);
        return Double.toString(d);
    }
}
