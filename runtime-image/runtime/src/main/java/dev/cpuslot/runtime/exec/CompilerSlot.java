package dev.cpuslot.runtime.exec;

import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.slot.ReleaseOutcome;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The compilers' own slot. HotSpot's compiler threads (C1, C2: they compile the runtime, and the
 * Graal compiler itself on a stock JDK) and Truffle's (it compiles guest code) are moved into one
 * slot the runtime leases for them (CPUSLOT_COMPILER_QUOTA), so that compiling is charged to no
 * invocation, capped by no invocation's quota, and bounded on a busy node. Without it they run in
 * the container's own cgroup (HotSpot's) or in the cgroup of the thread that made them (Truffle's;
 * made by the first context of the process, on a runtime thread: see Contexts).
 *
 * <p>Which threads: HotSpot's, by kernel name, listed when the runtime starts, before any
 * function's code ran (a function may name its threads as it likes; compiler threads HotSpot adds
 * later are made by its compiler threads, inside this slot); Truffle's, by its Java class (loaded
 * by the runtime's class loader, which no function's class is), looked up once, on the runtime
 * thread whose first polyglot context made it, right after (one thread dump; never per scrape or
 * per check). One thread holds the lease and sleeps in the slot; a lost lease (agent restarted,
 * did not know it) is taken again and the threads placed again, checked every 10 s. Nothing is
 * asked before the agent served the runtime (no agent: nothing). Counted in
 * {@code cpuslot_compiler_*} with or without the slot.
 */
public final class CompilerSlot implements AutoCloseable {
    /** HotSpot's compiler threads' kernel names (the JVM's names cut to 15 bytes). */
    private static final Set<String> HOTSPOT = Set.of("C1 CompilerThre", "C2 CompilerThre", "JVMCI CompilerT");
    private static final String TRUFFLE_QUEUE = "com.oracle.truffle.runtime.BackgroundCompileQueue";
    private static final String TRUFFLE_THREAD = TRUFFLE_QUEUE + "$TruffleCompilerThreadFactory$1";
    private static final long CHECK_MS = 10_000, RETRY_MS = 1_000;

    /** Truffle's compiler threads (tid to kernel name) as found where they were made; null: not yet. */
    private static volatile Map<Integer, String> truffle;
    /** Lookups of Truffle's compiler thread made (a thread dump each). */
    static final AtomicInteger LOOKS = new AtomicInteger();
    /** How long truffleStarted waits for a compiler thread just started to have its kernel name. */
    private static final int NAME_TRIES = 20, NAME_WAIT_MS = 50;
    private static final Set<CompilerSlot> OPEN = ConcurrentHashMap.newKeySet();

    private final SlotClient slots;
    private final long quotaMilli;
    /** Every compiler thread seen (tid to its kernel name) and its CPU when last read. */
    private final Map<Integer, String> threads = new ConcurrentHashMap<>();
    private final Map<Integer, Long> cpuNs = new ConcurrentHashMap<>();
    private final Set<Integer> placed = ConcurrentHashMap.newKeySet();
    private final Semaphore wake = new Semaphore(0);
    private volatile boolean closed, truffleTaken;
    private volatile long heldMilli;
    private final Thread holder;

    public CompilerSlot(SlotClient slots, long quotaMilli, Metrics metrics) {
        this.slots = slots;
        this.quotaMilli = quotaMilli;
        hotspotThreads().forEach(threads::put);
        metrics.describe("cpuslot_compiler_threads", "Compiler threads (HotSpot's and Truffle's) in the compiler's own slot.");
        metrics.describe("cpuslot_compiler_slot_quota_milli", "Quota of the compiler's own slot in millicores; 0 while it has none (off, no agent, lease lost).");
        metrics.describe("cpuslot_compiler_cpu_seconds_total", "CPU time of the compiler threads (HotSpot's and Truffle's), in or out of the compiler's slot.");
        metrics.gaugeFunction("cpuslot_compiler_threads", m -> m.add(placed.size()));
        metrics.gaugeFunction("cpuslot_compiler_slot_quota_milli", m -> m.add(heldMilli));
        metrics.counterFunction("cpuslot_compiler_cpu_seconds_total", m -> m.add(cpuSeconds()));
        OPEN.add(this);
        if (slots != null && quotaMilli > 0) {
            holder = dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("compiler-slot", this::hold);
        } else {
            holder = null;
        }
    }

    /**
     * The process's first polyglot context was made, on this runtime thread, and with it Truffle's
     * compiler thread: it is looked up here, once per process (every engine shares it), and each
     * compiler slot takes it (placed, counted).
     */
    public static synchronized void truffleStarted() {
        if (truffle == null) truffleMade(truffleThreads());
    }

    /** Truffle's compiler threads, found: each compiler slot takes them. */
    static void truffleMade(Map<Integer, String> found) {
        truffle = Map.copyOf(found);
        for (CompilerSlot c : OPEN) c.wake.release();
    }

    /** Takes Truffle's compiler threads once they were found (no lookup: a map read). */
    private void takeTruffle() {
        Map<Integer, String> t = truffle;
        if (t == null || truffleTaken) return;
        threads.putAll(t);
        truffleTaken = true;
    }

