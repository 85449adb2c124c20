package dev.cpuslot.runtime.guard;

import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * An activation of a Java function and the threads it starts: they inherit it, stop at its
 * deadline or its return (the poll {@link Rewriter} inserts at every backward branch), and are
 * watched until none lives; one that still runs a second after the end is a stray, handed to the
 * runtime. Its own class: the poll's flag, the running activations and the lingering groups are
 * read and written together.
 */
public final class Activations {
    private Activations() {}

    // ---- the poll at every backward branch of a function's code -------------------------------

    /** Set while any thread is to be stopped or the heap is nearly full: the poll's fast path reads only this. */
    private static volatile boolean alert;

    /**
     * One activation: every thread it starts inherits it, so all of them stop at its deadline.
     * Each thread has its own (a child of the worker's), so a thread that ended is seen to end.
     */
    static final class Activation {
        /** The worker's: cancelled there. */
        final Activation root;
        final ThreadBudget budget;
        /** Why it ended (its deadline, or its return), null while it runs: every thread it started stops at its next backward branch. */
        volatile String ended;
        /** When it ended (System.nanoTime; written before {@link #ended}). */
        volatile long endedAt;
        /** The activation constructed a thread (the worker's: only then is there anything to end). */
        volatile boolean started;
        /** The worker that runs it (the root's; null in the threads' own). */
        Thread worker;

        Activation(Activation root, ThreadBudget budget) {
            this.root = root == null ? this : root;
            this.budget = budget;
        }

        String ended() { return root.ended; }
    }

    /**
     * Every thread constructed by a thread of an activation, platform or virtual, started by the
     * function or by the JDK on its behalf (executors, builders, thread factories), inherits it:
     * the JVM calls {@link InheritableThreadLocal#childValue} in the parent as it constructs the
     * child. That is the one place where every thread a function makes passes, so it is counted
     * there. (A thread constructed without inheriting would escape both the count and the
     * deadline: the guard refuses the calls that ask for that.)
     */
    static final InheritableThreadLocal<Activation> ACTIVATION = new InheritableThreadLocal<>() {
        @Override
        protected Activation childValue(Activation parent) {
            if (parent == null || parent.budget == null) return parent;
            if (carrier()) return null;
            // a thread of an ended activation (running on in JDK code) starts none: its end
            // counted the threads it had, and a later one would be no one's
            String ended = parent.ended();
            if (ended != null) throw new Stopped(ended);
            return parent.budget.admit(parent.root);
        }
    };

    /**
     * Whether the thread being constructed is a carrier of the JDK's virtual-thread scheduler: it
     * is made by whichever thread first hands the scheduler work (a worker unparking a waiting
     * request, starting an asynchronous chain call), and serves every virtual thread after that.
     */
    private static boolean carrier() {
        return StackWalker.getInstance().walk(s -> s.anyMatch(f -> f.getClassName().equals("jdk.internal.misc.CarrierThread")));
    }

    /** Worker -> its running activation (for the caller that cancels it at the deadline). */
    private static final Map<Thread, Activation> RUNNING = new ConcurrentHashMap<>();
    /** Until then the alert stays on after a cancel: the activation's other threads poll within it. */
    private static volatile long alertUntil;
    /** How long after a deadline the alert stays on for the threads an activation started. */
    private static final long ALERT_NANOS = 30_000_000_000L;

    /**
     * An ended activation's threads still alive, found at its end in its worker's group (less
     * those of its earlier activations still lingering), its worker, and since when: an
     * activation's own, so they are watched while the worker runs its next activation.
     */
    private record Lingering(List<Thread> threads, Thread worker, long since) {}

    /** Ended activations with live threads (checked by the heap watch every 20 ms while any is here). */
    private static final Map<Activation, Lingering> LINGERING = new ConcurrentHashMap<>();
    /**
     * Whether the poll stays on for them: from an end until the next check, then while any of them
     * runs. One blocked uses no CPU and costs every function's loops nothing; when it runs again,
     * the next check (20 ms) turns the poll on.
     */
    private static volatile boolean lingerRunning;

    /**
     * Threads a function's code just started (its {@code start()} calls, and the threads its
     * methods hand out, as a factory does to an executor that starts them), each with how often
     * the watch saw it unstarted, its CPU time at the last look and when it was marked: each is
     * polled once. A thread belongs to the activation that
     * made it (it inherited it as it was made), and the JDK has no hook at a start; so one made by
     * an activation that has since ended (kept in a static, started by a later activation or by an
     * executor of one) would run with the poll off, stopped by no end. Marking the start turns the
     * poll on until the thread has polled: then it finds its maker ended and stops (Stopped). Simpler
     * than moving it to the activation that starts it, which cannot be reached from the starter (a
     * thread's own inherited value is its own), and the same for every way a thread is started.
     * One that never polls (it runs JDK code only, a task handed to a kept thread) and still runs a
     * second after its starter's activation ended is a stray of that activation ({@link #watchStarts}).
     */
    private static final Map<Thread, Start> STARTING = new ConcurrentHashMap<>();

