package dev.cpuslot.slot;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.locks.LockSupport;

/**
 * Lingering (see {@link LeaseNames} for the parts): a lease released OK stays with its thread for
 * the next invocation of the same action at the same quota, which reuses it without a round trip;
 * one background thread releases those idle for the linger time.
 */
abstract sealed class Lingering extends LeaseLending permits Leases {
    /** Lingering leases by kernel thread id (at most one per thread). Removing one takes it over. */
    final Map<Integer, SlotLease> parked = new ConcurrentHashMap<>();
    volatile Thread expirer;

    Lingering(Transport transport, FdCache fds, Recovery recovery, Counters counters,
              long budgetNs, long releaseNs, long lingerNs, boolean failClosed, boolean fdPassing) {
        super(transport, fds, recovery, counters, budgetNs, releaseNs, lingerNs, failClosed, fdPassing);
    }

    int parkedCount() { return parked.size(); }

    /**
     * Keeps the lease for its thread's next invocation: measures this invocation's usage from the
     * counters (the reading of {@link SlotLease#stop()} if there was one) and starts the next
     * invocation's from the same reading. Null when the lease cannot linger (no counter fds, its
     * connection died, the client is closing). Caller holds l.lock.
     */
    final Usage parkLocked(SlotLease l) {
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
    final SlotLease reuse(SlotLease p, long quotaMilli, String action, String invocation) {
        p.lock.lock();
        try {
            if (p.released || !p.parked || p.lost || p.start == null || p.degraded() || p.quotaMilli != quotaMilli
                    || !p.action.equals(action) || p.thread != Thread.currentThread() || p.conn == null || !transport.isAlive(p.conn))
                return null;
            SlotLease h = new SlotLease((Leases) this, action, invocation, quotaMilli, p.tid, null);
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
    final void releaseParked(SlotLease p) {
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
        if (lingerNs > 0) expirer = recovery.thread("cpuslot-linger", this::expireLoop);
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
}
