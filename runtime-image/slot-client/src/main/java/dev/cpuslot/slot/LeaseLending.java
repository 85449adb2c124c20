package dev.cpuslot.slot;

import java.io.IOException;
import java.util.concurrent.TimeoutException;

/**
 * Lending on the per-invocation path (see {@link LeaseNames} for the parts): SLEEP and WAKE of a
 * lease on its own connection, sent only to an agent that announced LEND.
 */
abstract sealed class LeaseLending extends LeaseRelease permits Lingering {
    LeaseLending(Transport transport, FdCache fds, Recovery recovery, Counters counters,
                 long budgetNs, long releaseNs, long lingerNs, boolean failClosed, boolean fdPassing) {
        super(transport, fds, recovery, counters, budgetNs, releaseNs, lingerNs, failClosed, fdPassing);
    }

    /** Whether an agent's HELLO_OK announced LEND: only such an agent may be sent SLEEP or WAKE. */
    static boolean lends(Protocol.HelloOk h) { return h != null && (h.flags() & Protocol.HELLO_OK_LEND) != 0; }

    /**
     * SLEEP (sleep true) or WAKE of an invocation's lease; returns whether it sleeps afterwards.
     * Without LEND nothing is sent and no lock is taken: a sleep costs one volatile read.
     */
    boolean sleepOrWake(SlotLease l, boolean sleep) {
        if (sleep && !lends(transport.lastHello())) return false;
        if (l.local != null) return l.local.sleepOrWake(l, sleep);
        l.lock.lock();
        try {
            if (l.released || l.parked || l.lost) return false;
            if (sleep && (l.conn == null || !transport.isAlive(l.conn))) return false;
            return sleepOrWakeLocked(l, sleep);
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * Sends SLEEP or WAKE on the lease's own connection (a WAKE of a lease whose connection died
     * re-declares it first: the agent may keep it asleep under the new id). A WAKE that cannot go
     * out leaves the lease sleeping: its RELEASE ends the sleep. Caller holds l.lock.
     */
    final boolean sleepOrWakeLocked(SlotLease l, boolean sleep) {
        if (sleep == l.sleeping) return l.sleeping;
        long deadline = System.nanoTime() + releaseNs;
        Connection c = l.conn;
        if (!sleep && (c == null || !transport.isAlive(c))) {
            if (!recovery.reclaimLocked(l, deadline)) {
                count("lend.unsent");
                return l.sleeping;
            }
            c = l.conn;
        }
        if (c == null || !lends(c.hello) || !sendSleepOrWake(c, l.lease, sleep, deadline)) {
            count("lend.unsent");
            return l.sleeping;
        }
        l.sleeping = sleep;
        count(sleep ? "lend.sleep" : "lend.wake");
        return sleep;
    }

    /** One-way RELEASE with SLEEP or WAKE of lease on c, its connection, beside any request in flight there. */
    boolean sendSleepOrWake(Connection c, long lease, boolean sleep, long deadline) {
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
}
