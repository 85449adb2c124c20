package dev.cpuslot.runtime.guard;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileAttribute;
import java.lang.management.ManagementFactory;
import java.lang.reflect.AccessibleObject;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Member;
import java.lang.reflect.Method;
import java.lang.management.MemoryPoolMXBean;
import java.lang.management.MemoryType;
import java.lang.management.MemoryUsage;
import java.util.List;
import java.util.Collections;
import java.util.Set;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.HashMap;
import java.util.Map;

/**
 * What a Java action's classes call instead of the process-wide calls a multi-tenant runtime cannot
 * give one tenant ({@link Rewriter} redirects them here): {@code System.exit}, {@code Runtime.exit},
 * {@code Runtime.halt} throw a SecurityException (as a SecurityManager used to);
 * {@code System.getenv} sees the activation's {@code __OW_*} and /init environment on top of the
 * process's, as the OpenWhisk Java runtime provides them; {@code java.io.tmpdir} and the
 * temporary-file calls give the function's own directory.
 *
 * <p>Shared with every action class loader; functions cannot call it themselves (the guard refuses
 * references to the runtime's classes).
 */
public final class ActionGuard {
    private ActionGuard() {}

    private static final ThreadLocal<Map<String, String>> ENV = new ThreadLocal<>();

    /** Sets the calling thread's action environment (null clears it). */
    public static void setEnv(Map<String, String> env) {
        if (env == null) ENV.remove();
        else ENV.set(env);
    }

    public static Map<String, String> env() { return ENV.get(); }

    public static void exit(int status) {
        throw new SecurityException("System.exit(" + status + ") called by the action: not allowed in a shared runtime");
    }

    // Runtime.exit/halt: the rewritten call passes its receiver as an Object (as Runtime.gc())
    public static void exit(Object runtime, int status) {
        throw new SecurityException("Runtime.exit(" + status + ") called by the action: not allowed in a shared runtime");
    }

    public static void halt(Object runtime, int status) {
        throw new SecurityException("Runtime.halt(" + status + ") called by the action: not allowed in a shared runtime");
    }

    /**
     * {@code System.gc()} of a function: nothing. A collection of the shared heap would stop every
     * tenant's threads (a storm of them took a bystander's hello from a few ms to hundreds); the
     * JVM collects when it needs to.
     */
    public static void gc() {}

    public static void gc(Object runtime) {} // Runtime.gc(): the rewritten call passes its receiver as an Object

    public static String getenv(String name) {
        Map<String, String> e = ENV.get();
        if (e != null && name != null) {
            String v = e.get(name);
            if (v != null) return v;
        }
        return System.getenv(name);
    }

    public static Map<String, String> getenv() {
        Map<String, String> e = ENV.get();
        if (e == null || e.isEmpty()) return System.getenv();
        Map<String, String> m = new HashMap<>(System.getenv());
        m.putAll(e);
        return Collections.unmodifiableMap(m);
    }

    // ---- the poll at every backward branch of a function's code -------------------------------

