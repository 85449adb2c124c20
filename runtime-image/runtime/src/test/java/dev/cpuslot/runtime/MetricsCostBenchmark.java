package dev.cpuslot.runtime;

import org.junit.jupiter.api.Test;

import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.DoubleAdder;

/**
 * What recording one slot acquisition costs on the invocation's path, side by side: the runtime's
 * registry (a {@link Metrics.Histogram} and the deprecated {@code _total} counter) against
 * prometheus-metrics-core 1.x's {@code Histogram} and {@code Counter} with the same buckets
 * (classic only, no exemplars: the cheapest it offers). Rounds alternate, each with a fresh pair
 * of metrics; the threads record at the same time; the cost is the recording threads' CPU time
 * per record (the machine's load does not count, contention between the threads does). Not a test: runs only when named, e.g.
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

    static {
        ThreadLocalRandom r = ThreadLocalRandom.current();
        for (int i = 0; i < VALUES.length; i++) VALUES[i] = r.nextInt(10) < 8 ? 1e-6 * (2 + r.nextInt(8)) : 1e-4 * (1 + r.nextInt(20));
    }

    interface Recorder { void record(double v); }

    static Recorder ours() {
        Metrics m = new Metrics();
        Metrics.Histogram h = m.histogram("cpuslot_slot_acquire_seconds", "", Metrics.ACQUIRE_BUCKETS);
        DoubleAdder c = m.counter("cpuslot_slot_acquire_seconds_total", "");
        return v -> {
            c.add(v);
            h.observe(v);
        };
    }

    static Recorder prometheusCore() {
        var h = io.prometheus.metrics.core.metrics.Histogram.builder().name("cpuslot_slot_acquire_seconds")
                .classicUpperBounds(Metrics.ACQUIRE_BUCKETS).classicOnly().withoutExemplars().build();
        var c = io.prometheus.metrics.core.metrics.Counter.builder().name("cpuslot_slot_acquire_seconds_total").withoutExemplars().build();
        return v -> {
            c.inc(v);
            h.observe(v);
        };
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
                for (int i = 0; i < OPS; i++) rec.record(VALUES[(i + off) & (VALUES.length - 1)]);
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
        run(ours()); // warm both up
        run(prometheusCore());
        double[] a = new double[ROUNDS], b = new double[ROUNDS];
        for (int r = 0; r < ROUNDS; r++) {
            a[r] = run(ours());
            b[r] = run(prometheusCore());
            System.out.printf("[metricscost] round %d threads=%d ours %.1f ns prometheus-core %.1f ns ratio %.2f%n", r, THREADS, a[r], b[r], b[r] / a[r]);
        }
        Arrays.sort(a);
        Arrays.sort(b);
        System.out.printf("[metricscost] median threads=%d ours %.1f ns prometheus-core %.1f ns ratio prometheus-core/ours %.2f%n",
                THREADS, a[ROUNDS / 2], b[ROUNDS / 2], b[ROUNDS / 2] / a[ROUNDS / 2]);
    }
}
