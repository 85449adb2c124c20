package dev.cpuslot.slot;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeoutException;

/**
 * Local leasing's miss (see {@link LocalState}): ACQUIRE with HOLD on the hold connection, room
 * made for it first, and publishing a grant in the table, for the thread it was asked for or free
 * for the next one.
 */
abstract sealed class LocalMiss extends LocalState permits LocalAcquire {
    LocalMiss(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
              long budgetNs, long releaseNs, long idleNs, long tickNs, boolean failClosed) {
        super(transport, fds, recovery, leases, counters, table, budgetNs, releaseNs, idleNs, tickNs, failClosed);
    }

    /** A HOLD request's outcome: a grant (ok set), a refusal (reason set), or neither: the per-invocation path. */
    record Asked(Connection conn, Protocol.AcquireOk ok, int[] fds, String reason, String detail) {}

    /**
     * Quota granted by the agent (HOLD) and not yet in the table: the waiter it was handed to
     * publishes it on its own thread, so a HOLD request asked meanwhile must count it to know what
     * the process holds ({@link #makeRoom}).
     */
    private final java.util.concurrent.atomic.AtomicLong unpublished = new java.util.concurrent.atomic.AtomicLong();

    /** A grant no thread waits for any more: a free entry for the next invocation. */
    final void publishFree(Asked a, long quota) {
        try {
            publishFreeOwn(a, quota);
        } finally {
            unpublished.addAndGet(-a.ok().quotaMilli());
        }
    }

    private void publishFreeOwn(Asked a, long quota) {
        Protocol.AcquireOk ok = a.ok();
        if (!fds.keep(ok, a.fds(), a.conn().hello)) {
            releaseHold(a.conn(), ok.lease(), ReleaseOutcome.PLACEMENT_FAILED);
            return;
        }
        int flags = (ok.flags() & Protocol.ACQ_FLAG_DEGRADED) != 0 ? SlotTable.FLAG_DEGRADED : 0;
        SlotTable.Claimed e = table.publish(Native.gettid(), ok.slot(), ok.quotaMilli(), ok.periodUs(), flags, ok.lease(), quota,
                System.nanoTime());
        if (e == null) {
            releaseHold(a.conn(), ok.lease(), ReleaseOutcome.OK);
            return;
        }
        holds.set(e.index(), new Hold(ok.slot(), ok.quotaMilli(), ok.lease(), a.conn()));
        reclaim.set(e.index(), null);
        batches[e.index()].clear(null, 0);
        if (!transport.isAlive(a.conn())) reclaim.set(e.index(), Boolean.TRUE);
        table.release(e.index(), e.state(), System.nanoTime());
    }

    /**
     * ACQUIRE with HOLD, off the waiting threads, answered by until: the thread it is sent for
     * waits that long anyway (its budget, or one after the last grant of its quota), and at
     * least the acquire budget. The round trip may be slow (the agent may have to make a slot,
     * on a node as busy as the invocations it serves); waiting at the agent for admission budget
     * or a free slot keeps the acquire budget.
     */
    final Asked hold(long quota, long until) {
        count("local.miss");
        long budget = leases.budget(budgetNs);
        // free entries of other quotas keep budget: give back what the new one would not fit
        // beside (the budget announced), and if the agent still refuses for budget, whatever is free
        Leases.Answer a = leases.ask(Math.max(until, System.nanoTime() + budget), holdRequest(quota, budget, null), this::borrowHold);
        if (a != null && a.refusedForBudget()) {
            boolean[] made = {false};
            Leases.Answer again = leases.ask(Math.max(until, System.nanoTime() + budget), holdRequest(quota, budget, made), this::borrowHold);
            if (made[0]) a = again;
        }
        if (a == null) {
            count("local.refused");
            return new Asked(null, null, null, null, null);
        }
        if (a.ok() != null) {
            unpublished.addAndGet(a.ok().quotaMilli()); // until granted or publishFree has it in the table
            transport.reserve(a.conn()); // the per-invocation path waits on it no more
            transport.giveBack(a.conn());
        }
        return new Asked(a.conn(), a.ok(), a.fds(), a.reason(), a.detail());
    }

