package dev.cpuslot.runtime.guard;

import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The live threads one function made, and what its activations allocated since the heap was last
 * half empty: each function's thread limit (CPUSLOT_JAVA_MAX_THREADS), counted where every thread
 * a function makes passes ({@link Activations}), and the per-function allocation
 * {@link HeapShare} compares. Its own class: the count, the ended threads' references and the
 * collection that frees them are one mechanism.
 */
public final class ThreadBudget {
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

    private static final class Counted extends java.lang.ref.PhantomReference<Activations.Activation> {
        final ThreadBudget budget;

        Counted(Activations.Activation a, ThreadBudget budget) {
            super(a, ENDED);
            this.budget = budget;
        }
    }

    private ThreadBudget() {}

    private final java.util.concurrent.atomic.AtomicInteger live = new java.util.concurrent.atomic.AtomicInteger();
    /** Bytes its workers allocated in activations that ended since {@link HeapShare#halfEmpty} was {@code epoch}. */
    private long heapBytes, epoch;

    /** Adds an ended activation's allocation; a count from before the heap was last half empty starts again. */
    synchronized void allocated(long n) {
        if (epoch != HeapShare.halfEmpty) {
            epoch = HeapShare.halfEmpty;
            heapBytes = 0;
        }
        heapBytes += n;
    }

    /** What its ended activations allocated since the heap was last half empty. */
    synchronized long allocated() { return epoch == HeapShare.halfEmpty ? heapBytes : 0; }

    /** The new thread's Activation, or the refusal when the function has its limit of threads. */
    Activations.Activation admit(Activations.Activation root) {
        freeEnded();
        int max = maxThreads;
        // ended threads are seen only once collected: at the limit, collect, then look again
        if (max > 0 && !reserve(max) && !(collectEnded() && reserve(max))) {
            throw new IllegalStateException("the function already has " + max + " live threads, its limit in"
                    + " this shared runtime (CPUSLOT_JAVA_MAX_THREADS): no more can be started until some end");
        }
        if (max <= 0) live.incrementAndGet();
        root.started = true;
        Activations.Activation child = new Activations.Activation(root, this);
        COUNTED.add(new Counted(child, this));
        return child;
    }

    private boolean reserve(int max) {
        for (int n = live.get(); n < max; n = live.get()) {
            if (live.compareAndSet(n, n + 1)) return true;
        }
        return false;
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

    /** The function's (its class loader's), made at its first activation. */
    static ThreadBudget of(ClassLoader function) { return BUDGETS.computeIfAbsent(function, f -> new ThreadBudget()); }

    /** The function is gone: its threads still alive keep their count object. */
    static void forget(ClassLoader function) { BUDGETS.remove(function); }

    /** Every function's, for the heap's comparison. */
    static java.util.Collection<ThreadBudget> all() { return BUDGETS.values(); }

    /** Sets the most live threads one function may have made (0: no limit). */
    public static void setMaxThreads(int max) { maxThreads = max; }
}
