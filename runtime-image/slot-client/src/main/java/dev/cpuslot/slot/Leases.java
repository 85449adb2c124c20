package dev.cpuslot.slot;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.LockSupport;

/**
 * Acquire and release: one round trip per invocation at most, and with lingering none. The
 * thread places itself through the slot's cached fds and the client measures usage from the
 * slot's counter fds, so a RELEASE needs no reply; a lingering lease stays with its thread for
 * the next invocation of the same action at the same quota.
 */
final class Leases {
    private static final byte[] ZERO = {'0'};

    private final Transport transport;
    private final FdCache fds;
    private final Recovery recovery;
    private final Counters counters;
    private final long budgetNs, releaseNs, lingerNs;
    private final boolean failClosed, fdPassing;
    /** The slot each thread placed itself in last (spec: current_slot), 0 = none/unknown. */
    private final ThreadLocal<long[]> currentSlot = ThreadLocal.withInitial(() -> new long[1]);
    /** Lingering leases by kernel thread id (at most one per thread). Removing one takes it over. */
    private final Map<Integer, SlotLease> parked = new ConcurrentHashMap<>();
    private volatile Thread expirer;
    private volatile boolean closing, closed;
    /**
     * The budget of acquisitions before the process's first grant (0: the normal one): the first
     * round trip of a new container runs code no invocation ran yet, which on a loaded node takes
     * longer than a warm one. Once any ACQUIRE was granted, every acquisition has the normal budget.
     */
    private volatile long firstBudgetNs;
    private volatile boolean grantedOnce;

    Leases(Transport transport, FdCache fds, Recovery recovery, Counters counters,
           long budgetNs, long releaseNs, long lingerNs, boolean failClosed, boolean fdPassing) {
        this.transport = transport;
        this.fds = fds;
        this.recovery = recovery;
        this.counters = counters;
        this.budgetNs = budgetNs;
        this.releaseNs = releaseNs;
        this.lingerNs = lingerNs;
        this.failClosed = failClosed;
        this.fdPassing = fdPassing;
    }

    long lingerNs() { return lingerNs; }

    /** Sets the budget of the acquisitions before the first grant (see {@link #firstBudgetNs}). */
    void firstBudget(long ns) { firstBudgetNs = ns; }

    /** The budget of an acquisition starting now whose normal budget is b. */
    long budget(long b) { return grantedOnce ? b : coldBudget(b); }

    /** The budget of a cold round trip (normal budget b): the first-acquire one, when longer. */
    long coldBudget(long b) { return Math.max(b, firstBudgetNs); }
    int parkedCount() { return parked.size(); }

    private void count(String name) { counters.count(name); }

    // ---- names ------------------------------------------------------------------------------

    static String outcomeName(int o) {
        return switch (o) {
            case Protocol.OUTCOME_AFFINITY_HIT -> "affinity_hit";
            case Protocol.OUTCOME_CACHE_HIT -> "cache_hit";
            case Protocol.OUTCOME_RETUNED -> "retuned";
            case Protocol.OUTCOME_CREATED -> "created";
            default -> "none";
        };
    }

    static String placeName(int p) {
        return switch (p) {
            case Protocol.PLACE_NONE -> "none";
            case Protocol.PLACE_SELF -> "self";
            case Protocol.PLACE_DONE -> "done";
            default -> "unknown";
        };
    }

    /** Counter names of the acquire path (own methods so that warm-up links their string concatenation). */
    static String acquireCounter(int outcome) { return "acquire." + outcomeName(outcome); }
    static String placeCounter(int place) { return "place." + placeName(place); }

