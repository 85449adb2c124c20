package dev.cpuslot.slot;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.LockSupport;

/**
 * Acquire and release: one round trip per invocation at most, and with lingering none. The
 * thread places itself through the slot's cached fds and the client measures usage from the
 * slot's counter fds, so a RELEASE needs no reply; a lingering lease stays with its thread for
 * the next invocation of the same action at the same quota.
 */
final class Leases extends Lingering {
    private static final byte[] ZERO = {'0'};

    /** The slot each thread placed itself in last (spec: current_slot), 0 = none/unknown. */
    private final ThreadLocal<long[]> currentSlot = ThreadLocal.withInitial(() -> new long[1]);
    /**
     * The budget of acquisitions before the process's first grant (0: the normal one): the first
     * round trip of a new container runs code no invocation ran yet, which on a loaded node takes
     * longer than a warm one. Once any ACQUIRE was granted, every acquisition has the normal budget.
     */
    private volatile long firstBudgetNs;
    private volatile boolean grantedOnce;

    Leases(Transport transport, FdCache fds, Recovery recovery, Counters counters,
           long budgetNs, long releaseNs, long lingerNs, boolean failClosed, boolean fdPassing) {
        super(transport, fds, recovery, counters, budgetNs, releaseNs, lingerNs, failClosed, fdPassing);
    }

    long lingerNs() { return lingerNs; }

    /** Sets the budget of the acquisitions before the first grant (see {@link #firstBudgetNs}). */
    void firstBudget(long ns) { firstBudgetNs = ns; }

    /** The budget of an acquisition starting now whose normal budget is b. */
    long budget(long b) { return grantedOnce ? b : coldBudget(b); }

    /** The budget of a cold round trip (normal budget b): the first-acquire one, when longer. */
    long coldBudget(long b) { return Math.max(b, firstBudgetNs); }

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

        /** The agent refused for the container's admission budget: REJECTED, or TIMEOUT waiting for it. */
        boolean refusedForBudget() {
            return ok == null && (Protocol.errorName(Protocol.E_REJECTED).equals(reason) || Protocol.errorName(Protocol.E_TIMEOUT).equals(reason));
        }
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
            release(l, ReleaseOutcome.PLACEMENT_FAILED, false);
            return noSlot(act, inv, quotaMilli, tid, "fd_mismatch", "nfds " + ok.nfds() + " but " + got.length + " fds");
        }
        if (ok.place() == Protocol.PLACE_SELF) {
            String err = fds.place(ok.slot(), ZERO);
            if (err != null) {
                currentSlot.get()[0] = 0;
                count("place.failed");
                release(l, ReleaseOutcome.PLACEMENT_FAILED, false);
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

    /** {@code mayLinger}: an OK lease may be kept for the thread's next invocation (lingering on). */
    Usage release(SlotLease l, ReleaseOutcome outcome, boolean mayLinger) {
        if (l.local != null) return l.local.release(l, outcome);
        l.lock.lock();
        try {
            if (l.released || l.parked) return Usage.NONE;
            // a RELEASE ends a sleep; a lingering lease must be awake for the next invocation
            if (mayLinger && lingerNs > 0 && outcome == ReleaseOutcome.OK && (!l.sleeping || !sleepOrWakeLocked(l, false))) {
                Usage u = parkLocked(l);
                if (u != null) return u;
            }
            return releaseLocked(l, outcome);
        } finally {
            l.lock.unlock();
        }
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