    /** Set while any thread is to be stopped or the heap is nearly full: the poll's fast path reads only this. */
    private static volatile boolean alert;
    private static volatile boolean pressure;
    /**
     * One activation: every thread it starts inherits it, so all of them stop at its deadline.
     * Each thread has its own (a child of the worker's), so a thread that ended is seen to end.
     */
    private static final class Activation {
        /** The worker's: cancelled there. */
        final Activation root;
        final ThreadBudget budget;
        /** Why it ended (its deadline, or its return), null while it runs: every thread it started stops at its next backward branch. */
        volatile String ended;
        /** The activation constructed a thread (the worker's: only then is there anything to end). */
        volatile boolean started;

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
    private static final InheritableThreadLocal<Activation> ACTIVATION = new InheritableThreadLocal<>() {
        @Override
        protected Activation childValue(Activation parent) {
            if (parent == null || parent.budget == null) return parent;
            if (carrier()) return null;
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

    // ---- threads per function ----------------------------------------------------------------

    /**
     * The group of the runtime's own threads that may be started from a worker (pool workers, jail
     * threads), directly under the JVM's top group: never inside a worker's group, whose threads
     * end with each activation.
     */
    public static final ThreadGroup RUNTIME_THREADS = new ThreadGroup(top(), "cpuslot-runtime");

    /**
     * A daemon thread of the runtime's own, wherever the thread that starts it runs: in
     * RUNTIME_THREADS, inheriting no activation. A thread made while a worker runs an activation
     * otherwise lands in the worker's group, and ends with the first activation there that
     * started a thread of its own.
     */
    public static Thread.Builder.OfPlatform runtimeThread(String name) {
        return Thread.ofPlatform().daemon().group(RUNTIME_THREADS).inheritInheritableThreadLocals(false).name(name);
    }

    /**
     * Makes {@code make}'s value on a runtime thread: what it starts as it is made (the JDK's
     * HTTP client starts its selector thread in the maker's group) is the runtime's, not a worker's.
     */
    public static <T> T makeOnRuntimeThread(String name, java.util.function.Supplier<T> make) {
        return makeOn(runtimeThread(name), make);
    }

    /**
     * Makes {@code make}'s value on a new thread of {@code thread} and waits for it, interrupted
     * or not (the value is made once, for everyone, and an interrupt does not stop what makes
     * it); what {@code make} throws is thrown here.
     */
    public static <T> T makeOn(Thread.Builder.OfPlatform thread, java.util.function.Supplier<T> make) {
        Object[] out = new Object[1];
        Throwable[] failed = new Throwable[1];
        Thread t = thread.start(() -> {
            try {
                out[0] = make.get();
            } catch (Throwable e) {
                failed[0] = e;
            }
        });
        boolean interrupted = false;
        while (true) {
            try {
                t.join();
                break;
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) Thread.currentThread().interrupt();
        if (failed[0] instanceof RuntimeException e) throw e;
        if (failed[0] instanceof Error e) throw e;
        if (failed[0] != null) throw new IllegalStateException(failed[0]);
        @SuppressWarnings("unchecked") T v = (T) out[0];
        return v;
    }

    /** An executor on runtime threads (for the JDK's HTTP clients, whose default one makes threads in the submitter's group). */
    public static java.util.concurrent.ExecutorService runtimeExecutor(String name) {
        java.util.concurrent.atomic.AtomicInteger n = new java.util.concurrent.atomic.AtomicInteger();
        return java.util.concurrent.Executors.newCachedThreadPool(r -> runtimeThread(name + "-" + n.incrementAndGet()).unstarted(r));
    }

    private static ThreadGroup top() {
        ThreadGroup g = Thread.currentThread().getThreadGroup();
        while (g.getParent() != null) g = g.getParent();
        return g;
    }

    /** Most live threads one function may have made (CPUSLOT_JAVA_MAX_THREADS; 0: no limit). */
    private static volatile int maxThreads = 64;
    /** Each function's class loader -> its threads. */
    private static final Map<ClassLoader, ThreadBudget> BUDGETS = new ConcurrentHashMap<>();
    /**
     * A thread's own Activation becomes unreachable once the thread ended (the JVM drops its
     * thread locals at exit): its reference is enqueued then and its function's count freed.
     */
    private static final java.lang.ref.ReferenceQueue<Object> ENDED = new java.lang.ref.ReferenceQueue<>();
    /** Longest wait for the reference handler after a collection (a JVM with explicit GC disabled finds nothing). */
    private static final long MARKER_WAIT_NANOS = 5_000_000_000L;
    private static volatile java.lang.ref.Reference<?> polledMarker;
    private static final Set<Counted> COUNTED = ConcurrentHashMap.newKeySet();

    private static final class Counted extends java.lang.ref.PhantomReference<Activation> {
        final ThreadBudget budget;

        Counted(Activation a, ThreadBudget budget) {
            super(a, ENDED);
            this.budget = budget;
        }
    }

    /** The live threads one function made, and what its activations allocated since the heap was last half empty. */
    private static final class ThreadBudget {
        final java.util.concurrent.atomic.AtomicInteger live = new java.util.concurrent.atomic.AtomicInteger();
        /** Bytes its workers allocated in activations that ended since {@link #halfEmpty} was {@code epoch}. */
        private long heapBytes, epoch;

        /** Adds an ended activation's allocation; a count from before the heap was last half empty starts again. */
        synchronized void allocated(long n) {
            if (epoch != halfEmpty) {
                epoch = halfEmpty;
                heapBytes = 0;
            }
            heapBytes += n;
        }

        /** What its ended activations allocated since the heap was last half empty. */
        synchronized long allocated() { return epoch == halfEmpty ? heapBytes : 0; }

        /** The new thread's Activation, or the refusal when the function has its limit of threads. */
        Activation admit(Activation root) {
            freeEnded();
            int max = maxThreads;
            // ended threads are seen only once collected: at the limit, collect, then look again
            if (max > 0 && !reserve(max) && !(collectEnded() && reserve(max))) {
                throw new IllegalStateException("the function already has " + max + " live threads, its limit in"
                        + " this shared runtime (CPUSLOT_JAVA_MAX_THREADS): no more can be started until some end");
            }
            if (max <= 0) live.incrementAndGet();
            root.started = true;
            Activation child = new Activation(root, this);
            COUNTED.add(new Counted(child, this));
            return child;
        }

        private boolean reserve(int max) {
            for (int n = live.get(); n < max; n = live.get()) {
                if (live.compareAndSet(n, n + 1)) return true;
            }
            return false;
        }
    }

    /** The last collection asked for ended threads: at most one per COLLECT_NANOS for the whole runtime. */
    private static final java.util.concurrent.atomic.AtomicLong lastCollect = new java.util.concurrent.atomic.AtomicLong(System.nanoTime() - 1_000_000_000L);
    private static final long COLLECT_NANOS = 200_000_000L;

    /**
     * A function at its limit may have threads that ended but are not collected yet: a collection
     * (at most one per 200 ms for the whole runtime; the caller waits its turn, within its own
     * activation's time) frees their count. False when interrupted.
     */
    private static boolean collectEnded() {
        synchronized (lastCollect) {
            long wait = lastCollect.get() + COLLECT_NANOS - System.nanoTime();
            try {
                if (wait > 0) Thread.sleep(wait / 1_000_000 + 1);
                // the reference handler enqueues what the collection found, later: how much later
                // depends on the machine's load (a fixed 20 ms wait missed them when other JVMs ran).
                // A marker found unreachable by the same collection says when that batch is in.
                Object marker = new Object();
                java.lang.ref.PhantomReference<Object> batch = new java.lang.ref.PhantomReference<>(marker, ENDED);
                marker = null;
                System.gc();
                lastCollect.set(System.nanoTime());
                long until = System.nanoTime() + MARKER_WAIT_NANOS;
                boolean seen = false;
                for (long left; !seen && (left = until - System.nanoTime()) > 0; ) {
                    java.lang.ref.Reference<?> r = ENDED.remove(Math.max(1, Math.min(10, left / 1_000_000)));
                    if (r == batch || polledMarker == batch) seen = true;
                    else if (r != null && COUNTED.remove(r)) ((Counted) r).budget.live.decrementAndGet();
                }
                java.lang.ref.Reference.reachabilityFence(batch);
                freeEnded(); // the rest of the batch, handled in the same pass as the marker
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return false;
            }
            return true;
        }
    }

    private static void freeEnded() {
        for (java.lang.ref.Reference<?> r; (r = ENDED.poll()) != null; ) {
            if (COUNTED.remove(r)) ((Counted) r).budget.live.decrementAndGet();
            else polledMarker = r; // a collection's marker, taken here: its waiter learns it is in
        }
    }

    /** Sets the most live threads one function may have made (0: no limit). */
    public static void setMaxThreads(int max) { maxThreads = max; }
    /** Worker -> its running activation (for the caller that cancels it at the deadline). */
    private static final Map<Thread, Activation> RUNNING = new ConcurrentHashMap<>();
    /** Until then the alert stays on after a cancel: the activation's other threads poll within it. */
    private static volatile long alertUntil;
    /** How long after a deadline the alert stays on for the threads an activation started. */
    private static final long ALERT_NANOS = 30_000_000_000L;
    /** Bytes the calling thread had allocated when its activation began. */
    private static final ThreadLocal<long[]> START = new ThreadLocal<>();
    private static final com.sun.management.ThreadMXBean THREADS =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
    private static final long MAX_HEAP = Runtime.getRuntime().maxMemory();
    /**
     * Under pressure, a function thread that allocated more than this in its activation is stopped,
     * and so is a function whose activations allocated more since the heap was last half empty
     * (over all of them, the most of any function): one that keeps a little less than its share at
     * every call fills the heap call after call.
     */
    private static volatile long share = MAX_HEAP / 8;
    /** Incremented (by the heap watch alone) at every sample that finds the old generation under half full. */
    private static volatile long halfEmpty;
    /** The last collection that confirmed a full heap before a refusal ({@link #stillFull}). */
    private static final java.util.concurrent.atomic.AtomicLong lastConfirm = new java.util.concurrent.atomic.AtomicLong(System.nanoTime() - 2_000_000_000L);

    /** A worker's group whose ended activations may still have live threads, and since when. */
    private record Lingering(Thread worker, long since) {}

    /** Worker groups with threads of ended activations (checked by the heap watch every 20 ms while any is here). */
    private static final Map<ThreadGroup, Lingering> LINGERING = new ConcurrentHashMap<>();
    /**
     * Whether the poll stays on for them: from an end until the next check, then while any of them
     * runs. One blocked uses no CPU and costs every function's loops nothing; when it runs again,
     * the next check (20 ms) turns the poll on.
     */
    private static volatile boolean lingerRunning;

    /** The old generation's pools (what the heap watch samples). */
    private static final List<MemoryPoolMXBean> OLD = ManagementFactory.getMemoryPoolMXBeans().stream()
            .filter(p -> p.getType() == MemoryType.HEAP && p.isCollectionUsageThresholdSupported()
                    && !p.getName().contains("Eden") && !p.getName().contains("Survivor"))
            .toList();

    static {
        // The old generation holds what survived collections: nearly full, it is a function's
        // live data, not garbage. Sampled often, so a function filling the heap is stopped (at its
        // next backward branch) before the runtime's own threads find no memory.
        Thread.ofPlatform().daemon().name("cpuslot-heap-watch").start(() -> {
            long rounds = 0;
            while (true) {
                try {
                    Thread.sleep(5);
                    sampleHeap();
                    if (++rounds % 4 == 0 && !LINGERING.isEmpty()) sweep(); // every 20 ms
                    if (alert) calm();
                } catch (InterruptedException e) {
                    return;
                } catch (Throwable e) { // an OutOfMemoryError of its own: go on watching
                }
            }
        });
    }

    /** Samples the old generation (pressure on over 70 %, off under 50 %); whether it is over 70 %. */
    private static boolean sampleHeap() {
        long used = 0, max = 0;
        for (MemoryPoolMXBean p : OLD) {
            MemoryUsage u = p.getUsage();
            used += u.getUsed();
            max += u.getMax() > 0 ? u.getMax() : u.getCommitted();
        }
        return heapUsed(used, max > 0 ? max : MAX_HEAP);
    }

    private static synchronized boolean heapUsed(long used, long max) {
        boolean high = used > max / 10 * 7, low = used < max / 10 * 5;
        if (low) halfEmpty++; // what functions allocated before now is not what fills the heap: counted again from here
        if (high && !pressure) {
            pressure = true;
            alert = true;
        } else if (low && pressure) {
            pressure = false;
            calm();
        }
        return high;
    }

    /** Sets the share of the heap a function thread may allocate in one activation before it is stopped under pressure. */
    public static void setShare(long bytes) { share = bytes; }

    /** Whether the calling thread is one a function started (it inherited an activation and is no worker). */
    public static boolean functionThread() {
        return ACTIVATION.get() != null && !RUNNING.containsKey(Thread.currentThread());
    }

    /** The calling (worker) thread starts an activation of the function whose classes the loader defines. */
    public static void begin(ClassLoader function) {
        Activation a = new Activation(null, function == null ? null : BUDGETS.computeIfAbsent(function, f -> new ThreadBudget()));
        ACTIVATION.set(a);
        RUNNING.put(Thread.currentThread(), a);
        START.set(new long[] {THREADS.getCurrentThreadAllocatedBytes()});
    }

    /**
     * The calling (worker) thread ended its activation, by a return or at its deadline: the
     * threads it started end with it (an activation's threads never outlive it, {@link #finish}).
     */
    public static void end() {
        Thread worker = Thread.currentThread();
        Activation a = RUNNING.remove(worker);
        ACTIVATION.remove();
        long[] st = START.get();
        if (a != null && a.budget != null && st != null) a.budget.allocated(THREADS.getCurrentThreadAllocatedBytes() - st[0]);
        START.remove();
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
        if (a.ended == null) a.ended = why;
        if (!a.started) return;
        ThreadGroup g = worker.getThreadGroup();
        if (g == null || !g.getName().equals(worker.getName())) return; // not a pool's worker: no group of its own
        LINGERING.put(g, new Lingering(worker, System.nanoTime()));
        lingerRunning = true;
        alert = true;
        interruptStarted(worker);
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

    /** Drops the groups whose started threads all ended; counts (and names, once) those that outlive STRAY_NANOS. */
    private static void sweep() {
        long n = 0, now = System.nanoTime();
        boolean running = false;
        for (var e : LINGERING.entrySet()) {
            List<Thread> live = others(e.getKey(), e.getValue().worker());
            if (live.isEmpty()) {
                LINGERING.remove(e.getKey(), e.getValue());
                continue;
            }
            for (Thread t : live) if (t.getState() == Thread.State.RUNNABLE) running = true;
            // a worker in its next activation: those may be its threads (its end looks again)
            if (RUNNING.containsKey(e.getValue().worker()) || now - e.getValue().since() < STRAY_NANOS) continue;
            for (Thread t : live) {
                if (t.getState() != Thread.State.RUNNABLE) continue; // blocked: no CPU; it stops if it runs again
                n++;
                t.interrupt();
                boolean first;
                synchronized (REPORTED) { first = REPORTED.add(t); }
                if (!first) continue;
                var h = strayHandler;
                if (h == null) System.err.println("cpuslot: a thread of an activation of worker " + e.getKey().getName()
                        + " still runs " + (now - e.getValue().since()) / 1_000_000_000L + " s after the activation ended (in code that ignores interrupts)");
                else h.accept(t, e.getKey().getName());
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

    /** Clears the alert when nothing is pending; a cancel or pressure racing with it sets it again. */
    private static void calm() {
        if (busy()) return;
        alert = false;
        if (busy()) alert = true;
    }

    private static boolean busy() { return pressure || System.nanoTime() - alertUntil < 0 || lingerRunning; }

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

    /**
     * Interrupts the platform threads in the worker's own thread group (named as the worker: the
     * pool's): the threads its activations started, directly or through an executor, and theirs.
     * The worker is retired after a deadline, so they are this activation's or leftovers of
     * earlier ones on the same worker, which should have ended with those.
     */
    private static void interruptStarted(Thread worker) {
        ThreadGroup g = worker.getThreadGroup();
        if (g == null || !g.getName().equals(worker.getName())) return;
        for (Thread t : others(g, worker)) t.interrupt();
    }

    /** Inserted by the guard before every backward branch of a function's code. */
    public static void poll() {
        if (alert) slowPoll();
    }

    private static void slowPoll() {
        Activation a = ACTIVATION.get();
        String ended = a == null ? null : a.ended();
        if (ended != null) throw new Stopped(ended);
        if (pressure) heap(a);
    }

    /**
     * At the start of a Java activation: under pressure, a function over its share (over its
     * activations since the heap was last half empty) fails before its code runs (a single large
     * allocation has no backward branch to stop at).
     */
    public static void heapCheck() {
        if (pressure) heap(ACTIVATION.get());
    }

    private static void heap(Activation a) {
        long[] st = START.get();
        long allocated = THREADS.getCurrentThreadAllocatedBytes() - (st == null ? 0 : st[0]);
        long s = share;
        if (allocated > s) {
            throw new OutOfMemoryError("the function allocated " + (allocated >> 20) + " MiB in this activation while the"
                    + " runtime's heap is nearly full (its share: " + (s >> 20) + " MiB)");
        }
        ThreadBudget b = a == null ? null : a.budget;
        long before = b == null ? 0 : b.allocated();
        if (before + allocated > s && mostAllocated(b, before) && stillFull()) {
            throw new OutOfMemoryError("the function allocated " + ((before + allocated) >> 20) + " MiB in its activations since"
                    + " the runtime's heap was last half empty, the most of any function, and the heap is nearly full (its share: "
                    + (s >> 20) + " MiB)");
        }
    }

    /**
     * Whether the heap is still nearly full after a collection: the old generation holds garbage
     * until one runs (a hog stopped a moment ago), and a function is not refused for that. At most
     * one such collection a second for the whole runtime (each stops every tenant's threads: a
     * hog refused again and again must not make them often); within that, the last one told.
     */
    private static boolean stillFull() {
        synchronized (lastConfirm) {
            if (System.nanoTime() - lastConfirm.get() >= 1_000_000_000L) {
                System.gc();
                lastConfirm.set(System.nanoTime());
            }
        }
        return sampleHeap();
    }

    /** Whether no other function's activations allocated more since the heap was last half empty (a bystander is not stopped for a hog's heap). */
    private static boolean mostAllocated(ThreadBudget b, long n) {
        for (ThreadBudget o : BUDGETS.values()) if (o != b && o.allocated() > n) return false;
        return true;
    }

    /** Ends a function's code at its deadline (thrown again at every backward branch if it is caught). */
    public static final class Stopped extends Error {
        Stopped(String msg) { super(msg, null, false, false); }
    }

    // ---- no work on the common ForkJoinPool (Rewriter: what is rewritten to these) --------------

    /**
     * The executor a function's {@code CompletableFuture.*Async} call gets instead of the common
     * pool: each task on a thread of its own, made as if by the calling activation (taken when the
     * call site runs, not when a JDK thread completing the stage hands the task over), so it is
     * counted in the function's thread limit and stops at the activation's deadline.
     */
    public static java.util.concurrent.Executor executor() {
        Activation a = ACTIVATION.get();
        ThreadGroup g = Thread.currentThread().getThreadGroup();
        return task -> {
            Activation prev = ACTIVATION.get();
            if (a == null) ACTIVATION.remove();
            else ACTIVATION.set(a);
            try {
                Thread.ofPlatform().group(g).daemon(true).name("async-task").start(task);
            } finally {
                if (prev == null) ACTIVATION.remove();
                else ACTIVATION.set(prev);
            }
        };
    }

    /** A thread of a pool the function made, where a fork stays (the common pool's never runs its code). */
    private static boolean inOwnPool() {
        return Thread.currentThread() instanceof java.util.concurrent.ForkJoinWorkerThread w
                && w.getPool() != java.util.concurrent.ForkJoinPool.commonPool();
    }

    /** {@code ForkJoinTask.fork()}: outside a pool of the function's own, the task runs here (its join finds it done). */
    public static java.util.concurrent.ForkJoinTask<?> fork(java.util.concurrent.ForkJoinTask<?> t) {
        if (inOwnPool()) return t.fork();
        t.quietlyInvoke();
        return t;
    }

    public static void invokeAll(java.util.concurrent.ForkJoinTask<?> t1, java.util.concurrent.ForkJoinTask<?> t2) {
        if (inOwnPool()) java.util.concurrent.ForkJoinTask.invokeAll(t1, t2);
        else { t1.invoke(); t2.invoke(); }
    }

    public static void invokeAll(java.util.concurrent.ForkJoinTask<?>... ts) {
        if (inOwnPool()) java.util.concurrent.ForkJoinTask.invokeAll(ts);
        else for (var t : ts) t.invoke();
    }

    public static <T extends java.util.concurrent.ForkJoinTask<?>> java.util.Collection<T> invokeAll(java.util.Collection<T> ts) {
        if (inOwnPool()) return java.util.concurrent.ForkJoinTask.invokeAll(ts);
        for (var t : ts) t.invoke();
        return ts;
    }

    // Arrays.parallelPrefix, sequentially (the JDK's has no sequential twin)
    public static <T> void parallelPrefix(T[] a, java.util.function.BinaryOperator<T> op) { parallelPrefix(a, 0, a.length, op); }

    public static <T> void parallelPrefix(T[] a, int from, int to, java.util.function.BinaryOperator<T> op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.apply(a[i - 1], a[i]);
    }

    public static void parallelPrefix(long[] a, java.util.function.LongBinaryOperator op) { parallelPrefix(a, 0, a.length, op); }

    public static void parallelPrefix(long[] a, int from, int to, java.util.function.LongBinaryOperator op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.applyAsLong(a[i - 1], a[i]);
    }

    public static void parallelPrefix(double[] a, java.util.function.DoubleBinaryOperator op) { parallelPrefix(a, 0, a.length, op); }

    public static void parallelPrefix(double[] a, int from, int to, java.util.function.DoubleBinaryOperator op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.applyAsDouble(a[i - 1], a[i]);
    }

    public static void parallelPrefix(int[] a, java.util.function.IntBinaryOperator op) { parallelPrefix(a, 0, a.length, op); }

    public static void parallelPrefix(int[] a, int from, int to, java.util.function.IntBinaryOperator op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.applyAsInt(a[i - 1], a[i]);
    }

    // ---- reflection on the function's own classes only ---------------------------------------

    /** The function class that called the guard (the rewritten call site). */
    private static Class<?> caller() {
        return WALKER.walk(s -> s.map(StackWalker.StackFrame::getDeclaringClass)
                .filter(c -> c != ActionGuard.class).findFirst().orElse(ActionGuard.class));
    }

    /** Reflection may act only on members of the calling function's own classes. */
    private static void own(Class<?> target, String what) {
        ClassLoader l = caller().getClassLoader();
        if (target == null || target.getClassLoader() != l || !TMP.containsKey(l)) {
            throw new SecurityException(what + " of " + (target == null ? "null" : target.getName())
                    + ": reflection on other than the function's own classes is not allowed to a function in a shared runtime");
        }
    }

    public static Object invoke(Object method, Object target, Object[] args) throws IllegalAccessException, InvocationTargetException {
        Method m = (Method) method;
        own(m.getDeclaringClass(), "Method.invoke");
        return m.invoke(target, args);
    }

    public static Object newInstance(Object constructor, Object[] args)
            throws InstantiationException, IllegalAccessException, InvocationTargetException {
        Constructor<?> c = (Constructor<?>) constructor;
        own(c.getDeclaringClass(), "Constructor.newInstance");
        return c.newInstance(args);
    }

    public static Object newInstance(Object cls) throws InstantiationException, IllegalAccessException {
        Class<?> c = (Class<?>) cls;
        own(c, "Class.newInstance");
        try {
            return c.getDeclaredConstructor().newInstance();
        } catch (NoSuchMethodException e) {
            throw new InstantiationException(c.getName() + " has no constructor without parameters");
        } catch (InvocationTargetException e) {
            throw new IllegalStateException(e.getCause());
        }
    }

    public static void setAccessible(Object member, boolean flag) {
        own(((Member) member).getDeclaringClass(), "setAccessible");
        ((AccessibleObject) member).setAccessible(flag);
    }

    public static boolean trySetAccessible(Object member) {
        own(((Member) member).getDeclaringClass(), "trySetAccessible");
        return ((AccessibleObject) member).trySetAccessible();
    }

    // ---- XML parsers read no external entities -----------------------------------------------

    /**
     * The JDK's XML parsers of every function resolve no external DTD, entity, schema or
     * stylesheet (a parser opens those itself, past the path checks): the JAXP properties'
     * defaults, set once for the process (System.setProperty is refused to functions).
     */
    public static void secureXml() {
        for (String p : new String[] {"javax.xml.accessExternalDTD", "javax.xml.accessExternalSchema", "javax.xml.accessExternalStylesheet"})
            System.setProperty(p, "");
    }

    /**
     * A property a function sets on its parser: refused when it would let the parser reach
     * external resources, or name a catalog (a file the parser opens itself, unchecked).
     */
    private static void xml(String name, Object value) {
        String n = name == null ? "" : name.toLowerCase(java.util.Locale.ROOT);
        if (n.contains("accessexternal") && !"".equals(value)) {
            throw new SecurityException(name + "=" + value + ": an XML parser reading external resources is " + Rewriter.NOT_ALLOWED);
        }
        if (n.contains("catalog")) {
            throw new SecurityException(name + ": an XML catalog is " + Rewriter.NOT_ALLOWED);
        }
    }

    public static void setAttribute(Object factory, String name, Object value) {
        xml(name, value);
        ((javax.xml.parsers.DocumentBuilderFactory) factory).setAttribute(name, value);
    }

    public static void setProperty(Object target, String name, Object value) throws org.xml.sax.SAXException {
        xml(name, value);
        switch (target) {
            case javax.xml.parsers.SAXParser p -> p.setProperty(name, value);
            case org.xml.sax.XMLReader r -> r.setProperty(name, value);
            case javax.xml.stream.XMLInputFactory f -> f.setProperty(name, value);
            case javax.xml.validation.SchemaFactory f -> f.setProperty(name, value);
            case javax.xml.validation.Validator v -> v.setProperty(name, value);
            case javax.xml.validation.ValidatorHandler v -> v.setProperty(name, value);
            default -> throw new IllegalStateException("not an XML parser: " + target.getClass().getName());
        }
    }

    // ---- the function's own temporary directory ----------------------------------------------

    /** Each function's class loader -> its temporary directory (removed with the function). */
    private static final Map<ClassLoader, Path> TMP = new ConcurrentHashMap<>();
    /** The same with its links resolved, as the path checks compare it. */
    private static final Map<ClassLoader, Path> TMP_REAL = new ConcurrentHashMap<>();
    private static final StackWalker WALKER = StackWalker.getInstance(StackWalker.Option.RETAIN_CLASS_REFERENCE);

    /** Gives the function whose classes the loader defines its own temporary directory (null removes it). */
    public static void setTmpdir(ClassLoader function, Path dir) {
        if (dir == null) {
            TMP.remove(function);
            TMP_REAL.remove(function);
            BUDGETS.remove(function); // its threads still alive keep their count object
        } else {
            TMP.put(function, dir);
            TMP_REAL.put(function, real(dir.toAbsolutePath().normalize()));
        }
    }

    /**
     * The calling function's temporary directory: found from the class that made the call (the
     * rewritten call site), so threads the function starts have it too.
     */
    private static Path tmpdir() {
        Class<?> caller = caller();
        Path p = TMP.get(caller.getClassLoader());
        if (p == null) throw new SecurityException("no temporary directory for " + caller.getName());
        return p;
    }

    public static String getProperty(String key) {
        if ("java.io.tmpdir".equals(key)) return tmpdir().toString();
        return System.getProperty(key);
    }

    public static String getProperty(String key, String def) {
        if ("java.io.tmpdir".equals(key)) return tmpdir().toString();
        return System.getProperty(key, def);
    }

    /** A copy: a function cannot change the JVM's properties through it. */
    public static Properties getProperties() {
        Properties p = new Properties();
        p.putAll(System.getProperties());
        p.setProperty("java.io.tmpdir", tmpdir().toString());
        return p;
    }

    public static File createTempFile(String prefix, String suffix) throws IOException {
        return File.createTempFile(prefix, suffix, tmpdir().toFile());
    }

    public static File createTempFile(String prefix, String suffix, File dir) throws IOException {
        if (dir != null) path(dir);
        return File.createTempFile(prefix, suffix, dir != null ? dir : tmpdir().toFile());
    }

    public static Path createTempFile(String prefix, String suffix, FileAttribute<?>... attrs) throws IOException {
        return Files.createTempFile(tmpdir(), prefix, suffix, attrs);
    }

    public static Path createTempDirectory(String prefix, FileAttribute<?>... attrs) throws IOException {
        return Files.createTempDirectory(tmpdir(), prefix, attrs);
    }

    // ---- file access by path (the checks FilePaths inserts before the JDK's file calls) --------

    /** Devices a function may open; the rest of /dev (and /dev/fd, the process's descriptors) not. */
    private static final Set<String> DEVICES = Set.of("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full");

    /** The runtime's temporary directory, every function's own below it: a function reaches only its own. */
    private static final Path RUNTIME_TMP = real(Path.of(System.getProperty("java.io.tmpdir")).toAbsolutePath().normalize());

    /** Files of the runtime that no function may open (its log, wherever CPUSLOT_LOG puts it). */
    private static final Set<Path> PROTECTED = ConcurrentHashMap.newKeySet();

    /** Keeps functions from a file of the runtime's own, or from a directory and everything below it. */
    public static void protect(Path p) {
        PROTECTED.add(real(p.toAbsolutePath().normalize()));
    }

    public static void path(String name) {
        if (name == null) return; // the JDK call throws its NullPointerException
        Path p;
        try {
            p = Path.of(name);
        } catch (java.nio.file.InvalidPathException e) {
            throw new SecurityException(name + ": not a path: file access " + Rewriter.NOT_ALLOWED);
        }
        check(p, name);
    }

    public static void path(File f) {
        if (f == null) return;
        // the JDK asks a File for its path again after the check: only File's own answer is trusted
        if (f.getClass() != File.class) throw new SecurityException("a " + f.getClass().getName() + " as a file: " + Rewriter.NOT_ALLOWED);
        path(f.getPath());
    }

    public static void path(Path p) {
        if (p == null) return;
        if (p.getClass().getModule().getLayer() != ModuleLayer.boot()) {
            throw new SecurityException("a " + p.getClass().getName() + " as a path: " + Rewriter.NOT_ALLOWED);
        }
        if (p.getFileSystem() != java.nio.file.FileSystems.getDefault()) return; // inside an archive the function opened
        check(p, p.toString());
    }

    public static void path(java.net.URL u) {
        if (u == null) return;
        String proto = u.getProtocol();
        if (proto.equalsIgnoreCase("jar")) { // jar:<url of the archive>!/<entry>
            String f = u.getFile();
            int bang = f.indexOf("!/");
            try {
                path(java.net.URI.create(bang < 0 ? f : f.substring(0, bang)).toURL());
            } catch (IllegalArgumentException | java.net.MalformedURLException e) {
                throw new SecurityException(u + ": not a jar URL: file access " + Rewriter.NOT_ALLOWED);
            }
        } else if (proto.equalsIgnoreCase("file")) {
            try {
                check(Path.of(u.toURI()), u.toString());
            } catch (java.net.URISyntaxException | IllegalArgumentException | java.nio.file.FileSystemNotFoundException e) {
                throw new SecurityException(u + ": not a file URL: file access " + Rewriter.NOT_ALLOWED);
            }
        }
    }

    /**
     * An XML system id the parser opens itself ({@code DocumentBuilder.parse(String)}, an
     * {@code InputSource} or {@code StreamSource} of one): a URI is checked as a URL ({@code file:},
     * {@code jar:}), one without a scheme as a path; one that is neither is refused (the parser
     * would fix it up and open it).
     */
    public static void systemId(String id) {
        if (id == null) return;
        int colon = id.indexOf(':'), slash = id.indexOf('/');
        if (colon < 0 || (slash >= 0 && slash < colon)) {
            path(id);
            return;
        }
        try {
            java.net.URI u = new java.net.URI(id);
            if (u.getScheme() == null) path(id);
            else if (u.getScheme().equalsIgnoreCase("file") || u.getScheme().equalsIgnoreCase("jar")) path(u.toURL());
        } catch (java.net.URISyntaxException | IllegalArgumentException | java.net.MalformedURLException e) {
            throw new SecurityException(id + ": not a URI: an XML system id of a function " + Rewriter.NOT_ALLOWED);
        }
    }

    /** Refuses a path (as named, and with its links resolved) in the process, the kernel, a device or the runtime's files. */
    private static void check(Path p, String name) {
        Path abs = p.toAbsolutePath().normalize();
        String why = denied(abs);
        if (why == null) {
            Path r = real(abs);
            if (!r.equals(abs)) why = denied(r);
        }
        if (why != null) throw new SecurityException(name + " is " + why + ": file access there is " + Rewriter.NOT_ALLOWED);
    }

    private static String denied(Path x) {
        if (x.startsWith("/proc") || x.startsWith("/sys")) return "the process's or the kernel's";
        if (x.startsWith("/dev") && !DEVICES.contains(x.toString())) return "a device";
        for (Path q : PROTECTED) if (x.startsWith(q)) return "the runtime's own";
        if (x.startsWith(RUNTIME_TMP)) {
            Path own = TMP_REAL.get(caller().getClassLoader());
            if (own == null || !x.startsWith(own)) return "in the runtime's temporary directory, outside the function's own";
        }
        return null;
    }

    /** The path with the links of its longest existing prefix resolved (what the kernel opens). */
    private static Path real(Path abs) {
        for (Path q = abs; q != null; q = q.getParent()) {
            try {
                return q.toRealPath().resolve(q.relativize(abs)).normalize();
            } catch (IOException | SecurityException e) {
                // not there (yet): its parent
            }
        }
        return abs;
    }
}
