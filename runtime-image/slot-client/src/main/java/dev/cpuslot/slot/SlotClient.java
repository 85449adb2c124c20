package dev.cpuslot.slot;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

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
 * <li>A pool of connections, one request in flight per connection. Leases belong to the process
 *     (any connection may release them); the client remembers the connection that granted a
 *     lease to notice when it must be re-declared (RECLAIM) after that connection died.</li>
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
 */
public final class SlotClient implements AutoCloseable {
    public static final String DEFAULT_SOCKET = "/run/cpuslot/agent.sock";
    private static final byte[] ZERO = {'0'};
    /** The slot each thread placed itself in last (spec: current_slot), 0 = none/unknown. */
    private final ThreadLocal<long[]> currentSlot = ThreadLocal.withInitial(() -> new long[1]);

    // ---- configuration ----------------------------------------------------------------------

    public static final class Builder {
        private String socket = DEFAULT_SOCKET;
        private String clientName = "java";
        private int maxConnections = 8;
        private Duration acquireBudget = Duration.ofMillis(50);
        private Duration releaseTimeout = Duration.ofSeconds(1);
        private Duration drainTimeout = Duration.ofSeconds(5);
        private Duration monitorInterval = Duration.ofMillis(250);
        private Duration reconnectBackoff = Duration.ofMillis(100);
        private boolean failClosed;
        private boolean fdPassing = true;
        private Duration linger = Duration.ZERO;

        public Builder socket(String path) { this.socket = path; return this; }
        public Builder clientName(String name) { this.clientName = name; return this; }
        public Builder maxConnections(int n) { this.maxConnections = Math.max(1, n); return this; }
        /** Longest {@link #acquire} may block an invocation. */
        public Builder acquireBudget(Duration d) { this.acquireBudget = d; return this; }
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
        public SlotClient build() { return new SlotClient(this); }
    }

    public static Builder builder() { return new Builder(); }

    private final String socket, clientName;
    private final int maxConnections;
    private final long budgetNs, releaseNs, drainNs, monitorNs, backoffNs, lingerNs;
    private final boolean failClosed, fdPassing;

    // ---- state ------------------------------------------------------------------------------

    final class Conn {
        final long id = connIds.incrementAndGet();
        int fd = -1;
        boolean busy, alive = true;       // guarded by poolLock
        boolean agentPlaces;
        Protocol.HelloOk hello;
        long nextRequest = 1;              // used only while busy
        final Set<SlotLease> leases = ConcurrentHashMap.newKeySet();
        // partial read state (kept so a drainer can finish a frame a timed-out caller began)
        byte[] hdr = new byte[4];
        int hpos;
        byte[] body;
        int bpos;
        final List<Integer> fds = new ArrayList<>();
    }

    private static final class SlotFds {
        final int[] fds;
        /** fds[0..placeN) place a thread; fds[placeN..) are read-only counter fds. */
        final int placeN;
        final AtomicInteger refs = new AtomicInteger(1); // the cache's own reference
        SlotFds(int[] fds, int placeN) { this.fds = fds; this.placeN = placeN; }
        boolean retain() {
            for (;;) {
                int r = refs.get();
                if (r <= 0) return false;
                if (refs.compareAndSet(r, r + 1)) return true;
            }
        }
    }

    private final AtomicLong connIds = new AtomicLong();
    private final ReentrantLock poolLock = new ReentrantLock();
    private final Condition freed = poolLock.newCondition();
    private final List<Conn> conns = new ArrayList<>();
    private final Set<SlotLease> orphans = ConcurrentHashMap.newKeySet();
    private final Map<Long, SlotFds> fdCache = new ConcurrentHashMap<>();
    private final Map<String, LongAdder> counters = new ConcurrentHashMap<>();
    private volatile long downUntil;
    private volatile boolean closed, closing;
    private volatile Protocol.HelloOk lastHello;
    private final Thread monitor;
    /** Lingering leases by kernel thread id (at most one per thread). Removing one takes it over. */
    private final Map<Integer, SlotLease> parked = new ConcurrentHashMap<>();
    private final Thread expirer;

    private SlotClient(Builder b) {
        socket = b.socket;
        clientName = b.clientName;
        maxConnections = b.maxConnections;
        budgetNs = b.acquireBudget.toNanos();
        releaseNs = b.releaseTimeout.toNanos();
        drainNs = b.drainTimeout.toNanos();
        monitorNs = b.monitorInterval.toNanos();
        backoffNs = b.reconnectBackoff.toNanos();
        failClosed = b.failClosed;
        fdPassing = b.fdPassing;
        lingerNs = b.linger.toNanos();
        monitor = Thread.ofPlatform().daemon().name("cpuslot-monitor").unstarted(this::monitorLoop);
        if (Native.available()) monitor.start();
        expirer = lingerNs > 0 && Native.available()
                ? Thread.ofPlatform().daemon().name("cpuslot-linger").start(this::expireParked) : null;
    }

