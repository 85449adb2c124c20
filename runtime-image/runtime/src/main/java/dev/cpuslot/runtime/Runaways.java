package dev.cpuslot.runtime;

import dev.cpuslot.slot.ReleaseOutcome;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;

import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;

/**
 * Worker threads still running an activation after its deadline and cancellation (Java code that
 * ignores interrupts: the JVM cannot stop a thread). Each one is confined: a jail thread takes a
 * lease with a tiny quota (CPUSLOT_RUNAWAY_QUOTA, default 10m), sits in that slot itself, and moves
 * the runaway thread into it too; it keeps the lease, outliving the activation's, until the
 * runaway thread returns. Counted in {@code cpuslot_runaway_*}. Without the agent (no slot to
 * be had) the thread is counted as unconfined.
 */
final class Runaways {
    private final SlotClient slots;
    private final long quotaMilli, graceMs;
    private final Metrics metrics;
    private final io.prometheus.metrics.core.datapoints.GaugeDataPoint current;
    private static final AtomicLong IDS = new AtomicLong();

    Runaways(SlotClient slots, long quotaMilli, long graceMs, Metrics metrics) {
        this.slots = slots;
        this.quotaMilli = quotaMilli;
        this.graceMs = graceMs;
        this.metrics = metrics;
        metrics.describe("cpuslot_runaway_threads", "Worker threads still running an activation past its deadline.");
        metrics.describe("cpuslot_runaway_confined_total", "Runaway worker threads moved into a tiny slot.");
        metrics.describe("cpuslot_runaway_unconfined_total", "Runaway worker threads that could not be confined, by reason.");
        current = metrics.gauge("cpuslot_runaway_threads");
    }

    /**
     * Watches a worker whose activation was cancelled at its deadline.
     * @param tid          the worker's kernel thread id (0 when unknown)
     * @param stillRunning true while the worker is still inside that activation
     */
    void watch(String function, Thread worker, int tid, BooleanSupplier stillRunning) {
        Thread.ofPlatform().daemon().group(dev.cpuslot.runtime.guard.ActionGuard.RUNTIME_THREADS).inheritInheritableThreadLocals(false)
                .name("runaway-jail-" + IDS.incrementAndGet()).start(() -> {
            try {
                Thread.sleep(graceMs);
                if (!stillRunning.getAsBoolean() || !worker.isAlive()) return;
                current.inc();
                try {
                    confine(function, worker, tid, stillRunning);
                } finally {
                    current.dec();
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
    }

    private void confine(String function, Thread worker, int tid, BooleanSupplier stillRunning) throws InterruptedException {
        SlotLease jail = null;
        String why = null;
        if (slots == null) why = "slots_off";
        else if (quotaMilli <= 0) why = "disabled";
        else if (tid <= 0) why = "no_tid";
        else {
            slots.prepareThread();
            jail = slots.acquire(quotaMilli, "cpuslot-runaway/" + function, "runaway-" + tid);
            if (!jail.active()) why = "noslot_" + jail.reason();
            else {
                String err = slots.placeThread(jail, tid);
                if (err != null) why = "place_failed";
                if (err != null) Log.warn("could not confine runaway thread " + tid + " of " + function + ": " + err);
            }
        }
        if (why == null) {
            metrics.inc("cpuslot_runaway_confined_total", Metrics.labels("function", function));
            Log.warn("a worker of " + function + " (tid " + tid + ") ignored its deadline; confined to a " + quotaMilli + "m slot until it returns");
        } else {
            metrics.inc("cpuslot_runaway_unconfined_total", Metrics.labels("function", function, "reason", why));
            Log.warn("a worker of " + function + " (tid " + tid + ") ignored its deadline and could not be confined (" + why + ")");
        }
        try {
            while (worker.isAlive() && stillRunning.getAsBoolean()) Thread.sleep(1000);
        } finally {
            if (jail != null) jail.release(ReleaseOutcome.OK);
        }
    }
}
