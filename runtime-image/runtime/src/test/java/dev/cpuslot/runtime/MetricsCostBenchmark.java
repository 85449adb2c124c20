package dev.cpuslot.runtime;

import org.junit.jupiter.api.Test;

import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.DoubleAdder;
import java.util.concurrent.atomic.LongAdder;
import dev.cpuslot.runtime.base.Metrics;

/**
 * What recording costs on the invocation's path, side by side in one run: the runtime's registry
 * on prometheus-metrics-core ({@link Metrics}) against the hand-written registry it replaced (kept
 * here, {@link HandWritten}, as it was: adders in maps keyed by name and label text). Two
 * recordings: one slot acquisition (the latency histogram and the deprecated {@code _total}
 * counter, series held by the caller), and one invocation's labelled series looked up by name
 * and labels as the runtime does at the end of each ({@code cpuslot_invocations_total},
 * {@code cpuslot_invocation_duration_seconds}, {@code cpuslot_slot_outcomes_total}). Rounds
 * alternate, each with fresh registries; the threads record at the same time; the cost is the
 * recording threads' CPU time per record (the machine's load does not count, contention between
 * the threads does). Not a test: runs only when named, e.g.
 * <pre>
 * ./build.sh test -pl runtime -am -Dtest=MetricsCostBenchmark -Dsurefire.failIfNoSpecifiedTests=false \
 *     -Dmetricscost.threads=2 -Dmetricscost.ops=2000000 -Dmetricscost.rounds=10
 * </pre>
 */
class MetricsCostBenchmark {
    private static final int THREADS = Integer.getInteger("metricscost.threads", 2);
    private static final int OPS = Integer.getInteger("metricscost.ops", 2_000_000);
    private static final int ROUNDS = Integer.getInteger("metricscost.rounds", 10);
    /** Acquire latencies as the runtime sees them: mostly local (microseconds), some agent round trips. */
    private static final double[] VALUES = new double[4096];
    private static final String[] FUNCTIONS = {"/guest/a", "/guest/b", "/guest/c", "/guest/d"};
    private static final String[] OUTCOMES = {"affinity_hit", "affinity_hit", "affinity_hit", "cache_hit"};

    static {
        ThreadLocalRandom r = ThreadLocalRandom.current();
        for (int i = 0; i < VALUES.length; i++) VALUES[i] = r.nextInt(10) < 8 ? 1e-6 * (2 + r.nextInt(8)) : 1e-4 * (1 + r.nextInt(20));
    }

    interface Recorder { void record(int i, double v); }

    static Recorder acquireCore() {
        Metrics m = new Metrics();
        var h = m.histogram("cpuslot_slot_acquire_seconds", Metrics.NONE, Metrics.ACQUIRE_BUCKETS);
        var c = m.counter(Metrics.ACQUIRE_SECONDS_TOTAL, Metrics.NONE);
        return (i, v) -> {
            c.inc(v);
            h.observe(v);
        };
    }

    static Recorder acquireHandWritten() {
        HandWritten m = new HandWritten();
        HandWritten.Histogram h = m.histogram("cpuslot_slot_acquire_seconds", "", Metrics.ACQUIRE_BUCKETS);
        DoubleAdder c = m.counter(Metrics.ACQUIRE_SECONDS_TOTAL, "");
        return (i, v) -> {
            c.add(v);
            h.observe(v);
        };
    }

    static Recorder invocationCore() {
        Metrics m = new Metrics();
        return (i, v) -> {
            String fn = FUNCTIONS[i & 3];
            m.inc("cpuslot_invocations_total", Metrics.labels("platform", "openwhisk", "function", fn, "status", "ok"));
            m.histogram("cpuslot_invocation_duration_seconds", Metrics.labels("function", fn)).observe(v);
            m.inc("cpuslot_slot_outcomes_total", Metrics.labels("outcome", OUTCOMES[(i >> 2) & 3]));
        };
    }