    /**
     * Makes a protocol string of s: control characters and unpaired surrogates (which the
     * encoder refuses) become U+FFFD, and it is clipped to 1024 UTF-8 bytes without splitting a
     * character.
     */
    static String clip(String s) {
        if (s == null) return "";
        if (s.length() * 3 <= Protocol.MAX_STRING && plain(s)) return s; // at most 3 UTF-8 bytes a char: fits
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isISOControl(c) || Character.isSurrogate(c)) {
                s = sanitize(s);
                break;
            }
        }
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        if (b.length <= Protocol.MAX_STRING) return s;
        int n = Protocol.MAX_STRING;
        while (n > 0 && (b[n] & 0xC0) == 0x80) n--;
        return new String(b, 0, n, StandardCharsets.UTF_8);
    }

    private static boolean plain(String s) {
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isISOControl(c) || Character.isSurrogate(c)) return false;
        }
        return true;
    }

    private static String sanitize(String s) {
        StringBuilder b = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                b.append(c).append(s.charAt(++i));
            } else if (Character.isISOControl(c) || Character.isSurrogate(c)) {
                b.append('\uFFFD');
            } else {
                b.append(c);
            }
        }
        return b.toString();
    }

    /** Runs the lease path's Java code once on throwaway values (no connection, no lease). */
    void warmCode() {
        for (int o = 0; o <= Protocol.OUTCOME_CREATED; o++) acquireCounter(o);
        for (int p = 0; p <= Protocol.PLACE_DONE; p++) placeCounter(p);
        SlotLease l = new SlotLease(this, "warmup", "warmup", 1, -1, "warmup"); // inactive: no lease
        l.stop();
        l.release(ReleaseOutcome.OK);
        l.toString();
        clip("warmup");
        parked.get(-1);
        currentSlot.get();
    }

    /**
     * The calling thread's current slot (spec: current_slot), shared with the local path: a
     * thread that moved through either path sits where the other one thinks.
     */
    long[] currentSlotCell() { return currentSlot.get(); }

    /** Creates the calling thread's per-thread state (see {@link SlotClient#prepareThread}). */
    void prepareThread() { currentSlot.get(); }

    // ---- acquire ----------------------------------------------------------------------------

    SlotLease acquire(long quotaMilli, String action, String invocationId) { return acquire(quotaMilli, action, invocationId, true); }

    /** countCall false: the local path counted this call already and handed it over. */
    SlotLease acquire(long quotaMilli, String action, String invocationId, boolean countCall) {
        if (countCall) count("acquire.calls");
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
        Answer a = ask(System.nanoTime() + budget(budgetNs), (c, waitUs) -> new Protocol.Acquire(quotaMilli, waitUs, tid & 0xFFFFFFFFL,
                (c.agentPlaces || !fdPassing) ? Protocol.ACQUIRE_AGENT_PLACES : 0, currentSlot.get()[0], act, inv));
        if (a.ok() != null) return granted(a.conn(), a.ok(), a.fds(), act, inv, quotaMilli, tid);
        return noSlot(act, inv, quotaMilli, tid, a.reason(), a.detail());
    }

    /**
     * The answer to an ACQUIRE, before it becomes a lease: a grant with its fds on conn (still
     * borrowed: the caller gives it back), or the reason and detail of no slot.
     */
    record Answer(Connection conn, Protocol.AcquireOk ok, int[] fds, String reason, String detail) {
        static Answer none(String reason, String detail) { return new Answer(null, null, null, reason, detail); }
    }

    /** The ACQUIRE to send on c, waiting at most waitUs for a slot; null when c cannot serve it. */
    interface Request {
        Protocol.Acquire on(Connection c, long waitUs);
    }

    /**
     * Sends an ACQUIRE and waits for its answer before the deadline (connecting, waiting for a
     * connection and the answer's way back all count), trying again on a lost connection and
     * after the errors that allow it. Both the per-invocation and the local path ask through
     * here. Null when request refused the connection it was offered (given back, nothing sent).
     */
    Answer ask(long deadline, Request request) { return ask(deadline, request, d -> transport.borrow(d, true)); }

    /** How {@link #ask(long, Request, Borrow)} gets its connection. */
    interface Borrow {
        Connection borrow(long deadline) throws IOException, TimeoutException;
    }

    /** {@link #ask(long, Request)} on the connections borrow gives (local leasing: its hold connection). */
    Answer ask(long deadline, Request request, Borrow borrow) {
        String reason = "budget", detail = null;
        while (true) {
            Connection c;
            try {
                c = borrow.borrow(deadline);
            } catch (TimeoutException e) {
                return Answer.none(reason, "no connection within budget");
            } catch (IOException e) {
                return Answer.none("unreachable", e.getMessage());
            }
            long remUs = (deadline - System.nanoTime()) / 1000;
            // leave a little of the budget for the answer to travel back
            Protocol.Acquire m = request.on(c, Math.max(1, remUs - Math.min(1000, remUs / 10)));
            if (m == null) {
                transport.giveBack(c);
                return null;
            }
            if (remUs <= 0) {
                transport.giveBack(c);
                return Answer.none("budget", null);
            }
            Transport.Reply r;
            c.acquiring = true;
            try {
                r = transport.call(c, m, deadline);
                c.acquiring = false;
            } catch (TimeoutException e) {
                c.acquiring = false;
                recovery.drain(c); // a late grant is released
                return Answer.none("budget", "no answer within budget");
            } catch (IOException | Protocol.ProtocolException e) {
                c.acquiring = false;
                transport.kill(c, e.getMessage());
                reason = "unreachable";
                detail = e.getMessage();
                if (System.nanoTime() < deadline) continue;
                return Answer.none(reason, detail);
            }
            if (r.message() instanceof Protocol.AcquireOk ok) {
                if (!grantedOnce) grantedOnce = true;
                return new Answer(c, ok, r.fds(), null, null);
            }
            fds.discard(r.fds()); // no grant: fds with any other answer are a faulty agent's
            if (r.message() instanceof Protocol.Error e) {
                reason = Protocol.errorName(e.code());
                detail = e.message();
                if (retryAfter(c, e, deadline)) continue;
                return Answer.none(reason, detail);
            }
            String unexpected = "unexpected " + Protocol.typeName(r.frame().type());
            transport.kill(c, unexpected);
            return Answer.none("protocol", unexpected);
        }
    }

    /** ACQUIRE_OK: the lease is held; the thread places itself if asked to. Caller borrowed c. */
    private SlotLease granted(Connection c, Protocol.AcquireOk ok, int[] got, String act, String inv, long quotaMilli, int tid) {
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
        transport.giveBack(c);
        count(acquireCounter(ok.outcome()));
        if (l.queued()) count("acquire.queued");
        if (l.degraded()) count("acquire.degraded");
        if (!fds.keep(ok, got, c.hello)) {
            currentSlot.get()[0] = 0;
            count("place.failed");
            release(l, ReleaseOutcome.PLACEMENT_FAILED);
            return noSlot(act, inv, quotaMilli, tid, "fd_mismatch", "nfds " + ok.nfds() + " but " + got.length + " fds");
        }
        if (ok.place() == Protocol.PLACE_SELF) {
            String err = fds.place(ok.slot(), ZERO);
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
        if (ok.place() != Protocol.PLACE_DONE) l.start = fds.readCounters(ok.slot());
        return l;
    }

    /**
     * Handles an error answer to ACQUIRE on connection c: closes the connection when the error
     * means it is unusable, gives it back otherwise, and says whether to try again before the
     * deadline (waiting out NOT_READY's retry-after first).
     */
    private boolean retryAfter(Connection c, Protocol.Error e, long deadline) {
        switch (e.code()) {
            case Protocol.E_SHUTTING_DOWN, Protocol.E_BAD_REQUEST, Protocol.E_UNSUPPORTED_VERSION -> transport.kill(c, e.message());
            default -> transport.giveBack(c);
        }
        return switch (e.code()) {
            case Protocol.E_NOT_READY -> sleepUntil(Math.min(deadline,
                    System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(1, e.retryAfterMs()))), deadline);
            case Protocol.E_INTERNAL, Protocol.E_SHUTTING_DOWN -> System.nanoTime() < deadline;
            default -> false;
        };
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

    SlotLease noSlot(String act, String inv, long quota, int tid, String reason, String detail) {
        count("noslot." + reason);
        if (failClosed) throw new SlotUnavailableException(reason, detail);
        return new SlotLease(this, act, inv, quota, tid, reason);
    }

    /** See {@link SlotClient#placeThread}. */
    String placeThread(SlotLease lease, int tid) {
        if (lease == null || !lease.active()) return "no active lease";
        if (tid <= 0) return "no tid";
        return fds.place(lease.slot(), Integer.toString(tid).getBytes(StandardCharsets.US_ASCII));
    }

    // ---- release and linger -----------------------------------------------------------------

    Usage release(SlotLease l, ReleaseOutcome outcome) {
        if (l.local != null) return l.local.release(l, outcome);
        l.lock.lock();
        try {
            if (l.released || l.parked) return Usage.NONE;
            // a RELEASE ends a sleep; a lingering lease must be awake for the next invocation
            if (lingerNs > 0 && outcome == ReleaseOutcome.OK && (!l.sleeping || !napLocked(l, false))) {
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
        if (closing || l.start == null || l.lost || l.conn == null || !transport.isAlive(l.conn)) return null;
        SlotCounters end = l.end != null ? l.end : fds.readCounters(l.slot);
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
                    || !p.action.equals(action) || p.thread != Thread.currentThread() || p.conn == null || !transport.isAlive(p.conn))
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
            h.napped = p.napped; // its RELEASE follows the SLEEP and WAKE of p on their connection
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

    /** Releases lingering leases idle for at least the linger time at {@code now}. */
    void expireOnce(long now) {
        for (Map.Entry<Integer, SlotLease> e : parked.entrySet()) {
            SlotLease l = e.getValue();
            if (now - l.parkedAt >= lingerNs && parked.remove(e.getKey(), l)) {
                count("linger.expired");
                releaseParked(l);
            }
        }
    }

    /** Starts the thread that expires lingering leases (when lingering is on). */
    void start() {
        if (lingerNs > 0) expirer = SlotClient.daemon("cpuslot-linger").start(this::expireLoop);
    }

    private void expireLoop() {
        long tick = Math.max(lingerNs / 2, 1_000_000L);
        while (!closing) {
            LockSupport.parkNanos(tick);
            try {
                expireOnce(System.nanoTime());
            } catch (RuntimeException e) {
                count("linger.error");
            }
        }
    }

    /** Caller holds l.lock; l is not released. */
    private Usage releaseLocked(SlotLease l, ReleaseOutcome outcome) {
        l.released = true;
        recovery.forget(l);
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
            Connection c = l.conn;
            if (c == null || !transport.isAlive(c)) {
                if (!recovery.reclaimLocked(l, deadline)) {
                    count(l.lost ? "release.lost" : "release.unreachable");
                    return Usage.NONE;
                }
                c = l.conn;
            }
            // not behind an ACQUIRE that may wait for the budget this lease holds
            if (c.acquiring) return releaseBeside(l, c, outcome);
            try {
                transport.borrow(c, deadline);
            } catch (TimeoutException e) {
                return releaseBeside(l, c, outcome);
            } catch (IOException e) {
                continue; // died meanwhile: reclaim on a new connection
            }
            Transport.Reply r;
            try {
                r = transport.call(c, new Protocol.Release(l.lease, outcome.code), deadline);
                fds.discard(r.fds());
            } catch (TimeoutException e) {
                c.leases.remove(l);
                recovery.drain(c);
                count("release.timeout");
                return Usage.NONE;
            } catch (IOException | Protocol.ProtocolException e) {
                transport.kill(c, e.getMessage());
                continue;
            }
            c.leases.remove(l);
            transport.giveBack(c);
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

    /** RELEASE with NO_REPLY beside the request in flight on the lease's connection c: usage unknown. */
    private Usage releaseBeside(SlotLease l, Connection c, ReleaseOutcome outcome) {
        try {
            transport.sendBeside(c, new Protocol.Release(l.lease, outcome.code, Protocol.RELEASE_NO_REPLY), System.nanoTime() + releaseNs);
        } catch (TimeoutException e) {
            count("release.timeout");
            return Usage.NONE;
        } catch (IOException e) {
            transport.kill(c, e.getMessage()); // the lease ends with it
            count("release.unreachable");
            return Usage.NONE;
        }
        c.leases.remove(l);
        count("release.beside");
        return Usage.NONE;
    }

    Usage stop(SlotLease l) {
        if (l.local != null) return l.local.stop(l);
        l.lock.lock();
        try {
            if (l.released || l.parked || l.start == null || l.end != null || l.conn == null || !transport.isAlive(l.conn))
                return Usage.NONE;
            SlotCounters end = fds.readCounters(l.slot);
            if (end == null) return Usage.NONE;
            l.end = end;
            return end.since(l.start);
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * Reads the slot's counters and sends RELEASE with NO_REPLY on the lease's connection (a lease
     * is touched only there, spec: "Lifetimes"), beside any request in flight on it. Null when the
     * caller must release with a reply: the lease's connection died (re-declaration needed), or no
     * counters. Caller holds l.lock.
     */
    private Usage releaseOneWay(SlotLease l, ReleaseOutcome outcome) {
        Connection owner = l.conn;
        if (owner == null || !transport.isAlive(owner)) return null;
        SlotCounters end = l.end != null ? l.end : fds.readCounters(l.slot);
        if (end == null) return null;
        try {
            transport.sendBeside(owner, new Protocol.Release(l.lease, outcome.code, Protocol.RELEASE_NO_REPLY), System.nanoTime() + releaseNs);
        } catch (TimeoutException e) {
            return null; // nothing was written
        } catch (IOException e) {
            transport.kill(owner, e.getMessage());
            return null;
        }
        owner.leases.remove(l);
        count("release.oneway");
        return end.since(l.start);
    }

    // ---- lending: SLEEP and WAKE -------------------------------------------------------------

    /** Whether an agent's HELLO_OK announced LEND: only such an agent may be sent SLEEP or WAKE. */
    static boolean lends(Protocol.HelloOk h) { return h != null && (h.flags() & Protocol.HELLO_OK_LEND) != 0; }

    /**
     * SLEEP (sleep true) or WAKE of an invocation's lease; returns whether it sleeps afterwards.
     * Without LEND nothing is sent and no lock is taken: a sleep costs one volatile read.
     */
    boolean nap(SlotLease l, boolean sleep) {
        if (sleep && !lends(transport.lastHello())) return false;
        if (l.local != null) return l.local.nap(l, sleep);
        l.lock.lock();
        try {
            if (l.released || l.parked || l.lost) return false;
            if (sleep && (l.conn == null || !transport.isAlive(l.conn))) return false;
            return napLocked(l, sleep);
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * Sends SLEEP or WAKE on the lease's own connection (a WAKE of a lease whose connection died
     * re-declares it first: the agent may keep it asleep under the new id). A WAKE that cannot go
     * out leaves the lease sleeping: its RELEASE ends the sleep. Caller holds l.lock.
     */
    private boolean napLocked(SlotLease l, boolean sleep) {
        if (sleep == l.sleeping) return l.sleeping;
        long deadline = System.nanoTime() + releaseNs;
        Connection c = l.conn;
        if (!sleep && (c == null || !transport.isAlive(c))) {
            if (!recovery.reclaimLocked(l, deadline)) {
                count("nap.unsent");
                return l.sleeping;
            }
            c = l.conn;
        }
        if (c == null || !lends(c.hello) || !sendNap(c, l.lease, sleep, deadline)) {
            count("nap.unsent");
            return l.sleeping;
        }
        l.napped = true;
        l.sleeping = sleep;
        count(sleep ? "nap.sleep" : "nap.wake");
        return sleep;
    }

    /** One-way RELEASE with SLEEP or WAKE of lease on c, its connection, beside any request in flight there. */
    boolean sendNap(Connection c, long lease, boolean sleep, long deadline) {
        int flags = (sleep ? Protocol.RELEASE_SLEEP : Protocol.RELEASE_WAKE) | Protocol.RELEASE_NO_REPLY;
        try {
            transport.sendBeside(c, new Protocol.Release(lease, ReleaseOutcome.OK.code, flags), deadline);
        } catch (TimeoutException e) {
            return false; // nothing was written
        } catch (IOException e) {
            transport.kill(c, e.getMessage());
            return false;
        }
        return true;
    }

    /** Releases every lingering lease; no lease lingers or is acquired from now on. */
    void close() {
        closing = true; // no new lingering leases
        Thread e = expirer;
        if (e != null) LockSupport.unpark(e);
        for (Integer tid : List.copyOf(parked.keySet())) {
            SlotLease l = parked.remove(tid);
            if (l != null) {
                count("linger.closed");
                releaseParked(l);
            }
        }
        closed = true;
    }
}