    /** How long a lease lingers after an invocation (zero: off). */
    public Duration linger() { return Duration.ofNanos(lingerNs); }

    /** Number of lingering leases now. */
    public int parkedCount() { return parked.size(); }

    public String socket() { return socket; }
    public boolean failClosed() { return failClosed; }
    public Duration acquireBudget() { return Duration.ofNanos(budgetNs); }
    /** The last HELLO_OK seen (container identity, hierarchy, pools), or null. */
    public Protocol.HelloOk agentInfo() { return lastHello; }

    /** Snapshot of all counters (name -> value), sorted by name. */
    public Map<String, Long> counters() {
        Map<String, Long> m = new TreeMap<>();
        counters.forEach((k, v) -> m.put(k, v.sum()));
        return m;
    }

    public long counter(String name) {
        LongAdder a = counters.get(name);
        return a == null ? 0 : a.sum();
    }

    private void count(String name) { counters.computeIfAbsent(name, k -> new LongAdder()).increment(); }

    static String outcomeName(int o) {
        return switch (o) {
            case Protocol.OUTCOME_AFFINITY_HIT -> "affinity_hit";
            case Protocol.OUTCOME_CACHE_HIT -> "cache_hit";
            case Protocol.OUTCOME_RETUNED -> "retuned";
            case Protocol.OUTCOME_CREATED -> "created";
            default -> "none";
        };
    }

    /** Counter names of the acquire path (own methods so that {@link #warmUp} links their string concatenation). */
    static String acquireCounter(int outcome) { return "acquire." + outcomeName(outcome); }
    static String placeCounter(int place) { return "place." + placeName(place); }

    static String placeName(int p) {
        return switch (p) {
            case Protocol.PLACE_NONE -> "none";
            case Protocol.PLACE_SELF -> "self";
            case Protocol.PLACE_DONE -> "done";
            default -> "unknown";
        };
    }

    // ---- warm-up ----------------------------------------------------------------------------

    private final AtomicReference<CompletableFuture<Boolean>> warming = new AtomicReference<>();
    private volatile boolean codeWarmed;

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
            count("warmup.calls");
            try {
                Thread.ofPlatform().daemon().name("cpuslot-warmup").start(() -> f.complete(warmUpNow()));
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
        currentSlot.get();
        Native.gettid();
    }

    private boolean warmUpNow() {
        try {
            if (!codeWarmed) {
                Native.warmUp();
                prepareThread();
                warmCode();
                codeWarmed = true;
            }
            Conn c = borrow(System.nanoTime() + Math.max(budgetNs, 2_000_000_000L), false);
            giveBack(c);
            count("warmup.connected");
            return true;
        } catch (IOException | TimeoutException e) {
            count("warmup.unreachable");
            return false;
        } catch (RuntimeException e) {
            count("warmup.error");
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
            count("warmup.error");
        }
        for (int o = 0; o <= Protocol.OUTCOME_CREATED; o++) acquireCounter(o);
        for (int p = 0; p <= Protocol.PLACE_DONE; p++) placeCounter(p);
        SlotCounters a = SlotCounters.parse("nr_periods 1\nnr_throttled 0\nthrottled_time 0\n", "1\n");
        SlotCounters b = SlotCounters.parse("usage_usec 2\nnr_periods 2\nnr_throttled 1\nthrottled_usec 1\n", null);
        b.since(a).measured();
        SlotFds sf = new SlotFds(new int[0], 0);
        if (sf.retain()) unref(sf);
        unref(sf);
        SlotLease l = new SlotLease(this, "warmup", "warmup", 1, -1, "warmup"); // inactive: no lease
        l.stop();
        l.release(ReleaseOutcome.OK);
        l.toString();
        clip("warmup");
        parked.get(-1);
    }

    // ---- acquire ----------------------------------------------------------------------------

