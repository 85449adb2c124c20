package dev.cpuslot.slot;

import java.io.IOException;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Client of the cpuslot node agent (slot protocol v1, {@code api/slot/v1/SPEC.md}).
 *
 * <pre>{@code
 * SlotClient client = SlotClient.builder().socket("/run/cpuslot/agent.sock").build();
 * SlotLease lease = client.acquire(250, "guest/fib", activationId); // places the calling thread
 * try { ... run the invocation on this thread ... }
 * finally { Usage u = lease.release(ReleaseOutcome.OK); }
 * }</pre>
 *
 * <ul>
 * <li>A pool of connections, one request in flight per connection. A lease belongs to the
 *     connection that granted it (spec: "Lifetimes"): its RELEASE, SLEEP and WAKE go there,
 *     one-way beside any request in flight, and it is re-declared (RECLAIM) on another after
 *     that connection died. Local leasing keeps its HOLD leases on one hold connection, which
 *     the per-invocation path does not use.</li>
 * <li>Slot fds are cached by slot id and replaced (old ones closed once unused) whenever a
 *     response brings new ones. A slot's fds are HELLO_OK {@code place_fds} placement fds, then
 *     {@code stat_fds} read-only counter fds.</li>
 * <li>One round trip per invocation: after placing (or when already placed) the client reads
 *     the slot's counters; at release it reads them again, computes the usage itself and sends
 *     RELEASE with NO_REPLY (one write, no wait). Without counter fds, after a reconnect, or when
 *     the agent places threads, RELEASE waits for RELEASE_OK as before.</li>
 * <li>{@link #acquire} never takes longer than the acquire budget (connect, HELLO, waiting for a
 *     connection and the agent's answer all count; the remaining budget is sent as
 *     {@code wait_us}). A late answer is drained in the background and its lease released.</li>
 * <li>When a connection dies (agent restart) its held leases are re-declared with RECLAIM on a
 *     new connection, by a monitor thread or at release, whichever comes first.</li>
 * <li>Fail-open by default: no slot -> a lease with {@link SlotLease#active()} false and a reason,
 *     counted under {@code noslot.<reason>}; {@link Builder#failClosed} throws instead.</li>
 * <li>Lingering ({@link Builder#linger}, off by default): {@code release(OK)} keeps the agent's
 *     lease for the thread, and the thread's next {@code acquire} of the same action at the same
 *     quota reuses it without any message to the agent (spec: "Keeping a lease between
 *     invocations").</li>
 * </ul>
 * Must be called from platform threads: a virtual thread's kernel thread is its carrier's.
 *
 * <p>This class wires the parts together and warms them up: {@link SocketTransport} (framing,
 * the socket, fd passing), {@link FdCache} (slot fds by slot id), {@link Leases} (acquire,
 * release, lingering) and {@link Recovery} (re-declaring leases after a lost connection,
 * finishing timed-out requests).
 */
public final class SlotClient implements AutoCloseable {
    public static final String DEFAULT_SOCKET = "/run/cpuslot/agent.sock";

    // ---- configuration ----------------------------------------------------------------------

    public static final class Builder {
        private String socket = DEFAULT_SOCKET;
        private String clientName = "java";
        private int maxConnections = 8;
        private Duration acquireBudget = Duration.ofMillis(50);
        private Duration firstAcquireBudget = Duration.ZERO;
        private Duration releaseTimeout = Duration.ofSeconds(1);
        private Duration drainTimeout = Duration.ofSeconds(5);
        private Duration monitorInterval = Duration.ofMillis(250);
        private Duration reconnectBackoff = Duration.ofMillis(100);
        private boolean failClosed;
        private boolean fdPassing = true;
        private Duration linger = Duration.ZERO;
        private boolean local = true;
        private Duration localIdle = Duration.ofSeconds(30);
        private int localCapacity = 256;
        private java.util.concurrent.ThreadFactory threads = SlotClient::daemon;

        public Builder socket(String path) { this.socket = path; return this; }
        public Builder clientName(String name) { this.clientName = name; return this; }
        public Builder maxConnections(int n) { this.maxConnections = Math.max(1, n); return this; }
        /** Longest {@link #acquire} may block an invocation. */
        public Builder acquireBudget(Duration d) { this.acquireBudget = d; return this; }
        /**
         * Longest the acquisitions before the process's first grant may block (at least the acquire
         * budget; default: the acquire budget). A new container's first round trip to the agent runs
         * code no invocation ran yet; once any slot was granted, the acquire budget applies.
         */
        public Builder firstAcquireBudget(Duration d) { this.firstAcquireBudget = d == null || d.isNegative() ? Duration.ZERO : d; return this; }
        public Builder releaseTimeout(Duration d) { this.releaseTimeout = d; return this; }
        public Builder drainTimeout(Duration d) { this.drainTimeout = d; return this; }
        public Builder monitorInterval(Duration d) { this.monitorInterval = d; return this; }
        /** After a failed connect, acquires fail fast (no connect attempt) for this long. */
        public Builder reconnectBackoff(Duration d) { this.reconnectBackoff = d; return this; }
        /** Throw {@link SlotUnavailableException} instead of running without a slot. */
        public Builder failClosed(boolean b) { this.failClosed = b; return this; }
        /** Accept fds (default). When false, the agent is asked to place threads (AGENT_PLACES). */
        public Builder fdPassing(boolean b) { this.fdPassing = b; return this; }
        /**
         * Keep a lease for this long after an invocation that ended OK (and whose usage the client
         * measures from the slot's counter fds), so that the same thread's next invocation of the
         * same action at the same quota reuses it with no message to the agent. Quota enforcement
         * is unchanged (the thread never leaves the slot); an idle lingering lease still counts
         * against the container's admission budget until it expires, and the agent accounts one
         * lease for the invocations that reused it. A different action or quota on the thread
         * releases it first; {@link #close()} releases all. Zero (the default) releases at once.
         */
        public Builder linger(Duration d) { this.linger = d == null || d.isNegative() ? Duration.ZERO : d; return this; }
        /**
         * Local leasing (spec: "Local leasing"; on by default, used when the agent's HELLO_OK says
         * LOCAL): the process holds slots (HOLD leases) in its own slot table and leases them to
         * its threads itself, so an invocation sends nothing to the agent unless the process
         * holds no free slot of its quota. Off: one ACQUIRE per invocation (and lingering, if set).
         */
        public Builder local(boolean b) { this.local = b; return this; }
        /** Local leasing: a held slot unused this long is released to the agent (default 30 s). */
        public Builder localIdle(Duration d) { this.localIdle = d; return this; }
        /** Local leasing: most slots the process holds at once (table entries, 1..1024, default 256). */
        public Builder localCapacity(int n) { this.localCapacity = Math.max(1, Math.min(SlotTable.MAX_CAPACITY, n)); return this; }
        /**
         * Makes the client's threads (monitor, local upkeep, drains, and the one an acquire may
         * start to ask the agent for a slot), unstarted: the client names and starts them. A new
         * thread begins in its starter's CPU cgroup, and an acquire runs on the caller's thread,
         * which may sit in a slot: a process whose threads sit in slots gives a factory whose
         * threads start where none is placed. Default: daemon threads in a group of the client's.
         */
        public Builder threads(java.util.concurrent.ThreadFactory f) { this.threads = java.util.Objects.requireNonNull(f); return this; }
        public SlotClient build() { return new SlotClient(this); }
    }

    public static Builder builder() { return new Builder(); }

    /** The group of the client's threads, under the JVM's top group. */
    private static final ThreadGroup THREADS;
    static {
        ThreadGroup g = Thread.currentThread().getThreadGroup();
        while (g.getParent() != null) g = g.getParent();
        THREADS = new ThreadGroup(g, "cpuslot-slot-client");
    }

    /**
     * A daemon thread of the client's own (unstarted; the default {@link Builder#threads}),
     * wherever the thread that makes it runs: in no function worker's thread group (whose threads
     * end with each activation) and inheriting none of its thread locals.
     */
    static Thread daemon(Runnable task) {
        return Thread.ofPlatform().daemon().group(THREADS).inheritInheritableThreadLocals(false).unstarted(task);
    }

    private final String socket;
    private final long budgetNs;
    private final boolean failClosed;

    // the parts, one concept each (see their classes)
    private final Counters counters = new Counters();
    private final java.util.concurrent.atomic.LongAdder acquireCalls = counters.adder("acquire.calls");
    private final SocketTransport transport;
    private final FdCache fds;
    private final Recovery recovery;
    private final Leases leases;
    /** Local leasing, or null (off, or the table could not be made). */
    private final LocalLeases local;
    private volatile boolean closed;

    private SlotClient(Builder b) {
        socket = b.socket;
        budgetNs = b.acquireBudget.toNanos();
        failClosed = b.failClosed;
        transport = new SocketTransport(b.socket, b.clientName, b.maxConnections, b.reconnectBackoff.toNanos(), b.fdPassing, counters);
        fds = new FdCache(FdCache.NATIVE, counters);
        recovery = new Recovery(transport, fds, counters, b.releaseTimeout.toNanos(), b.drainTimeout.toNanos(),
                b.monitorInterval.toNanos());
        recovery.threads(b.threads);
        leases = new Leases(transport, fds, recovery, counters, budgetNs, b.releaseTimeout.toNanos(), b.linger.toNanos(),
                b.failClosed, b.fdPassing);
        leases.firstBudget(b.firstAcquireBudget.toNanos());
        LocalLeases loc = null;
        if (b.local && b.fdPassing && Native.available()) {
            try {
                loc = new LocalLeases(transport, fds, recovery, leases, counters, SlotTable.create(b.localCapacity), budgetNs,
                        b.releaseTimeout.toNanos(), b.localIdle.toNanos(), Math.min(b.monitorInterval.toNanos(), 250_000_000L),
                        b.failClosed);
            } catch (IOException | RuntimeException e) {
                counters.count("local.unavailable");
            }
        }
        local = loc;
        transport.local(local != null);
        transport.listener(local == null ? recovery : new Transport.Listener() {
            public void connected(Connection c) { recovery.connected(c); local.connected(c); }
            public void lost(Connection c) { recovery.lost(c); local.lost(c); }
        });
        if (Native.available()) {
            recovery.start();
            leases.start();
            if (local != null) local.start();
        }
    }

    /** True when local leasing is on (the agent may still refuse it: then acquire takes the old path). */
    public boolean local() { return local != null; }

    /** How long a lease lingers after an invocation (zero: off). */
    public Duration linger() { return Duration.ofNanos(leases.lingerNs()); }

    /** Number of lingering leases now. */
    public int parkedCount() { return leases.parkedCount(); }

    public String socket() { return socket; }
    public boolean failClosed() { return failClosed; }
    public Duration acquireBudget() { return Duration.ofNanos(budgetNs); }
    /** The last HELLO_OK seen (container identity, hierarchy, pools), or null. */
    public Protocol.HelloOk agentInfo() { return transport.lastHello(); }

    /**
     * Whether the agent has served this process: it answered a HELLO with HELLO_OK, which it
     * does once the container's pool is made. Stays true after a lost connection.
     */
    public boolean served() { return transport.lastHello() != null; }

    /** Why the last warm-up did not connect (the connect or HELLO error), or null. */
    public String lastWarmUpError() { return warmUpError; }

    /** Snapshot of all counters (name -> value), sorted by name. */
    public Map<String, Long> counters() { return counters.snapshot(); }

    public long counter(String name) { return counters.get(name); }

    /** Number of slots whose fds are cached. */
    public int cachedSlots() { return fds.size(); }

    /** Leases whose connection died and that are not yet reclaimed. */
    public int orphanCount() { return recovery.orphanCount(); }

    /**
     * Asks for a slot of quotaMilli millicores and places the calling thread in it. Returns within
     * the acquire budget. In fail-open mode never throws; the lease may be inactive.
     */
    public SlotLease acquire(long quotaMilli, String action, String invocationId) {
        return acquire(quotaMilli, action, invocationId, false);
    }

    /**
     * As {@link #acquire(long, String, String)}; {@code ownUsage}: the caller needs this
     * invocation's own usage from {@link SlotLease#release} or {@link SlotLease#stop}. Without
     * it, a slot from the process's table (local leasing) may return {@link Usage#NONE} at
     * release: its counters are read with the next invocations' of the same action on the same
     * slot, and their sum goes to the agent's USAGE (README "What an answer reports").
     */
    public SlotLease acquire(long quotaMilli, String action, String invocationId, boolean ownUsage) {
        if (local != null && !closed) {
            acquireCalls.increment();
            SlotLease l = local.acquire(quotaMilli, Leases.clip(action), Leases.clip(invocationId), ownUsage);
            if (l != null) return l;
            return leases.acquire(quotaMilli, action, invocationId, false);
        }
        return leases.acquire(quotaMilli, action, invocationId, true);
    }

    /**
     * Local leasing: {@code listener} gets the usage of each batch of warm invocations when its
     * counters are read (at a release, when the entry idled, was dropped or given back, when
     * another action or an invocation that wants its own usage claimed it), with
     * {@link Usage#invocations()} of them, unless a release returns it (an invocation alone in
     * its batch, read at its release). So releases and the listener see every invocation's
     * usage exactly once. Called on the slot client's background thread or an invoking thread; keep it short.
     * The action is as clipped for the agent.
     */
    public void onBatchRead(java.util.function.BiConsumer<String, Usage> listener) {
        if (local != null) local.batchRead = listener;
    }

    /**
     * Moves another thread of this process into the slot of an active lease that placed its own
     * thread (SELF): writes the thread's kernel tid to the slot's placement fds (the fds carry the
     * agent's credentials, so the kernel allows it for the process's own threads). For confining a
     * thread the runtime cannot stop: the lease's thread holds the slot for it. No message to the
     * agent. Returns null, or why it could not.
     */
    public String placeThread(SlotLease lease, int tid) { return leases.placeThread(lease, tid); }

    // ---- warm-up ----------------------------------------------------------------------------

    private final AtomicReference<CompletableFuture<Boolean>> warming = new AtomicReference<>();
    private volatile boolean codeWarmed;
    private volatile String warmUpError;

    /**
     * Gets the client ready for the next invocation, in the background: links and runs once the
     * FFM downcalls of the acquire/release path (on fd -1: no real fd is touched), loads and
     * links the protocol, counter and lease code, and opens a connection with HELLO (the slow
     * part of a first {@link #acquire}: tens of milliseconds in a fresh JVM, more than a typical
     * acquire budget). Nothing is acquired: no lease, no ACQUIRE. Call it when a function is
     * initialised (or at start). The future says whether a connection to the agent is open;
     * false (agent unreachable, client closed) changes nothing: acquire connects lazily as
     * before. A call while one is under way returns that one.
     */
    public CompletableFuture<Boolean> warmUp() {
        while (true) {
            CompletableFuture<Boolean> cur = warming.get();
            if (cur != null && !cur.isDone()) return cur;
            CompletableFuture<Boolean> f = new CompletableFuture<>();
            if (!warming.compareAndSet(cur, f)) continue;
            if (closed || !Native.available()) {
                f.complete(false);
                return f;
            }
            counters.count("warmup.calls");
            try {
                recovery.thread("cpuslot-warmup", () -> f.complete(warmUpNow()));
            } catch (RuntimeException | Error e) {
                f.complete(false);
            }
            return f;
        }
    }

    /**
     * {@link #warmUp()} and waits for it at most {@code wait}; true when a connection to the agent
     * is open. Never throws; the warm-up goes on in the background after the wait.
     */
    public boolean warmUp(Duration wait) {
        CompletableFuture<Boolean> f = warmUp();
        try {
            return f.get(Math.max(0, wait.toNanos()), TimeUnit.NANOSECONDS);
        } catch (TimeoutException | ExecutionException e) {
            return false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        }
    }

    /**
     * Prepares the calling thread for its first {@link #acquire}: its native scratch area and
     * its per-thread state. A runtime calls it when it starts a worker thread, before that
     * thread's first invocation, so that neither falls inside the acquire budget.
     */
    public void prepareThread() {
        if (!Native.available() || Thread.currentThread().isVirtual()) return;
        Native.prepareThread();
        leases.prepareThread();
        if (local != null) local.prepareThread();
        Native.gettid();
    }

    private boolean warmUpNow() {
        long waitNs = Math.max(budgetNs, 2_000_000_000L); // a HELLO is not an invocation: no budget for it
        try {
            if (!codeWarmed) {
                Native.warmUp();
                prepareThread();
                warmCode();
                codeWarmed = true;
            }
            Connection c = transport.borrow(System.nanoTime() + waitNs, false);
            transport.giveBack(c);
            warmUpError = null;
            counters.count("warmup.connected");
            return true;
        } catch (IOException e) {
            warmUpError = e.getMessage();
            counters.count("warmup.unreachable");
            return false;
        } catch (TimeoutException e) {
            warmUpError = "no connection to " + socket + " answered HELLO within " + waitNs / 1_000_000 + " ms";
            counters.count("warmup.unreachable");
            return false;
        } catch (RuntimeException e) {
            warmUpError = e.toString();
            counters.count("warmup.error");
            return false;
        }
    }

    /** Runs the acquire/release path's Java code once on throwaway values (no connection, no lease). */
    private void warmCode() {
        try {
            byte[][] frames = {
                    Protocol.encode(1, new Protocol.Acquire(1, 1, 1, 0, 0, "warmup", "warmup")),
                    Protocol.encode(1, new Protocol.Release(1, ReleaseOutcome.OK.code, Protocol.RELEASE_NO_REPLY)),
                    Protocol.encode(1, new Protocol.Release(1, ReleaseOutcome.TIMEOUT.code)),
                    Protocol.encode(1, new Protocol.Reclaim(1, 1, 1, "warmup", "warmup")),
                    Protocol.encode(1, new Protocol.AcquireOk(1, 1, 1, 100_000, Protocol.OUTCOME_CACHE_HIT, 0, Protocol.PLACE_SELF, 0)),
                    Protocol.encode(1, new Protocol.ReleaseOk(1, 1, 1, 1)),
                    Protocol.encode(1, new Protocol.Error(Protocol.E_NOT_READY, 1, "warmup")),
            };
            for (byte[] f : frames) {
                Protocol.Frame fr = Protocol.decodeFrame(f);
                Protocol.checkLength(f.length - 4);
                Protocol.typeName(fr.type());
                if (fr.message() instanceof Protocol.ReleaseOk ok) Usage.of(ok);
                if (fr.message() instanceof Protocol.Error e) Protocol.errorName(e.code());
            }
        } catch (Protocol.ProtocolException e) {
            counters.count("warmup.error");
        }
        SlotCounters a = SlotCounters.parse("nr_periods 1\nnr_throttled 0\nthrottled_time 0\n", "1\n");
        SlotCounters b = SlotCounters.parse("usage_usec 2\nnr_periods 2\nnr_throttled 1\nthrottled_usec 1\n", null);
        b.since(a).measured();
        FdCache.SlotFds sf = new FdCache.SlotFds(new int[0], 0);
        if (sf.retain()) fds.unref(sf);
        fds.unref(sf);
        leases.warmCode();
        if (local != null) local.warmCode();
    }

    /** Closes all connections (the agent releases their leases) and cached fds. */
    @Override
    public void close() {
        if (local != null) local.close(); // sends pending usage first
        leases.close(); // releases lingering leases first
        closed = true;
        recovery.close();
        transport.close();
        fds.close();
    }
}