    /** A marked start: the watch's unstarted rounds and CPU time at its last look, when, and by which activation. */
    private static final class Start {
        int unstarted;
        long cpu;
        final long at = System.nanoTime();
        /** The starter's activation (its root), null when no activation's thread started it. */
        final Activation by;

        Start(Activation by) { this.by = by; }
    }
    /** How many watch rounds (5 ms) a thread handed out stays marked while no one starts it (it is marked again at a start). */
    private static final int UNSTARTED_ROUNDS = 200;
    private static final java.lang.management.ThreadMXBean CPU = java.lang.management.ManagementFactory.getThreadMXBean();
    /** A started thread not yet polled runs: the poll stays on. */
    private static volatile boolean startRunning;
    static final String MADE_BY_AN_ENDED_ACTIVATION = "this thread was made by an activation that has ended: a thread a"
            + " function makes is started by the activation that makes it, not kept for a later one";

    static {
        // The old generation holds what survived collections: nearly full, it is a function's
        // live data, not garbage. Sampled often, so a function filling the heap is stopped (at its
        // next backward branch) before the runtime's own threads find no memory. The same thread
        // watches the threads of ended activations.
        RuntimeThreads.startRuntimeThread("cpuslot-heap-watch", () -> {
            long rounds = 0;
            while (true) {
                try {
                    Thread.sleep(5);
                    HeapShare.sample();
                    if (++rounds % 4 == 0 && !LINGERING.isEmpty()) sweep(); // every 20 ms
                    if (!STARTING.isEmpty()) watchStarts();
                    if (alert) calm();
                } catch (InterruptedException e) {
                    return;
                } catch (Throwable e) { // an OutOfMemoryError of its own: go on watching
                }
            }
        });
    }

    /** Whether the calling thread is one a function started (it inherited an activation and is no worker). */
    public static boolean functionThread() {
        return ACTIVATION.get() != null && !RUNNING.containsKey(Thread.currentThread());
    }

    /** The calling (worker) thread starts an activation of the function whose classes the loader defines. */
    public static void begin(ClassLoader function) {
        Activation a = new Activation(null, function == null ? null : ThreadBudget.of(function));
        a.worker = Thread.currentThread();
        ACTIVATION.set(a);
        RUNNING.put(Thread.currentThread(), a);
        HeapShare.begin();
    }

    /**
     * The calling (worker) thread ended its activation, by a return or at its deadline: the
     * threads it started end with it (an activation's threads never outlive it, {@link #finish}).
     */
    public static void end() {
        Thread worker = Thread.currentThread();
        Activation a = RUNNING.remove(worker);
        ACTIVATION.remove();
        long allocated = HeapShare.end();
        if (a != null && a.budget != null && allocated >= 0) a.budget.allocated(allocated);
        if (a != null) finish(a, worker, "the activation that started this thread has ended");
        calm();
    }

    /**
     * Ends what an activation started: its threads stop at their next backward branch (they
     * inherited it, wherever they are), the blocked ones are interrupted, and they are watched
     * until none of them lives ({@link #LINGERING}), the poll on whenever one runs: a thread that
     * sleeps again after the interrupt, or blocks past any time window, stops when it runs again.
     */
    private static void finish(Activation a, Thread worker, String why) {
        if (!a.started && STARTING.isEmpty()) { // the usual path: no thread to look for, no lock
            if (a.ended == null) {
                a.endedAt = System.nanoTime();
                a.ended = why;
            }
            return;
        }
        List<Thread> mine;
        synchronized (LINGERING) { // its deadline (the caller) and its return (the worker) may race
            if (a.ended != null) return; // ended once: its threads are known (it starts no more)
            a.endedAt = System.nanoTime();
            a.ended = why;
            ThreadGroup g = worker.getThreadGroup();
            // not a pool's worker: no group of its own
            mine = g == null || !g.getName().equals(worker.getName()) ? new java.util.ArrayList<>() : others(g, worker);
            // and the threads it started that another activation made (kept in a static): they
            // run in its slot, which is held for them as for its own
            for (var e : STARTING.entrySet()) {
                Thread t = e.getKey();
                if (e.getValue().by == a.root && t.isAlive() && !mine.contains(t)) mine.add(t);
            }
            for (Lingering l : LINGERING.values()) mine.removeAll(l.threads()); // an earlier activation's
            if (mine.isEmpty()) return;
            LINGERING.put(a, new Lingering(mine, worker, System.nanoTime()));
        }
        lingerRunning = true;
        alert = true;
        for (Thread t : mine) t.interrupt();
    }