    /**
     * The HOLD request for quota, room made for it ({@link #makeRoom}) once the hold connection is
     * ours: the HOLD requests before it have been answered, and their grants are in the table or
     * {@link #unpublished}. Decided before its turn, a miss would miss a grant of another quota on
     * its way. Forced (made given: the agent refused for budget), nothing is sent (null) unless
     * room was made, which made says.
     */
    private Leases.Request holdRequest(long quota, long budget, boolean[] made) {
        long waitCapUs = Math.max(1, budget / 1000);
        return (c, waitUs) -> {
            // an agent without HOLD leases: the per-invocation path
            if (c.hello == null || (c.hello.flags() & Protocol.HELLO_OK_LOCAL) == 0) return null;
            boolean force = made != null;
            if (makeRoom(quota, force) && force) made[0] = true;
            if (force && !made[0]) return null;
            return new Protocol.Acquire(quota, Math.min(waitUs, waitCapUs), 0, Protocol.ACQUIRE_HOLD, 0, "", "");
        };
    }

    final SlotLease granted(Connection c, Protocol.AcquireOk ok, int[] got, long quota, String act, String inv, int tid,
                              long[] current, int[] last) {
        try {
            return grantedOwn(c, ok, got, quota, act, inv, tid, current, last);
        } finally {
            unpublished.addAndGet(-ok.quotaMilli());
        }
    }

    private SlotLease grantedOwn(Connection c, Protocol.AcquireOk ok, int[] got, long quota, String act, String inv, int tid,
                                 long[] current, int[] last) {
        count("local.hold");
        if (!fds.keep(ok, got, c.hello)) {
            releaseHold(c, ok.lease(), ReleaseOutcome.PLACEMENT_FAILED);
            count("place.failed");
            return leases.noSlot(act, inv, quota, tid, "fd_mismatch", "nfds " + ok.nfds() + " but " + got.length + " fds");
        }
        int flags = (ok.flags() & Protocol.ACQ_FLAG_DEGRADED) != 0 ? SlotTable.FLAG_DEGRADED : 0;
        SlotTable.Claimed e = table.publish(tid, ok.slot(), ok.quotaMilli(), ok.periodUs(), flags, ok.lease(), quota, System.nanoTime());
        if (e == null) {
            count("local.table_full");
            releaseHold(c, ok.lease(), ReleaseOutcome.OK);
            return null; // the per-invocation path serves it
        }
        holds.set(e.index(), new Hold(ok.slot(), ok.quotaMilli(), ok.lease(), c));
        reclaim.set(e.index(), null);
        batches[e.index()].clear(null, 0);
        if (!transport.isAlive(c)) reclaim.set(e.index(), Boolean.TRUE); // died before we noted the owner
        String err = ok.place() == Protocol.PLACE_NONE && current[0] == ok.slot() ? null : fds.place(ok.slot(), ZERO);
        if (err != null) {
            current[0] = 0;
            count("place.failed");
            releaseHold(c, ok.lease(), ReleaseOutcome.PLACEMENT_FAILED);
            holds.set(e.index(), null); // released: dropped without another RELEASE once free
            table.markGone(e.index());
            table.release(e.index(), e.state(), System.nanoTime());
            return leases.noSlot(act, inv, quota, tid, "placement_failed", err);
        }
        current[0] = ok.slot();
        last[0] = e.index();
        SlotLease l = lease(e.index(), e.state(), act, inv, quota, tid, ok.outcome(), Protocol.PLACE_SELF);
        if ((ok.flags() & Protocol.ACQ_FLAG_QUEUED) != 0) l.flags |= Protocol.ACQ_FLAG_QUEUED;
        return l;
    }

    /** The container's admission budget, as the last HOLD_LIST_OK said (-1: none yet, HELLO_OK's). */
    volatile long listedBudget = -1;