    private void hold() {
        long started = System.nanoTime();
        SlotLease lease = null;
        String lastProblem = "start";
        while (!closed) {
            String problem = null;
            if (lease == null || lease.lost()) {
                if (lease != null) {
                    lease.release(ReleaseOutcome.OK);
                    heldMilli = 0;
                    placed.clear();
                    Log.warn("the compiler's slot was lost (agent restarted); taking one again");
                }
                lease = slots.served() ? take() : null; // no agent (yet): nothing asked, nothing counted
                if (lease == null) problem = slots.served() ? "no slot to be had" : "no agent";
            }
            if (lease != null) problem = place(lease);
            if (problem != null && !problem.equals(lastProblem) && !problem.equals("no agent")) Log.warn("compiler threads not in a slot of their own: " + problem);
            if (problem == null && !"".equals(lastProblem)) Log.info("compiler threads in a " + heldMilli + "m slot of their own");
            lastProblem = problem == null ? "" : problem;
            try {
                // soon again while something is left to place, or while the agent may still come up at start
                boolean soon = lease == null ? System.nanoTime() - started < 60_000_000_000L : problem != null;
                if (wake.tryAcquire(soon ? RETRY_MS : CHECK_MS, TimeUnit.MILLISECONDS)) wake.drainPermits();
            } catch (InterruptedException e) {
                break;
            }
        }
        if (lease != null) lease.release(ReleaseOutcome.OK);
        heldMilli = 0;
        placed.clear();
    }

    /** A lease with this thread in its slot, or null (no agent, no slot within the budget). */
    private SlotLease take() {
        try {
            slots.prepareThread();
            SlotLease l = slots.acquire(quotaMilli, "cpuslot-compiler", "compiler");
            if (l.active()) {
                heldMilli = l.quotaMilli();
                return l;
            }
            l.release(ReleaseOutcome.OK);
        } catch (RuntimeException e) { // fail-closed client without an agent
            Log.warn("no slot for the compiler: " + e.getMessage());
        }
        return null;
    }

    /** Places the compiler threads not yet in the slot; null, or what is left undone. */
    private String place(SlotLease lease) {
        takeTruffle();
        String left = null;
        for (var e : threads.entrySet()) {
            int tid = e.getKey();
            if (!e.getValue().equals(comm(tid))) { // ended
                threads.remove(tid);
                placed.remove(tid);
                continue;
            }
            if (placed.contains(tid)) continue;
            String err = slots.placeThread(lease, tid);
            if (err == null) placed.add(tid);
            else left = e.getValue() + " (tid " + tid + "): " + err;
        }
        return left;
    }

    /** HotSpot's compiler threads now, by kernel name: called before any function's code runs. */
    private static Map<Integer, String> hotspotThreads() {
        Map<Integer, String> m = new ConcurrentHashMap<>();
        try (var ts = Files.list(Path.of("/proc/self/task"))) {
            for (Path t : ts.toList()) {
                int tid = Integer.parseInt(t.getFileName().toString());
                String name = comm(tid);
                if (HOTSPOT.contains(name)) m.put(tid, name);
            }
        } catch (IOException | RuntimeException e) { // no /proc: nothing to place
        }
        return m;
    }

    /**
     * Truffle's compiler threads, by their class (the runtime's own, which no function can define):
     * one thread dump, and one per thread while it has no kernel name yet (it was just started).
     */
    private static Map<Integer, String> truffleThreads() {
        ClassLoader loader;
        try {
            loader = Class.forName(TRUFFLE_QUEUE, false, CompilerSlot.class.getClassLoader()).getClassLoader();
        } catch (ClassNotFoundException | LinkageError e) {
            return Map.of(); // no optimizing Truffle runtime here
        }
        LOOKS.incrementAndGet();
        Map<Integer, String> found = new java.util.HashMap<>();
        for (Thread t : Thread.getAllStackTraces().keySet()) {
            if (!t.getClass().getName().equals(TRUFFLE_THREAD) || t.getClass().getClassLoader() != loader) continue;
            int tid = 0;
            for (int i = 0; i < NAME_TRIES && (tid = Runaways.tidOf(t)) <= 0 && t.isAlive(); i++) {
                try {
                    Thread.sleep(NAME_WAIT_MS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    break;
                }
            }
            if (tid > 0) found.put(tid, comm(tid));
        }
        if (found.isEmpty()) Log.warn("Truffle's compiler thread not found where the first polyglot context made it; it stays where it was made");
        return found;
    }

    private static String comm(int tid) {
        try {
            return Files.readString(Path.of("/proc/self/task/" + tid + "/comm")).strip();
        } catch (IOException e) {
            return "";
        }
    }

    /** The compiler threads' CPU: the live ones' as read now, the ended ones' as last read. */
    double cpuSeconds() {
        takeTruffle();
        for (var e : threads.entrySet()) {
            int tid = e.getKey();
            if (!e.getValue().equals(comm(tid))) { // ended (its id may be another thread's now)
                threads.remove(tid);
                continue;
            }
            try {
                String s = Files.readString(Path.of("/proc/self/task/" + tid + "/schedstat"));
                cpuNs.merge(tid, Long.parseLong(s.substring(0, s.indexOf(' '))), Math::max);
            } catch (IOException | RuntimeException ended) {
                threads.remove(tid);
            }
        }
        long sum = 0;
        for (long v : cpuNs.values()) sum += v;
        return sum / 1e9;
    }

    @Override
    public void close() {
        closed = true;
        OPEN.remove(this);
        if (holder != null) holder.interrupt();
    }
}