    /** After this long, a thread of an ended activation that still runs is a stray: counted and logged. */
    private static final long STRAY_NANOS = 1_000_000_000L;
    /**
     * Told once of each stray, with its worker's name: the runtime moves it out of the slot its
     * activation had (it would run on there, charged to the next invocation of that slot).
     */
    private static volatile java.util.function.BiConsumer<Thread, String> strayHandler;

    /** Sets what the runtime does with a stray (a thread of an ended activation still running STRAY_NANOS after the end). */
    public static void onStray(java.util.function.BiConsumer<Thread, String> h) { strayHandler = h; }
    /** Threads of ended activations running (not blocked) longer than STRAY_NANOS after the end (at the last check). */
    private static volatile long strays;
    private static final Set<Thread> REPORTED = Collections.newSetFromMap(new java.util.WeakHashMap<>());

    /**
     * Threads of ended activations still running STRAY_NANOS after their end (JDK code that ignores
     * interrupts and does not return to the function's code): the runtime's metric shows them.
     */
    public static long strayThreads() { return strays; }

    /** Threads the runtime moved out of their activation's slot (into a runaway jail). */
    private static final Set<Thread> MOVED = Collections.newSetFromMap(new java.util.WeakHashMap<>());

    /** The runtime moved a thread of an ended activation out of the slot its activation had. */
    public static void moved(Thread t) {
        synchronized (MOVED) { MOVED.add(t); }
    }

    /** Whether the runtime moved the thread out of the slot it ran in ({@link #moved}). */
    public static boolean movedOut(Thread t) {
        synchronized (MOVED) { return MOVED.contains(t); }
    }

    /**
     * Whether an activation of the worker that ended at or after {@code since} (System.nanoTime)
     * left a thread that still runs where it ran (runnable and not {@link #moved}): the slot that
     * activation had is then given to no other invocation. A blocked one (an executor's idle
     * thread) uses no CPU and does not hold the slot: when it runs again it stops at its next
     * backward branch, or is a stray. On the usual path (no activation left a thread) one look at
     * an empty map.
     */
    public static boolean leftBehind(Thread worker, long since) {
        if (LINGERING.isEmpty()) return false;
        for (Lingering l : LINGERING.values()) {
            if (l.worker() != worker || l.since() - since < 0) continue;
            for (Thread t : l.threads()) if (t.getState() == Thread.State.RUNNABLE && !movedOut(t)) return true;
        }
        return false;
    }

    /**
     * Drops the ended activations whose threads all ended; counts (and names, once) those that
     * outlive STRAY_NANOS, whether or not their worker runs another activation meanwhile.
     */
    private static void sweep() {
        long n = 0, now = System.nanoTime();
        boolean running = false;
        for (var e : LINGERING.entrySet()) {
            List<Thread> live = new java.util.ArrayList<>(e.getValue().threads());
            live.removeIf(t -> !t.isAlive());
            if (live.isEmpty()) {
                synchronized (LINGERING) { LINGERING.remove(e.getKey(), e.getValue()); }
                continue;
            }
            if (live.size() < e.getValue().threads().size()) {
                synchronized (LINGERING) { LINGERING.replace(e.getKey(), e.getValue(), new Lingering(live, e.getValue().worker(), e.getValue().since())); }
            }
            for (Thread t : live) if (t.getState() == Thread.State.RUNNABLE) running = true;
            if (now - e.getValue().since() < STRAY_NANOS) continue;
            for (Thread t : live) {
                if (t.getState() != Thread.State.RUNNABLE) continue; // blocked: no CPU; it stops if it runs again
                n++;
                t.interrupt();
                boolean first;
                synchronized (REPORTED) { first = REPORTED.add(t); }
                if (!first) continue;
                var h = strayHandler;
                if (h == null) System.err.println("cpuslot: a thread of an activation of worker " + e.getValue().worker().getName()
                        + " still runs " + (now - e.getValue().since()) / 1_000_000_000L + " s after the activation ended (in code that ignores interrupts)");
                else h.accept(t, e.getValue().worker().getName());
            }
        }
        strays = n;
        lingerRunning = running;
        if (running) alert = true;
    }

