package dev.cpuslot.slot;

import java.io.IOException;
import java.util.concurrent.TimeoutException;

/**
 * What the per-invocation path ({@link Leases}) holds, and RELEASE of its leases: one-way beside
 * whatever is in flight when the client measures usage itself, else with a reply, re-declaring a
 * lease whose connection died first (see {@link LeaseNames} for the parts).
 */
abstract sealed class LeaseRelease extends LeaseNames permits LeaseLending {
    final Transport transport;
    final FdCache fds;
    final Recovery recovery;
    final Counters counters;
    final long budgetNs, releaseNs, lingerNs;
    final boolean failClosed, fdPassing;
    volatile boolean closing, closed;

    LeaseRelease(Transport transport, FdCache fds, Recovery recovery, Counters counters,
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

    final void count(String name) { counters.count(name); }

    /** Caller holds l.lock; l is not released. */
    final Usage releaseLocked(SlotLease l, ReleaseOutcome outcome) {
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
}
