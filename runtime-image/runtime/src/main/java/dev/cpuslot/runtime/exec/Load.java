package dev.cpuslot.runtime.exec;

import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.guard.Activations;
import dev.cpuslot.slot.ReleaseOutcome;
import dev.cpuslot.slot.SlotLease;

import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A function's load (/init, /register): its code's top level, a Java class's static
 * initialisers. That is the function's code too, so it gets a deadline as an invocation does: it
 * runs on a thread of its own, and at the deadline the language stops it (a context closed, a
 * Java activation cancelled: {@link #onCancel}), the request is answered, and a thread that still
 * runs after the grace is confined as a runaway. Before, code that never returned held its
 * request's front thread and a core for as long as the runtime lived. As its code begins, the
 * loading thread takes a slot at the function's quota ({@link Slot}), as its calls do: a load
 * gets no more CPU than its function (before, it ran in the runtime's container, in no slot).
 */
public final class Load {
    private static final ThreadLocal<Load> CURRENT = new ThreadLocal<>();
    private static final AtomicLong IDS = new AtomicLong();

    private final Cancels cancels = new Cancels("stopping a load");
    /** When the function's code began (System.nanoTime): the deadline counts from there. */
    private final CompletableFuture<Long> began = new CompletableFuture<>();
    private final Slot slot;
    /** The loading thread's lease, taken as the function's code begins; null: none. */
    private volatile SlotLease lease;
    /** Whether the lease was ended: by the loading thread as it returns, or held past the deadline. */
    private final java.util.concurrent.atomic.AtomicBoolean ended = new java.util.concurrent.atomic.AtomicBoolean();

    private Load(Slot slot) { this.slot = slot; }

    /**
     * The function's slot for its load: a lease at its quota with the calling thread placed in
     * it, or null to run in none (no agent, no quota). May throw when the runtime fails closed
     * and no slot is to be had: the load then fails with that error, as a call would.
     */
    public interface Slot {
        SlotLease take();

        /** What the load used in its slot, once final (its function's CPU, as a call's). */
        void used(dev.cpuslot.slot.Usage usage);
    }

    /** The load past its deadline: the request's answer. */
    public static final class Timeout extends IllegalArgumentException {
        Timeout(String msg) { super(msg); }
    }

    /**
     * Called by a language on the loading thread as the function's code begins (the runtime's
     * own part, a context made, a jar read, is not the function's time nor in its slot): how to
     * stop it at the deadline, from another thread. The thread takes the function's slot here.
     * Outside a load, nothing; after the deadline, at once.
     */
    public static void onCancel(Runnable cancel) {
        Load l = CURRENT.get();
        if (l == null) {
            Making m = MAKING.get();
            if (m != null) m.cancels.add(cancel);
            return;
        }
        if (l.lease == null && l.slot != null) l.lease = l.slot.take();
        l.began.complete(System.nanoTime());
        l.cancels.add(cancel);
    }

    /**
     * {@code load}'s value, made on a thread of its own, its function's code within
     * {@code timeoutMs} of its beginning ({@link #onCancel}); past it a {@link Timeout} (a value
     * made just after is closed). What the load throws is thrown here.
     */
    public static <T extends AutoCloseable> T within(String function, long timeoutMs, long graceMs, Runaways runaways,
                                                     Slot slot, Callable<T> load) throws Exception {
        Load l = new Load(slot);
        var made = new CompletableFuture<T>();
        Thread t = dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("fn-load-" + IDS.incrementAndGet(), () -> {
            CURRENT.set(l);
            T value = null;
            Throwable error = null;
            try {
                value = load.call();
            } catch (Throwable e) {
                error = e;
            } finally {
                CURRENT.remove();
                // the slot given back before the answer: the function's first call may have it
                SlotLease held = l.lease;
                if (held != null && l.ended.compareAndSet(false, true))
                    l.slot.used(held.releaseLast(l.cancels.cancelled ? ReleaseOutcome.TIMEOUT : error != null ? ReleaseOutcome.FAILED : ReleaseOutcome.OK));
            }
            if (error != null) made.completeExceptionally(error);
            else made.complete(value);
        });
        try {
            CompletableFuture.anyOf(made, l.began).get();
            long now = System.nanoTime(), ran = (now - l.began.getNow(now)) / 1_000_000;
            return made.get(Math.max(0, timeoutMs - ran), TimeUnit.MILLISECONDS);
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            if (c instanceof Exception x) throw x;
            if (c instanceof Error x) throw x;
            throw e;
        } catch (InterruptedException e) { // the runtime stops
            l.cancel(t, made);
            throw e;
        } catch (TimeoutException e) {
            l.cancel(t, made);
            stopped(function, t, graceMs, runaways);
            throw new Timeout("the function did not load within " + timeoutMs + " ms: its code's top level (a Java class's "
                    + "static initialiser) ran past the load's deadline and was stopped");
        }
    }

    private <T extends AutoCloseable> void cancel(Thread t, CompletableFuture<T> made) {
        made.thenAccept(f -> { // made just after: no one will use it
            try {
                f.close();
            } catch (Exception ignored) {
            }
        });
        cancels.cancelled = true; // before the slot is looked at: the loading thread's own release then says TIMEOUT
        // the slot stays the load's while its thread runs on in it (until it stops, or is confined
        // as a runaway: moved out), given to no call meanwhile
        SlotLease held = lease;
        if (held != null && held.active() && ended.compareAndSet(false, true))
            HeldSlot.hold(held, ReleaseOutcome.TIMEOUT, (lease, usage, until, nanos) -> slot.used(usage), () -> t.isAlive() && !Activations.movedOut(t));
        cancels.cancel();
        t.interrupt();
    }

    private static final ThreadLocal<Making> MAKING = new ThreadLocal<>();

    /**
     * A sandbox made for a call (a worker's new sandbox, its code's top level run again in the
     * call's slot): how to stop the function's code in it at the call's deadline, as at its load.
     * The worker makes the sandbox within {@link #making}; at the deadline its caller calls
     * {@link #cancel}. Before, only an interrupt reached it, which guest code does not see.
     */
    public static final class Making {
        private final Cancels cancels = new Cancels("stopping a sandbox being made");

        /** Stops the function's code in the sandbox being made, now and as soon as it begins. */
        public void cancel() { cancels.cancel(); }
    }

    /** How to stop a function's code (a load's, a sandbox's being made), run at its deadline. */
    private static final class Cancels {
        private final List<Runnable> list = new CopyOnWriteArrayList<>();
        private final String what;
        volatile boolean cancelled;

        Cancels(String what) { this.what = what; }

        /** Runs every cancel, and from now on each one added as it is added. */
        void cancel() {
            cancelled = true;
            for (Runnable r : list) run(r);
        }

        void add(Runnable r) {
            list.add(r);
            if (cancelled) run(r); // at most twice with cancel() at once: closing twice is harmless
        }

        private void run(Runnable r) {
            try {
                r.run();
            } catch (RuntimeException e) {
                Log.warn(what + ": " + e);
            }
        }
    }

    /** Makes a sandbox on this thread, its code stopped by {@code m}'s cancel. */
    public static <T> T making(Making m, Callable<T> make) throws Exception {
        MAKING.set(m);
        try {
            return make.call();
        } finally {
            MAKING.remove();
        }
    }

    /** A loading thread still running {@code graceMs} after its cancel is confined as a runaway. */
    private static void stopped(String function, Thread t, long graceMs, Runaways runaways) {
        try {
            t.join(Math.max(1, graceMs));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (t.isAlive()) runaways.load(t, function);
    }
}