    /** The live threads in the worker's group (and the groups below it) but the worker. */
    private static List<Thread> others(ThreadGroup g, Thread worker) {
        Thread[] ts = new Thread[g.activeCount() + 16];
        int n = g.enumerate(ts, true);
        List<Thread> l = new java.util.ArrayList<>();
        for (int i = 0; i < n; i++) if (ts[i] != worker && ts[i].isAlive()) l.add(ts[i]);
        return l;
    }

    // ---- a thread is its maker's: one started after its maker ended stops at once -------------

    /** Inserted by the guard before every {@code start()} call of a function's code and every return of a thread from it. */
    public static void starting(Object o) {
        if (!(o instanceof Thread t) || t.isVirtual()) return;
        Activation by = ACTIVATION.get();
        STARTING.putIfAbsent(t, new Start(by == null ? null : by.root));
        startRunning = true;
        alert = true;
    }

    /**
     * The watch's look at the started threads: those that ended are dropped, and those no one
     * started within UNSTARTED_ROUNDS; the poll stays on while one that has not polled yet used
     * CPU since the last look. One blocked (in a sleep, or in JDK code such as a socket read,
     * runnable to Java but using no CPU) costs no one's loops; when it runs again, the next round
     * turns the poll on.
     */
    private static void watchStarts() {
        boolean running = false;
        long now = System.nanoTime();
        for (var e : STARTING.entrySet()) {
            Thread t = e.getKey();
            Start seen = e.getValue();
            Thread.State s = t.getState();
            if (s == Thread.State.TERMINATED) { STARTING.remove(t); continue; }
            if (s == Thread.State.NEW) {
                if (++seen.unstarted > UNSTARTED_ROUNDS) STARTING.remove(t);
                continue;
            }
            long cpu = CPU.getThreadCpuTime(t.threadId()); // -1: not measured, taken as running
            boolean ran = cpu < 0 || cpu != seen.cpu;
            seen.cpu = cpu;
            if (ran && strayOfItsStarter(t, seen, now)) continue;
            running |= ran;
        }
        startRunning = running;
        if (running) alert = true;
    }

    /**
     * A started thread that has not polled, still running STRAY_NANOS after the activation that
     * started it ended, runs code of no function's loops (JDK code, a task handed to a kept thread):
     * no poll will stop it, so it becomes that activation's lingering thread, interrupted, and a
     * stray at the next sweep (moved out of the slot it was started in, which is the starter's).
     */
    private static boolean strayOfItsStarter(Thread t, Start seen, long now) {
        Activation by = seen.by;
        if (by == null || by.worker == null || by.ended == null || now - by.endedAt < STRAY_NANOS) return false;
        STARTING.remove(t);
        synchronized (LINGERING) {
            Lingering l = LINGERING.get(by);
            if (l == null) {
                LINGERING.put(by, new Lingering(List.of(t), by.worker, by.endedAt));
            } else if (!l.threads().contains(t)) {
                List<Thread> more = new java.util.ArrayList<>(l.threads());
                more.add(t);
                LINGERING.put(by, new Lingering(more, l.worker(), l.since()));
            }
        }
        lingerRunning = true;
        alert = true;
        t.interrupt();
        return true;
    }

    /** Clears the alert when nothing is pending; a cancel or pressure racing with it sets it again. */
    static void calm() {
        if (busy()) return;
        alert = false;
        if (busy()) alert = true;
    }

    /** The heap watch found pressure: every function thread polls. */
    static void alarm() { alert = true; }

    private static boolean busy() { return HeapShare.pressure() || System.nanoTime() - alertUntil < 0 || lingerRunning || startRunning; }

    /**
     * The activation on this worker passed its deadline: its code stops at its next backward
     * branch, and the threads it started that are blocked (a sleep, a queue) are interrupted.
     */
    public static void cancel(Thread worker) {
        Activation a = RUNNING.get(worker);
        if (a == null) return;
        alertUntil = System.nanoTime() + ALERT_NANOS;
        alert = true;
        finish(a, worker, "the activation passed its deadline");
    }

    /** Inserted by the guard before every backward branch of a function's code. */
    public static void poll() {
        if (alert) slowPoll();
    }

    private static void slowPoll() {
        Activation a = ACTIVATION.get();
        String ended = a == null ? null : a.ended();
        Start marked = STARTING.isEmpty() ? null : STARTING.remove(Thread.currentThread());
        if (ended != null) throw new Stopped(marked != null && marked.at - a.root.endedAt > 0 ? MADE_BY_AN_ENDED_ACTIVATION : ended);
        if (HeapShare.pressure()) HeapShare.heap(a);
    }

    /** Ends a function's code at its deadline (thrown again at every backward branch if it is caught). */
    public static final class Stopped extends Error {
        Stopped(String msg) { super(msg, null, false, false); }
    }
}