    static Recorder invocationHandWritten() {
        HandWritten m = new HandWritten();
        return (i, v) -> {
            String fn = FUNCTIONS[i & 3];
            m.counter("cpuslot_invocations_total", HandWritten.labels("platform", "openwhisk", "function", fn, "status", "ok")).add(1);
            m.histogram("cpuslot_invocation_duration_seconds", HandWritten.labels("function", fn), Metrics.LATENCY_BUCKETS).observe(v);
            m.counter("cpuslot_slot_outcomes_total", HandWritten.labels("outcome", OUTCOMES[(i >> 2) & 3])).add(1);
        };
    }

    /** The recording half of the runtime's former registry, as it was. */
    static final class HandWritten {
        private record Key(String name, String labels) {}

        private final Map<Key, DoubleAdder> counters = new ConcurrentHashMap<>();
        private final Map<Key, Histogram> histograms = new ConcurrentHashMap<>();

        static final class Histogram {
            final double[] bounds;
            final LongAdder[] buckets;
            final DoubleAdder sum = new DoubleAdder();
            final LongAdder count = new LongAdder();
            Histogram(double[] bounds) {
                this.bounds = bounds;
                buckets = new LongAdder[bounds.length];
                for (int i = 0; i < bounds.length; i++) buckets[i] = new LongAdder();
            }
            void observe(double v) {
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

        static String labels(String... kv) {
            StringBuilder b = new StringBuilder();
            for (int i = 0; i + 1 < kv.length; i += 2) {
                if (!b.isEmpty()) b.append(',');
                b.append(kv[i]).append("=\"").append(kv[i + 1].replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")).append('"');
            }
            return b.toString();
        }

        DoubleAdder counter(String name, String labels) { return counters.computeIfAbsent(new Key(name, labels), k -> new DoubleAdder()); }

        Histogram histogram(String name, String labels, double[] bounds) {
            return histograms.computeIfAbsent(new Key(name, labels), k -> new Histogram(bounds));
        }
    }

    /** CPU nanoseconds per record, of the threads recording together. */
    static double run(Recorder rec) throws InterruptedException {
        CountDownLatch go = new CountDownLatch(1), done = new CountDownLatch(THREADS);
        java.util.concurrent.atomic.AtomicLong cpu = new java.util.concurrent.atomic.AtomicLong();
        java.lang.management.ThreadMXBean tm = java.lang.management.ManagementFactory.getThreadMXBean();
        for (int t = 0; t < THREADS; t++) {
            int off = t * 977;
            Thread.ofPlatform().start(() -> {
                try {
                    go.await();
                } catch (InterruptedException e) {
                    return;
                }
                long c0 = tm.getCurrentThreadCpuTime();
                for (int i = 0; i < OPS; i++) rec.record(i + off, VALUES[(i + off) & (VALUES.length - 1)]);
                cpu.addAndGet(tm.getCurrentThreadCpuTime() - c0);
                done.countDown();
            });
        }
        go.countDown();
        done.await();
        return (double) cpu.get() / ((long) OPS * THREADS);
    }

    @Test
    void acquireRecordingCost() throws Exception {
        compare("acquire", MetricsCostBenchmark::acquireHandWritten, MetricsCostBenchmark::acquireCore);
    }

    @Test
    void invocationRecordingCost() throws Exception {
        compare("invocation", MetricsCostBenchmark::invocationHandWritten, MetricsCostBenchmark::invocationCore);
    }

    private static void compare(String what, java.util.function.Supplier<Recorder> before, java.util.function.Supplier<Recorder> after) throws Exception {
        run(before.get()); // warm both up
        run(after.get());
        double[] a = new double[ROUNDS], b = new double[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            a[r] = run(before.get());
            b[r] = run(after.get());
            System.out.printf("[metricscost] %s round %d threads=%d hand-written %.1f ns prometheus-core %.1f ns ratio %.2f%n", what, r, THREADS, a[r], b[r], b[r] / a[r]);
        }
        Arrays.sort(a);
        Arrays.sort(b);
        System.out.printf("[metricscost] %s median threads=%d hand-written %.1f ns prometheus-core %.1f ns ratio prometheus-core/hand-written %.2f%n",
                what, THREADS, a[ROUNDS / 2], b[ROUNDS / 2], b[ROUNDS / 2] / a[ROUNDS / 2]);
    }
}
