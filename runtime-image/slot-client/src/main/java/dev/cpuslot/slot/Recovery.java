package dev.cpuslot.slot;

import java.io.IOException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.LockSupport;

/**
 * Keeps leases alive across a lost connection (agent restart): a dead connection's held leases
 * become orphans, re-declared with RECLAIM on a new connection by the monitor or at release,
 * whichever comes first; a lease the restarted agent does not know is lost, and its invocation
 * goes on without a slot. Also finishes requests whose caller timed out (a late lease is
 * released).
 */
final class Recovery implements Transport.Listener {
    private final Transport transport;
    private final FdCache fds;
    private final Counters counters;
    private final long releaseNs, drainNs, monitorNs;
    private final Set<SlotLease> orphans = ConcurrentHashMap.newKeySet();
    private volatile Thread monitor;
    private volatile boolean closed;
    /** Makes the client's threads ({@link SlotClient.Builder#threads}). */
    private volatile java.util.concurrent.ThreadFactory threads = SlotClient::daemon;

    Recovery(Transport transport, FdCache fds, Counters counters, long releaseNs, long drainNs, long monitorNs) {
        this.transport = transport;
        this.fds = fds;
        this.counters = counters;
        this.releaseNs = releaseNs;
        this.drainNs = drainNs;
        this.monitorNs = monitorNs;
    }

    /** Who makes the client's threads from now on (set before any is started). */
    void threads(java.util.concurrent.ThreadFactory f) { threads = f; }

    /**
     * Starts a thread of the client's (every part of the client starts its threads here, so
     * that all of them come from the one factory).
     */
    Thread thread(String name, Runnable task) {
        Thread t = threads.newThread(task);
        t.setName(name);
        t.start();
        return t;
    }

    /** Leases whose connection died and that are not yet reclaimed. */
    int orphanCount() { return orphans.size(); }

    @Override
    public void connected(Connection c) {
        Thread m = monitor;
        if (!orphans.isEmpty() && m != null) LockSupport.unpark(m);
    }

    @Override
    public void lost(Connection c) {
        for (SlotLease l : c.leases) {
            if (!l.released) orphans.add(l);
        }
        c.leases.clear();
    }

    /** The lease is over: nothing to re-declare. */
    void forget(SlotLease l) { orphans.remove(l); }

    /** RECLAIM of a lease whose connection died. Caller holds l.lock. True when re-held. */
    boolean reclaimLocked(SlotLease l, long deadline) {
        if (l.lost) return false;
        Connection c;
        try {
            c = transport.borrow(deadline, true);
        } catch (IOException | TimeoutException e) {
            return false;
        }
        Transport.Reply r = callOrDrop(c, new Protocol.Reclaim(l.slot, l.quotaMilli, l.tid & 0xFFFFFFFFL, l.action, l.invocation), deadline);
        if (r == null) return false;
        if (r.message() instanceof Protocol.AcquireOk ok) {
            if (r.fds().length > 0) fds.put(ok.slot(), r.fds(), c.hello);
            l.conn = c;
            l.lease = ok.lease();
            l.start = null; // reconnected: the release waits for the agent's own usage
            c.leases.add(l);
            transport.giveBack(c);
            orphans.remove(l);
            counters.count("reclaim.ok");
            return true;
        }
        fds.discard(r.fds());
        transport.giveBack(c);
        if (r.message() instanceof Protocol.Error e && e.code() == Protocol.E_UNKNOWN_LEASE) {
            l.lost = true;
            orphans.remove(l);
            counters.count("reclaim.lost");
            return false;
        }
        counters.count("reclaim.error");
        return false;
    }

    /**
     * One request off the invocation path, with the transport's error policy: a timeout drains
     * the connection (a late answer is read and undone), a broken one is killed. Null on either;
     * the caller gives the connection back only after an answer.
     */
    Transport.Reply callOrDrop(Connection c, Protocol.Message m, long deadline) {
        try {
            return transport.call(c, m, deadline);
        } catch (TimeoutException e) {
            drain(c);
        } catch (IOException | Protocol.ProtocolException e) {
            transport.kill(c, e.getMessage());
        }
        return null;
    }

    /** A request timed out: finish reading its answer in the background, undo a late lease. */
    void drain(Connection c) {
        counters.count("drain");
        thread("cpuslot-drain-" + c.id, () -> drainNow(c));
    }

    /** What {@link #drain} does, on the calling thread. */
    void drainNow(Connection c) {
        long dl = System.nanoTime() + drainNs;
        try {
            Transport.Reply r = transport.finish(c, dl);
            if (r.message() instanceof Protocol.AcquireOk ok) {
                if (r.fds().length > 0) fds.put(ok.slot(), r.fds(), c.hello);
                counters.count("drain.released");
                fds.discard(transport.call(c, new Protocol.Release(ok.lease(), ReleaseOutcome.TIMEOUT.code), dl).fds());
            } else {
                fds.discard(r.fds());
            }
            transport.giveBack(c);
        } catch (Exception e) {
            transport.kill(c, "drain: " + e.getMessage());
        }
    }

    /** One round of the monitor: drop dead idle connections, re-declare orphans. */
    void checkOnce() {
        transport.reapDead();
        for (SlotLease l : orphans) {
            if (!l.lock.tryLock()) continue;
            try {
                if (l.released || l.lost) { // a lingering (parked) lease is re-declared too
                    orphans.remove(l);
                } else if (l.conn == null || !transport.isAlive(l.conn)) {
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
    }

    /** Starts the monitor thread. */
    void start() {
        monitor = thread("cpuslot-monitor", this::monitorLoop);
    }

    private void monitorLoop() {
        while (!closed) {
            LockSupport.parkNanos(monitorNs);
            if (closed) return;
            try {
                checkOnce();
            } catch (RuntimeException e) {
                counters.count("monitor.error");
            }
        }
    }

    void close() {
        closed = true;
        Thread m = monitor;
        if (m != null) LockSupport.unpark(m);
    }
}
