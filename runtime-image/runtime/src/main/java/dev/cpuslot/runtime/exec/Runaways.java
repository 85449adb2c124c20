package dev.cpuslot.runtime.exec;

import dev.cpuslot.slot.ReleaseOutcome;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;

import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Log;

/**
 * Worker threads still running an activation after its deadline and cancellation (Java code that
 * ignores interrupts: the JVM cannot stop a thread). Each one is confined: a jail thread takes a
 * lease with a tiny quota (CPUSLOT_RUNAWAY_QUOTA, default 10m), sits in that slot itself, and moves
 * the runaway thread into it too; it keeps the lease, outliving the activation's, until the
 * runaway thread returns. Counted in {@code cpuslot_runaway_*}. Without the agent (no slot to
 * be had) the thread is counted as unconfined and runs on at the least priority (nice 19, SCHED_IDLE).
 */
public final class Runaways {
    private final SlotClient slots;
    private final long quotaMilli, graceMs;
    private final Metrics metrics;
    private final io.prometheus.metrics.core.datapoints.GaugeDataPoint current;
    private static final AtomicLong IDS = new AtomicLong();

    public Runaways(SlotClient slots, long quotaMilli, long graceMs, Metrics metrics) {
        this.slots = slots;
        this.quotaMilli = quotaMilli;
        this.graceMs = graceMs;
        this.metrics = metrics;
        metrics.describe("cpuslot_runaway_threads", "Worker threads still running an activation past its deadline, and threads of ended activations stuck in JDK code, confined or not.");
        metrics.describe("cpuslot_runaway_confined_total", "Runaway worker threads moved into a tiny slot.");
        metrics.describe("cpuslot_runaway_unconfined_total", "Runaway worker threads that could not be confined, by reason.");
        metrics.describe("cpuslot_runaway_idled_total", "Runaway threads that could not be confined, given the least priority instead (nice 19, SCHED_IDLE).");
        current = metrics.gauge("cpuslot_runaway_threads");
    }

    /**
     * Watches a worker whose activation was cancelled at its deadline.
     * @param tid          the worker's kernel thread id (0 when unknown)
     * @param stillRunning true while the worker is still inside that activation
     */
    void watch(String function, Thread worker, int tid, BooleanSupplier stillRunning) {
        dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("runaway-jail-" + IDS.incrementAndGet(), () -> {
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

    /**
     * A thread an ended activation started, still running in JDK code that ignores interrupts
     * (the guard's stray: Activations): it would run on in the slot its activation had, charged to the next
     * invocation there. Confined as a runaway worker is, found by its kernel thread id.
     */
    public void stray(Thread t, String worker) {
        int dash = worker.lastIndexOf('-');
        String function = worker.startsWith("fn-") && dash > 3 ? worker.substring(3, dash) : worker;
        String name = t.getName().replaceAll("\\p{Cntrl}", "?");
        String what = "thread \"" + (name.length() > 64 ? name.substring(0, 64) + "..." : name) + "\" of an ended activation of " + function;
        dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("runaway-jail-" + IDS.incrementAndGet(), () -> {
            if (!t.isAlive()) return;
            current.inc();
            try {
                confine(function, t, tidOf(t), t::isAlive, what, "runs on in JDK code that ignores interrupts");
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                current.dec();
            }
        });
    }

    /** A function's load (/init, /register) still running after its deadline's cancel: confined until it returns. */
    void load(Thread t, String function) {
        dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("runaway-jail-" + IDS.incrementAndGet(), () -> {
            if (!t.isAlive()) return;
            current.inc();
            try {
                confine(function, t, tidOf(t), t::isAlive, "the load of " + function, "ran past its deadline");
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                current.dec();
            }
        });
    }

    /**
     * A live thread's kernel thread id, from the JVM's thread dump (the one place the JDK names it:
     * {@code "name" #javaId ... nid=tid}); 0 when it cannot be told for sure. The name is the
     * function's: one with a quote or a line break could forge a line, so it is not looked up, and
     * the id found must be a thread of this process whose kernel name is the thread's.
     */
    static int tidOf(Thread t) {
        String name = t.getName();
        if (name.indexOf('"') >= 0 || name.chars().anyMatch(Character::isISOControl)) return 0;
        try {
            Object dump = java.lang.management.ManagementFactory.getPlatformMBeanServer().invoke(
                    new javax.management.ObjectName("com.sun.management:type=DiagnosticCommand"), "threadPrint",
                    new Object[]{new String[0]}, new String[]{String[].class.getName()});
            var m = java.util.regex.Pattern.compile("^\"" + java.util.regex.Pattern.quote(name) + "\" #" + t.threadId()
                    + " .*? nid=(0x[0-9a-fA-F]+|[0-9]+) ", java.util.regex.Pattern.MULTILINE).matcher(String.valueOf(dump));
            if (!m.find()) return 0;
            int tid = (int) (long) Long.decode(m.group(1));
            byte[] b = name.getBytes(java.nio.charset.StandardCharsets.UTF_8);
            String comm = java.nio.file.Files.readString(java.nio.file.Path.of("/proc/self/task/" + tid + "/comm")).strip();
            String expect = new String(b, 0, Math.min(15, b.length), java.nio.charset.StandardCharsets.UTF_8).strip();
            return comm.equals(expect) ? tid : 0;
        } catch (Exception | LinkageError e) {
            return 0;
        }
    }

    /**
     * An unconfined thread runs on where it is: it gets the least CPU the runtime can give it
     * without privilege (nice 19, SCHED_IDLE), so that whatever shares its slot runs first. What
     * the log line adds.
     */
    private String leastCpu(String function, int tid) {
        if (tid <= 0 || !dev.cpuslot.slot.Native.available()) return "; its priority could not be lowered (no tid)";
        try {
            dev.cpuslot.slot.Native.leastCpu(tid);
            metrics.inc("cpuslot_runaway_idled_total", Metrics.labels("function", function));
            return "; it runs at the least priority (nice 19, SCHED_IDLE)";
        } catch (dev.cpuslot.slot.Native.NativeException e) {
            return "; its priority could not be lowered (" + e.getMessage() + ")";
        }
    }

    private void confine(String function, Thread worker, int tid, BooleanSupplier stillRunning) throws InterruptedException {
        confine(function, worker, tid, stillRunning, "a worker of " + function, "ignored its deadline");
    }

    private void confine(String function, Thread worker, int tid, BooleanSupplier stillRunning, String what, String did)
            throws InterruptedException {
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
                if (err != null) Log.warn("could not confine " + what + " (tid " + tid + "): " + err);
            }
        }
        if (why == null) {
            dev.cpuslot.runtime.guard.Activations.moved(worker); // its activation's slot may go to others now
            metrics.inc("cpuslot_runaway_confined_total", Metrics.labels("function", function));
            Log.warn(what + " (tid " + tid + ") " + did + "; confined to a " + quotaMilli + "m slot until it returns");
        } else {
            metrics.inc("cpuslot_runaway_unconfined_total", Metrics.labels("function", function, "reason", why));
            Log.warn(what + " (tid " + tid + ") " + did + " and could not be confined (" + why + ")" + leastCpu(function, tid));
        }
        try {
            while (worker.isAlive() && stillRunning.getAsBoolean()) Thread.sleep(1000);
        } finally {
            if (jail != null) jail.release(ReleaseOutcome.OK);
        }
    }
}