    /**
     * Makes room for a HOLD lease of quota (spec: "Local leasing", making room): gives back free
     * entries of other quotas, least recently used first, until what the process holds plus quota
     * fits the container's budget or, with force (the agent refused for budget), until they add
     * up to quota. An idle entry otherwise keeps its budget for the idle time while calls of
     * another quota wait at the agent and go on without a slot. True when any was given back.
     */
    final boolean makeRoom(long quota, boolean force) {
        long budget = listedBudget;
        if (budget < 0) {
            Protocol.HelloOk h = transport.lastHello();
            budget = h == null ? 0 : h.budgetMilli();
        }
        if (budget == 0 && !force) return false; // unlimited, or not known
        long held = quota + unpublished.get();
        List<Integer> free = new ArrayList<>();
        for (int i = 0; i < table.used(); i++) {
            Hold h = holds.get(i);
            if (h == null) continue;
            held += h.quota();
            if (table.slot(i) == h.slot() && !table.gone(i) && reclaim.get(i) == null && table.asked(i) != quota
                    && SlotTable.hold(table.state(i)) == 0) free.add(i);
        }
        free.sort(Comparator.comparingLong(table::idleSince));
        long freed = 0, now = System.nanoTime();
        for (int i : free) {
            if (force ? freed >= quota : held <= budget) break;
            Hold h = holds.get(i);
            int d = h == null ? KEPT : dropHeld(i, now);
            if (d == KEPT) continue; // claimed meanwhile
            count("local.made_room");
            held -= h.quota();
            freed += h.quota();
            if (d == UNSENT) break; // the agent is away: its lease ends with our connection
        }
        return freed > 0;
    }

    /** What {@link #dropHeld} did. */
    static final int DROPPED = 0, KEPT = 1, UNSENT = 2;

    /**
     * Empties free entry i and releases the HOLD lease the process's own record says it holds,
     * its pending batch read first: DROPPED, KEPT (claimed meanwhile, nothing done), or UNSENT
     * (emptied, the RELEASE not sent: the agent is away).
     */
    final int dropHeld(int i, long now) {
        boolean[] sent = {true};
        boolean dropped = table.drop(i, (slot, lease, flags) -> {
            Hold h = holds.getAndSet(i, null);
            closeBatch(i, slot, System.nanoTime()); // the entry is held for the drop: read once more
            if (h != null) sent[0] = releaseHold(h.conn(), h.lease(), ReleaseOutcome.OK);
            batches[i].clear(null, 0);
        }, now);
        return !dropped ? KEPT : sent[0] ? DROPPED : UNSENT;
    }

    /** One-way RELEASE of a HOLD lease on c, the connection that holds it. False when it could not be sent. */
    final boolean releaseHold(Connection c, long lease, ReleaseOutcome outcome) {
        try {
            transport.sendBeside(c, new Protocol.Release(lease, outcome.code, Protocol.RELEASE_NO_REPLY), System.nanoTime() + releaseNs);
            count("local.released");
            return true;
        } catch (TimeoutException e) {
            // nothing was written
        } catch (IOException e) {
            transport.kill(c, e.getMessage()); // the lease ends with it
        }
        count("local.release_unsent");
        return false;
    }

    /**
     * The hold connection, borrowed: every HOLD lease is asked for, re-declared, listed (HOLD_LIST) and
     * reported (USAGE) on it, and released, slept and woken beside whatever request is in flight
     * there (a lease is touched only on the connection that holds it, spec: "Lifetimes"). Reserved:
     * the per-invocation path never waits on it. A new one replaces it when it died (its entries
     * are re-declared there).
     */
    final Connection borrowHold(long deadline) throws IOException, TimeoutException {
        while (true) {
            Connection c;
            synchronized (holdLock) {
                c = holdConn;
                if (c == null || !transport.isAlive(c)) {
                    c = transport.borrow(deadline, true);
                    holdConn = c; // reserved once it holds a lease (hold)
                    return c;
                }
            }
            try {
                transport.borrow(c, deadline);
                return c;
            } catch (IOException e) {
                // died meanwhile: the next one replaces it
            }
        }
    }
}