    /**
     * Asks for a slot of quotaMilli millicores and places the calling thread in it. Returns within
     * the acquire budget. In fail-open mode never throws; the lease may be inactive.
     */
    public SlotLease acquire(long quotaMilli, String action, String invocationId) {
        count("acquire.calls");
        String act = clip(action), inv = clip(invocationId);
        if (closed) return noSlot(act, inv, quotaMilli, -1, "closed", null);
        if (!Native.available()) return noSlot(act, inv, quotaMilli, -1, "unavailable", String.valueOf(Native.loadError()));
        if (Thread.currentThread().isVirtual()) return noSlot(act, inv, quotaMilli, -1, "virtual_thread", null);
        if (quotaMilli <= 0 || quotaMilli > 0xFFFFFFFFL) return noSlot(act, inv, quotaMilli, -1, "invalid_quota", "quota " + quotaMilli);
        int tid = Native.gettid();
        SlotLease p = parked.remove(tid);
        if (p != null) {
            SlotLease again = reuse(p, quotaMilli, act, inv);
            if (again != null) return again;
            count("linger.ended");
            releaseParked(p); // another action or quota (or stale): end it first
        }
        long deadline = System.nanoTime() + budgetNs;
        String reason = "budget", detail = null;
        while (true) {
            Conn c;
            try {
                c = borrow(deadline);
            } catch (TimeoutException e) {
                return noSlot(act, inv, quotaMilli, tid, reason, "no connection within budget");
            } catch (IOException e) {
                return noSlot(act, inv, quotaMilli, tid, "unreachable", e.getMessage());
            }
            long remUs = (deadline - System.nanoTime()) / 1000;
            if (remUs <= 0) {
                giveBack(c);
                return noSlot(act, inv, quotaMilli, tid, "budget", null);
            }
            int flags = (c.agentPlaces || !fdPassing) ? Protocol.ACQUIRE_AGENT_PLACES : 0;
            // leave a little of the budget for the answer to travel back
            long waitUs = Math.max(1, remUs - Math.min(1000, remUs / 10));
            Protocol.Frame r;
            int[] fds;
            try {
                r = call(c, new Protocol.Acquire(quotaMilli, waitUs, tid & 0xFFFFFFFFL, flags, currentSlot.get()[0], act, inv),
                        deadline);
                fds = takeFds(c);
            } catch (TimeoutException e) {
                drain(c);
                return noSlot(act, inv, quotaMilli, tid, "budget", "no answer within budget");
            } catch (IOException | Protocol.ProtocolException e) {
                kill(c, e.getMessage());
                reason = "unreachable";
                detail = e.getMessage();
                if (System.nanoTime() < deadline) continue;
                return noSlot(act, inv, quotaMilli, tid, reason, detail);
            }
            if (r.message() instanceof Protocol.AcquireOk ok) {
                SlotLease l = new SlotLease(this, act, inv, quotaMilli, tid, null);
                l.conn = c;
                l.lease = ok.lease();
                l.slot = ok.slot();
                l.quotaMilli = ok.quotaMilli();
                l.periodUs = ok.periodUs();
                l.outcome = ok.outcome();
                l.flags = ok.flags();
                l.place = ok.place();
                c.leases.add(l);
                giveBack(c);
                count(acquireCounter(ok.outcome()));
                if (l.queued()) count("acquire.queued");
                if (l.degraded()) count("acquire.degraded");
                if (fds.length != ok.nfds()) {
                    closeAll(fds);
                    currentSlot.get()[0] = 0;
                    count("place.failed");
                    release(l, ReleaseOutcome.PLACEMENT_FAILED);
                    return noSlot(act, inv, quotaMilli, tid, "fd_mismatch", "nfds " + ok.nfds() + " but " + fds.length + " fds");
                }
                if (fds.length > 0) cacheFds(ok.slot(), fds, c.hello);
                if (ok.place() == Protocol.PLACE_SELF) {
                    String err = placeSelf(ok.slot());
                    if (err != null) {
                        currentSlot.get()[0] = 0;
                        count("place.failed");
                        release(l, ReleaseOutcome.PLACEMENT_FAILED);
                        return noSlot(act, inv, quotaMilli, tid, "placement_failed", err);
                    }
                }
                currentSlot.get()[0] = ok.slot();
                count(placeCounter(ok.place()));
                // the thread sits in the slot now: read its counters so release needs no reply
                if (ok.place() != Protocol.PLACE_DONE) l.start = readCounters(ok.slot());
                return l;
            }
            if (r.message() instanceof Protocol.Error e) {
                switch (e.code()) {
                    case Protocol.E_SHUTTING_DOWN, Protocol.E_BAD_REQUEST, Protocol.E_UNSUPPORTED_VERSION -> kill(c, e.message());
                    default -> giveBack(c);
                }
                reason = Protocol.errorName(e.code());
                detail = e.message();
                boolean retry = switch (e.code()) {
                    case Protocol.E_NOT_READY -> sleepUntil(Math.min(deadline,
                            System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(1, e.retryAfterMs()))), deadline);
                    case Protocol.E_INTERNAL, Protocol.E_SHUTTING_DOWN -> System.nanoTime() < deadline;
                    default -> false;
                };
                if (retry) continue;
                return noSlot(act, inv, quotaMilli, tid, reason, detail);
            }
            kill(c, "unexpected " + Protocol.typeName(r.type()));
            return noSlot(act, inv, quotaMilli, tid, "protocol", "unexpected " + Protocol.typeName(r.type()));
        }
    }

    /** Sleeps until {@code until}; returns true when there is budget left afterwards. */
    private static boolean sleepUntil(long until, long deadline) {
        long ns = until - System.nanoTime();
        if (ns > 0) {
            try {
                TimeUnit.NANOSECONDS.sleep(ns);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                return false;
            }
        }
        return System.nanoTime() < deadline;
    }

    private SlotLease noSlot(String act, String inv, long quota, int tid, String reason, String detail) {
        count("noslot." + reason);
        if (failClosed) throw new SlotUnavailableException(reason, detail);
        return new SlotLease(this, act, inv, quota, tid, reason);
    }

    /** Writes "0" to each placement fd of the slot. Returns null or an error message. */
    private String placeSelf(long slot) { return placeBytes(slot, ZERO); }

    /**
     * Moves another thread of this process into the slot of an active lease that placed its own
     * thread (SELF): writes the thread's kernel tid to the slot's placement fds (the fds carry the
     * agent's credentials, so the kernel allows it for the process's own threads). For confining a
     * thread the runtime cannot stop: the lease's thread holds the slot for it. No message to the
     * agent. Returns null, or why it could not.
     */
    public String placeThread(SlotLease lease, int tid) {
        if (lease == null || !lease.active()) return "no active lease";
        if (tid <= 0) return "no tid";
        return placeBytes(lease.slot(), Integer.toString(tid).getBytes(java.nio.charset.StandardCharsets.US_ASCII));
    }

    private String placeBytes(long slot, byte[] what) {
        for (int attempt = 0; attempt < 2; attempt++) {
            SlotFds sf = fdCache.get(slot);
            if (sf == null) return "no fds cached for slot " + slot;
            if (!sf.retain()) continue; // replaced and closed meanwhile: look again
            try {
                if (sf.placeN == 0) return "no placement fd for slot " + slot;
                for (int i = 0; i < sf.placeN; i++) {
                    long n = Native.write(sf.fds[i], what);
                    if (n != what.length) return "short write to slot fd";
                }
                return null;
            } catch (IOException e) {
                return e.getMessage();
            } finally {
                unref(sf);
            }
        }
        return "slot fds replaced while placing";
    }

    /**
     * Reads the slot's counters from its cached counter fds; null when there are none (an agent
     * that passes placement fds only) or the read failed (counted).
     */
    private SlotCounters readCounters(long slot) {
        for (int attempt = 0; attempt < 2; attempt++) {
            SlotFds sf = fdCache.get(slot);
            if (sf == null || sf.placeN >= sf.fds.length) return null;
            if (!sf.retain()) continue;
            try {
                int stat = sf.fds[sf.placeN];
                int acct = sf.fds.length > sf.placeN + 1 ? sf.fds[sf.placeN + 1] : -1;
                return SlotCounters.read(stat, acct);
            } catch (IOException e) {
                count("counters.failed");
                return null;
            } finally {
                unref(sf);
            }
        }
        return null;
    }

    /** Caches a slot's fds, split as the agent's HELLO_OK announced (all placement fds if it did not). */
    private void cacheFds(long slot, int[] fds, Protocol.HelloOk hello) {
        count("fds.received");
        int p = hello == null ? 0 : hello.placeFds(), st = hello == null ? 0 : hello.statFds();
        int placeN = p > 0 && fds.length == p + st ? p : fds.length;
        SlotFds old = fdCache.put(slot, new SlotFds(fds, placeN));
        if (old != null) {
            count("fds.replaced");
            unref(old);
        }
    }

    private void unref(SlotFds sf) {
        if (sf.refs.decrementAndGet() == 0) closeAll(sf.fds);
    }

    private static void closeAll(int[] fds) {
        for (int fd : fds) Native.close(fd);
    }

    /** Number of slots whose fds are cached. */
    public int cachedSlots() { return fdCache.size(); }

    // ---- release & reclaim ------------------------------------------------------------------

    Usage release(SlotLease l, ReleaseOutcome outcome) {
        l.lock.lock();
        try {
            if (l.released || l.parked) return Usage.NONE;
            if (lingerNs > 0 && outcome == ReleaseOutcome.OK) {
                Usage u = parkLocked(l);
                if (u != null) return u;
            }
            return releaseLocked(l, outcome);
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * Keeps the lease for its thread's next invocation: measures this invocation's usage from the
     * counters (the reading of {@link SlotLease#stop()} if there was one) and starts the next
     * invocation's from the same reading. Null when the lease cannot linger (no counter fds, its
     * connection died, the client is closing). Caller holds l.lock.
     */
    private Usage parkLocked(SlotLease l) {
        if (closing || l.start == null || l.lost || l.conn == null || !isAlive(l.conn)) return null;
        SlotCounters end = l.end != null ? l.end : readCounters(l.slot);
        if (end == null) return null;
        Usage u = end.since(l.start);
        l.start = end;
        l.end = null;
        l.parked = true;
        l.parkedAt = System.nanoTime();
        SlotLease old = parked.put(l.tid, l);
        count("linger.parked");
        if (old != null && old != l) releaseParked(old); // cannot happen: acquire took it over
        return u;
    }

    /**
     * The thread's lingering lease for this invocation, as a new handle, or null when it does not
     * fit (another quota or action, degraded, its connection died or was re-declared since, or
     * another thread with a reused tid). The caller removed p from {@link #parked}.
     */
    private SlotLease reuse(SlotLease p, long quotaMilli, String action, String invocation) {
        p.lock.lock();
        try {
            if (p.released || !p.parked || p.lost || p.start == null || p.degraded() || p.quotaMilli != quotaMilli
                    || !p.action.equals(action) || p.thread != Thread.currentThread() || p.conn == null || !isAlive(p.conn))
                return null;
            SlotLease h = new SlotLease(this, action, invocation, quotaMilli, p.tid, null);
            h.conn = p.conn;
            h.lease = p.lease;
            h.slot = p.slot;
            h.quotaMilli = p.quotaMilli;
            h.periodUs = p.periodUs;
            h.outcome = Protocol.OUTCOME_AFFINITY_HIT;
            h.place = Protocol.PLACE_NONE;
            h.flags = p.flags & ~Protocol.ACQ_FLAG_QUEUED;
            h.start = p.start;
            h.reused = true;
            p.parked = false;
            p.released = true; // the old handle is spent; h holds the agent's lease now
            p.conn.leases.add(h);
            p.conn.leases.remove(p);
            count("linger.reused");
            return h;
        } finally {
            p.lock.unlock();
        }
    }

    /** Tells the agent a lingering lease is over (one-way when possible). */
    private void releaseParked(SlotLease p) {
        p.lock.lock();
        try {
            if (p.released || !p.parked) return;
            p.parked = false;
            releaseLocked(p, ReleaseOutcome.OK);
        } finally {
            p.lock.unlock();
        }
    }

    /** Releases lingering leases idle for longer than the linger time. */
    private void expireParked() {
        long tick = Math.max(lingerNs / 2, 1_000_000L);
        while (!closing) {
            LockSupportSleep.parkNanos(tick);
            try {
                long now = System.nanoTime();
                for (Map.Entry<Integer, SlotLease> e : parked.entrySet()) {
                    SlotLease l = e.getValue();
                    if (now - l.parkedAt >= lingerNs && parked.remove(e.getKey(), l)) {
                        count("linger.expired");
                        releaseParked(l);
                    }
                }
            } catch (RuntimeException e) {
                count("linger.error");
            }
        }
    }

    /** Caller holds l.lock; l is not released. */
    private Usage releaseLocked(SlotLease l, ReleaseOutcome outcome) {
        l.released = true;
        orphans.remove(l);
        if (l.start != null && outcome != ReleaseOutcome.PLACEMENT_FAILED) {
            Usage u = releaseOneWay(l, outcome);
            if (u != null) return u;
        }
        long deadline = System.nanoTime() + releaseNs;
        for (int attempt = 0; attempt < 3; attempt++) {
            if (l.lost) {
                count("release.lost");
                return Usage.NONE;
            }
            Conn c = l.conn;
            if (c == null || !isAlive(c)) {
                if (!reclaimLocked(l, deadline)) {
                    count(l.lost ? "release.lost" : "release.unreachable");
                    return Usage.NONE;
                }
                c = l.conn;
            }
            try {
                borrowSpecific(c, deadline);
            } catch (TimeoutException e) {
                count("release.timeout");
                return Usage.NONE;
            } catch (IOException e) {
                continue; // died meanwhile: reclaim on a new connection
            }
            Protocol.Frame r;
            try {
                r = call(c, new Protocol.Release(l.lease, outcome.code), deadline);
                closeAll(takeFds(c));
            } catch (TimeoutException e) {
                c.leases.remove(l);
                drain(c);
                count("release.timeout");
                return Usage.NONE;
            } catch (IOException | Protocol.ProtocolException e) {
                kill(c, e.getMessage());
                continue;
            }
            c.leases.remove(l);
            giveBack(c);
            if (r.message() instanceof Protocol.ReleaseOk ok) {
                count("release.ok");
                return Usage.of(ok);
            }
            if (r.message() instanceof Protocol.Error e) {
                count("release." + Protocol.errorName(e.code()));
                return Usage.NONE;
            }
            count("release.protocol");
            return Usage.NONE;
        }
        count("release.unreachable");
        return Usage.NONE;
    }

    Usage stop(SlotLease l) {
        l.lock.lock();
        try {
            if (l.released || l.parked || l.start == null || l.end != null || l.conn == null || !isAlive(l.conn)) return Usage.NONE;
            SlotCounters end = readCounters(l.slot);
            if (end == null) return Usage.NONE;
            l.end = end;
            return end.since(l.start);
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * Reads the slot's counters and sends RELEASE with NO_REPLY on any idle connection (leases
     * belong to the process; an ACQUIRE from this thread that overtakes the RELEASE on another
     * connection ends the lease anyway). Null when the caller must release with a reply: the
     * lease's connection died (re-declaration needed), no counters, or no connection at once.
     * Caller holds l.lock.
     */
    private Usage releaseOneWay(SlotLease l, ReleaseOutcome outcome) {
        Conn owner = l.conn;
        if (owner == null || !isAlive(owner)) return null;
        SlotCounters end = l.end != null ? l.end : readCounters(l.slot);
        if (end == null) return null;
        long deadline = System.nanoTime() + releaseNs;
        Conn c;
        try {
            c = borrow(deadline);
        } catch (IOException | TimeoutException e) {
            return null;
        }
        try {
            send(c, new Protocol.Release(l.lease, outcome.code, Protocol.RELEASE_NO_REPLY), deadline);
        } catch (TimeoutException e) {
            giveBack(c); // nothing was written
            return null;
        } catch (IOException e) {
            kill(c, e.getMessage());
            return null;
        }
        giveBack(c);
        owner.leases.remove(l);
        count("release.oneway");
        return end.since(l.start);
    }

    /** RECLAIM of a lease whose connection died. Caller holds l.lock. True when re-held. */
    private boolean reclaimLocked(SlotLease l, long deadline) {
        if (l.lost) return false;
        Conn c;
        try {
            c = borrow(deadline);
        } catch (IOException | TimeoutException e) {
            return false;
        }
        Protocol.Frame r;
        int[] fds;
        try {
            r = call(c, new Protocol.Reclaim(l.slot, l.quotaMilli, l.tid & 0xFFFFFFFFL, l.action, l.invocation), deadline);
            fds = takeFds(c);
        } catch (TimeoutException e) {
            drain(c);
            return false;
        } catch (IOException | Protocol.ProtocolException e) {
            kill(c, e.getMessage());
            return false;
        }
        if (r.message() instanceof Protocol.AcquireOk ok) {
            if (fds.length > 0) cacheFds(ok.slot(), fds, c.hello);
            l.conn = c;
            l.lease = ok.lease();
            l.start = null; // reconnected: the release waits for the agent's own usage
            c.leases.add(l);
            giveBack(c);
            orphans.remove(l);
            count("reclaim.ok");
            return true;
        }
        closeAll(fds);
        giveBack(c);
        if (r.message() instanceof Protocol.Error e && e.code() == Protocol.E_UNKNOWN_LEASE) {
            l.lost = true;
            orphans.remove(l);
            count("reclaim.lost");
            return false;
        }
        count("reclaim.error");
        return false;
    }

    /** Leases whose connection died and that are not yet reclaimed. */
    public int orphanCount() { return orphans.size(); }

    // ---- connections ------------------------------------------------------------------------

    private boolean isAlive(Conn c) {
        poolLock.lock();
        try {
            return c.alive;
        } finally {
            poolLock.unlock();
        }
    }

    private Conn borrow(long deadline) throws IOException, TimeoutException { return borrow(deadline, true); }

    /** backoff false: a failed connect does not make the next acquires back off (warm-up). */
    private Conn borrow(long deadline, boolean backoff) throws IOException, TimeoutException {
        Conn fresh = null;
        poolLock.lock();
        try {
            while (fresh == null) {
                if (closed) throw new IOException("client closed");
                for (Conn c : conns) {
                    if (c.alive && !c.busy && c.hello != null) {
                        c.busy = true;
                        return c;
                    }
                }
                if (conns.size() < maxConnections) {
                    if (System.nanoTime() < downUntil) {
                        count("connect.backoff");
                        throw new IOException("agent unreachable (backing off)");
                    }
                    fresh = new Conn();
                    fresh.busy = true;
                    conns.add(fresh);
                    break;
                }
                long rem = deadline - System.nanoTime();
                if (rem <= 0) throw new TimeoutException();
                try {
                    freed.awaitNanos(rem);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new TimeoutException();
                }
            }
        } finally {
            poolLock.unlock();
        }
        try {
            open(fresh, deadline);
            return fresh;
        } catch (IOException | TimeoutException | Protocol.ProtocolException e) {
            Native.close(fresh.fd);
            poolLock.lock();
            try {
                fresh.alive = false;
                conns.remove(fresh);
                freed.signalAll();
            } finally {
                poolLock.unlock();
            }
            if (!(e instanceof TimeoutException)) {
                if (backoff) downUntil = System.nanoTime() + backoffNs;
                count("connect.failed");
            }
            if (e instanceof TimeoutException te) throw te;
            if (e instanceof IOException io) throw io;
            throw new IOException(e.getMessage(), e);
        }
    }

    private void borrowSpecific(Conn c, long deadline) throws IOException, TimeoutException {
        poolLock.lock();
        try {
            while (c.alive && c.busy) {
                long rem = deadline - System.nanoTime();
                if (rem <= 0) throw new TimeoutException();
                try {
                    freed.awaitNanos(rem);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new TimeoutException();
                }
            }
            if (!c.alive) throw new IOException("connection closed");
            c.busy = true;
        } finally {
            poolLock.unlock();
        }
    }

    private void giveBack(Conn c) {
        poolLock.lock();
        try {
            c.busy = false;
            freed.signalAll();
        } finally {
            poolLock.unlock();
        }
    }

    /** Closes a broken connection; its held leases become orphans to reclaim. */
    private void kill(Conn c, String why) {
        poolLock.lock();
        try {
            if (!c.alive) return;
            c.alive = false;
            c.busy = false;
            conns.remove(c);
            freed.signalAll();
        } finally {
            poolLock.unlock();
        }
        count("connection.lost");
        Native.close(c.fd);
        closeAll(takeFds(c));
        for (SlotLease l : c.leases) {
            if (!l.released) orphans.add(l);
        }
        c.leases.clear();
    }

    private void open(Conn c, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        c.fd = Native.socket();
        while (true) {
            int r = Native.connect(c.fd, socket);
            if (r == 0) break;
            if (System.nanoTime() >= deadline) throw new TimeoutException();
            // AF_UNIX answers EAGAIN when the listener's backlog is full: wait a little and retry
            LockSupportSleep.sleepMicros(200);
        }
        Protocol.Frame f = call(c, new Protocol.Hello(1, 1, fdPassing ? Protocol.HELLO_FD_PASSING : 0, clientName), deadline);
        closeAll(takeFds(c));
        if (f.message() instanceof Protocol.HelloOk ok) {
            if (ok.version() != 1) throw new IOException("agent chose version " + ok.version());
            c.hello = ok;
            c.agentPlaces = (ok.flags() & Protocol.HELLO_OK_AGENT_PLACES) != 0;
            lastHello = ok;
            count("connect.ok");
            if (!orphans.isEmpty()) LockSupportSleep.unpark(monitor);
            return;
        }
        if (f.message() instanceof Protocol.Error e) {
            count("hello." + Protocol.errorName(e.code()));
            throw new IOException("HELLO refused: " + Protocol.errorName(e.code()) + " " + e.message());
        }
        throw new IOException("HELLO answered with " + Protocol.typeName(f.type()));
    }

    /** One request, one response. Caller holds the connection (busy). */
    private Protocol.Frame call(Conn c, Protocol.Message m, long deadline)
            throws IOException, TimeoutException, Protocol.ProtocolException {
        long req = send(c, m, deadline);
        // wait for the answer before the first recvmsg (saves a recvmsg that would say EAGAIN)
        if (c.hpos == 0 && c.body == null && waitFor(c.fd, Native.POLLIN, deadline) == 0) throw new TimeoutException();
        Protocol.Frame r = readFrame(c, deadline);
        if (r.request() != req)
            throw new Protocol.ProtocolException(Protocol.E_BAD_REQUEST, "answer to request " + r.request() + ", expected " + req);
        return r;
    }

    /**
     * Writes one request; returns its request id. TimeoutException only when nothing was written
     * (the connection stays usable); a partial write is an IOException. Caller holds c (busy).
     */
    private long send(Conn c, Protocol.Message m, long deadline) throws IOException, TimeoutException {
        long req = c.nextRequest++;
        if (c.nextRequest > 0xFFFFFFFFL) c.nextRequest = 1;
        byte[] f = Protocol.encode(req, m);
        int off = 0;
        while (off < f.length) {
            long n = Native.send(c.fd, f, off, f.length - off, null);
            if (n > 0) {
                off += (int) n;
                continue;
            }
            if (waitFor(c.fd, Native.POLLOUT, deadline) == 0) {
                if (off > 0) throw new IOException("timed out in the middle of a request");
                throw new TimeoutException();
            }
        }
        return req;
    }

    private static int waitFor(int fd, short events, long deadline) throws IOException {
        while (true) {
            long rem = deadline - System.nanoTime();
            if (rem <= 0) return 0;
            int ms = (int) Math.min(Integer.MAX_VALUE, Math.max(1, (rem + 999_999) / 1_000_000));
            int ev = Native.poll(fd, events, ms);
            if (ev != 0) return ev;
        }
    }

    /** Reads one frame, resuming a partial one. Fds received are kept in c.fds. */
    private Protocol.Frame readFrame(Conn c, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        while (c.hpos < 4) c.hpos += recvSome(c, c.hdr, c.hpos, 4 - c.hpos, deadline);
        if (c.body == null) {
            long len = ((c.hdr[0] & 0xFFL) << 24) | ((c.hdr[1] & 0xFF) << 16) | ((c.hdr[2] & 0xFF) << 8) | (c.hdr[3] & 0xFF);
            c.body = new byte[Protocol.checkLength(len)];
            c.bpos = 0;
        }
        while (c.bpos < c.body.length) c.bpos += recvSome(c, c.body, c.bpos, c.body.length - c.bpos, deadline);
        byte[] body = c.body;
        c.body = null;
        c.hpos = 0;
        return Protocol.decodeBody(body);
    }

    private int recvSome(Conn c, byte[] buf, int off, int len, long deadline) throws IOException, TimeoutException {
        while (true) {
            Native.Received r = Native.recv(c.fd, buf, off, len);
            for (int fd : r.fds()) c.fds.add(fd);
            if (r.truncated()) count("fds.truncated");
            if (r.n() > 0) return r.n();
            if (r.n() == 0) throw new IOException("agent closed the connection");
            int ev = waitFor(c.fd, Native.POLLIN, deadline);
            if (ev == 0) throw new TimeoutException();
        }
    }

    private static int[] takeFds(Conn c) {
        int[] a = new int[c.fds.size()];
        for (int i = 0; i < a.length; i++) a[i] = c.fds.get(i);
        c.fds.clear();
        return a;
    }

    /** A request timed out: finish reading its answer in the background, undo a late lease. */
    private void drain(Conn c) {
        count("drain");
        Thread.ofPlatform().daemon().name("cpuslot-drain-" + c.id).start(() -> {
            long dl = System.nanoTime() + drainNs;
            try {
                Protocol.Frame r = readFrame(c, dl);
                int[] fds = takeFds(c);
                if (r.message() instanceof Protocol.AcquireOk ok) {
                    if (fds.length > 0) cacheFds(ok.slot(), fds, c.hello);
                    count("drain.released");
                    call(c, new Protocol.Release(ok.lease(), ReleaseOutcome.TIMEOUT.code), dl);
                } else {
                    closeAll(fds);
                }
                closeAll(takeFds(c));
                giveBack(c);
            } catch (Exception e) {
                kill(c, "drain: " + e.getMessage());
            }
        });
    }

    // ---- monitor ----------------------------------------------------------------------------

    private void monitorLoop() {
        while (!closed) {
            LockSupportSleep.parkNanos(monitorNs);
            if (closed) return;
            try {
                // idle connections must be silent: readable or hung up means the agent went away
                List<Conn> idle = new ArrayList<>();
                poolLock.lock();
                try {
                    for (Conn c : conns) {
                        if (c.alive && !c.busy && c.hello != null) {
                            c.busy = true;
                            idle.add(c);
                        }
                    }
                } finally {
                    poolLock.unlock();
                }
                for (Conn c : idle) {
                    int ev = 0;
                    try {
                        ev = Native.poll(c.fd, Native.POLLIN, 0);
                    } catch (IOException e) {
                        ev = Native.POLLERR;
                    }
                    if (ev != 0) {
                        kill(c, "agent went away");
                    } else {
                        giveBack(c);
                    }
                }
                for (SlotLease l : orphans) {
                    if (!l.lock.tryLock()) continue;
                    try {
                        if (l.released || l.lost) { // a lingering (parked) lease is re-declared too
                            orphans.remove(l);
                        } else if (l.conn == null || !isAlive(l.conn)) {
                            if (!reclaimLocked(l, System.nanoTime() + releaseNs)) {
                                if (!l.lost) break; // agent still away: try again next round
                            }
                        } else {
                            orphans.remove(l);
                        }
                    } finally {
                        l.lock.unlock();
                    }
                }
            } catch (RuntimeException e) {
                count("monitor.error");
            }
        }
    }

    /** Closes all connections (the agent releases their leases) and cached fds. */
    @Override
    public void close() {
        closing = true; // no new lingering leases
        if (expirer != null) LockSupportSleep.unpark(expirer);
        for (Integer tid : List.copyOf(parked.keySet())) {
            SlotLease l = parked.remove(tid);
            if (l != null) {
                count("linger.closed");
                releaseParked(l);
            }
        }
        closed = true;
        LockSupportSleep.unpark(monitor);
        List<Conn> all;
        poolLock.lock();
        try {
            all = new ArrayList<>(conns);
            conns.clear();
            for (Conn c : all) c.alive = false;
            freed.signalAll();
        } finally {
            poolLock.unlock();
        }
        for (Conn c : all) Native.close(c.fd);
        for (SlotFds sf : fdCache.values()) unref(sf);
        fdCache.clear();
    }

    /** Clips a string to the protocol's 1024 UTF-8 bytes without splitting a character. */
    static String clip(String s) {
        if (s == null) return "";
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        if (b.length <= Protocol.MAX_STRING) return s;
        int n = Protocol.MAX_STRING;
        while (n > 0 && (b[n] & 0xC0) == 0x80) n--;
        return new String(b, 0, n, StandardCharsets.UTF_8);
    }

    private static final class LockSupportSleep {
        static void sleepMicros(long us) { java.util.concurrent.locks.LockSupport.parkNanos(us * 1000); }
        static void parkNanos(long ns) { java.util.concurrent.locks.LockSupport.parkNanos(ns); }
        static void unpark(Thread t) { java.util.concurrent.locks.LockSupport.unpark(t); }
    }
}
