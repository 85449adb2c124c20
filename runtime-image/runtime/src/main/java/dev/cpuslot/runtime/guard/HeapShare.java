package dev.cpuslot.runtime.guard;

import java.lang.management.ManagementFactory;
import java.lang.management.MemoryPoolMXBean;
import java.lang.management.MemoryType;
import java.lang.management.MemoryUsage;
import java.util.List;

/**
 * The heap watch's samples and each function's share of the heap: under pressure (the old
 * generation over 70 %), a function thread over its share is stopped with an OutOfMemoryError of
 * its own before the runtime's threads find no memory. Its own class: the pressure, the share and
 * the half-empty epoch are one decision.
 */
public final class HeapShare {
    private HeapShare() {}

    /** Set while the old generation is over 70 % full, until it is under 50 %. */
    private static volatile boolean pressure;
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
    static volatile long halfEmpty;
    /** The last collection that confirmed a full heap before a refusal ({@link #stillFull}). */
    private static final java.util.concurrent.atomic.AtomicLong lastConfirm = new java.util.concurrent.atomic.AtomicLong(System.nanoTime() - 2_000_000_000L);

    /** The old generation's pools (what the heap watch samples). */
    private static final List<MemoryPoolMXBean> OLD = ManagementFactory.getMemoryPoolMXBeans().stream()
            .filter(p -> p.getType() == MemoryType.HEAP && p.isCollectionUsageThresholdSupported()
                    && !p.getName().contains("Eden") && !p.getName().contains("Survivor"))
            .toList();

    /** Samples the old generation (pressure on over 70 %, off under 50 %); whether it is over 70 %. */
    static boolean sample() {
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
            Activations.alarm();
        } else if (low && pressure) {
            pressure = false;
            Activations.calm();
        }
        return high;
    }

    /** Sets the share of the heap a function thread may allocate in one activation before it is stopped under pressure. */
    public static void setShare(long bytes) { share = bytes; }

    static boolean pressure() { return pressure; }

    /** The calling (worker) thread begins an activation: what it allocates from here is the activation's. */
    static void begin() {
        START.set(new long[] {THREADS.getCurrentThreadAllocatedBytes()});
    }

    /** The calling (worker) thread ended its activation: what it allocated in it (-1 when it began none). */
    static long end() {
        long[] st = START.get();
        START.remove();
        return st == null ? -1 : THREADS.getCurrentThreadAllocatedBytes() - st[0];
    }

    /**
     * At the start of a Java activation: under pressure, a function over its share (over its
     * activations since the heap was last half empty) fails before its code runs (a single large
     * allocation has no backward branch to stop at).
     */
    public static void check() {
        if (pressure) heap(Activations.ACTIVATION.get());
    }

    static void heap(Activations.Activation a) {
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
        return sample();
    }

    /** Whether no other function's activations allocated more since the heap was last half empty (a bystander is not stopped for a hog's heap). */
    private static boolean mostAllocated(ThreadBudget b, long n) {
        for (ThreadBudget o : ThreadBudget.all()) if (o != b && o.allocated() > n) return false;
        return true;
    }
}
