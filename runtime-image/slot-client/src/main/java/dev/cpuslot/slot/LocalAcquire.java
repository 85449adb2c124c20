package dev.cpuslot.slot;

import java.util.ArrayList;
import java.util.concurrent.locks.LockSupport;

/**
 * Local leasing's acquire (see {@link LocalState}): claim an entry of the quota (the thread's last
 * one first, then any free one) and place the thread, or on a miss wait in turn for an entry given
 * back or a HOLD lease granted.
 */
abstract sealed class LocalAcquire extends LocalMiss permits LocalReclaim {
    LocalAcquire(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
                 long budgetNs, long releaseNs, long idleNs, long tickNs, boolean failClosed) {
        super(transport, fds, recovery, leases, counters, table, budgetNs, releaseNs, idleNs, tickNs, failClosed);
    }

    /**
     * A slot from the table, or from the agent on a miss; null when the local path cannot serve
     * this call (the agent does not grant HOLD leases, the table is full, a virtual thread...):
     * the caller takes the per-invocation path.
     */
    SlotLease acquire(long quotaMilli, String act, String inv) { return acquire(quotaMilli, act, inv, false); }

    /**
     * {@code ownUsage}: the invocation needs its own usage from {@link SlotLease#release} (or
     * {@link SlotLease#stop}); otherwise its counters may be read with the next invocations' of
     * its entry (usage batching, {@link Batch}).
     */
    SlotLease acquire(long quotaMilli, String act, String inv, boolean ownUsage) {
        SlotLease l = acquireOwn(quotaMilli, act, inv);
        if (l == null || l.local == null) return l;
        l.ownUsage = ownUsage;
        Batch b = batches[l.entry];
        // the batch is one action's: another action's invocation reads the counters first and
        // starts a batch of its own; one that wants its own usage always reads its start (an
        // earlier read, e.g. the upkeep's of an idle entry, misses what the slot counted since)
        if (b.start == null || ownUsage || (b.total > 0 && !act.equals(b.action))) {
            long now = System.nanoTime();
            if (b.total > 0) closeBatch(l.entry, l.slot, now);
            else b.clear(fds.readCounters(l.slot), now);
        }
        // its own start only when nothing is pending (else stop() has no figure of its own)
        l.start = b.total == 0 ? b.start : null;
        return l;
    }

    private SlotLease acquireOwn(long quotaMilli, String act, String inv) {
        if (closed || !Native.available() || Thread.currentThread().isVirtual() || quotaMilli <= 0 || quotaMilli > 0xFFFFFFFFL)
            return null;
        // the agent's last word: no LOCAL (an older agent, or one that places threads itself)
        // sends the call to the per-invocation path without asking again
        Protocol.HelloOk h = transport.lastHello();
        if (h != null && (h.flags() & Protocol.HELLO_OK_LOCAL) == 0) return null;
        int[] last = perThread.get();
        int tid = last[1];
        long[] current = leases.currentSlotCell();
        // (1) the entry the thread used last: it already sits in that slot, nothing to write
        int i = last[0];
        // while threads wait in turn, a newcomer queues behind them (not even its own last entry)
        if (waiting.get() > 0) return inTurn(quotaMilli, act, inv, tid, current, last);
        // look before claiming: a claim that finds another quota gives the entry back stamping
        // idle_since, which would keep an entry this thread no longer uses from ever idling out
        if (i >= 0 && table.asked(i) == quotaMilli && table.slot(i) != 0) {
            long s = table.claim(i, tid, quotaMilli, System.nanoTime());
            if (s != 0) {
                if (table.slot(i) == current[0]) {
                    hits.increment();
                    return lease(i, s, act, inv, quotaMilli, tid, Protocol.OUTCOME_AFFINITY_HIT, Protocol.PLACE_NONE);
                }
                SlotLease l = place(i, s, act, inv, quotaMilli, tid, current, last);
                if (l != null) return l;
            }
        }
        // (2) any free entry of the quota: one write
        for (int tries = 0; tries < 4; tries++) {
            SlotTable.Claimed c = table.findAndClaim(quotaMilli, tid, Math.max(0, i), i, System.nanoTime());
            if (c == null) break;
            SlotLease l = place(c.index(), c.state(), act, inv, quotaMilli, tid, current, last);
            if (l != null) return l;
        }
        // (3) a miss: wait in turn for an entry another thread gives back or a new HOLD lease
        return inTurn(quotaMilli, act, inv, tid, current, last);
    }

    // ---- waiting in turn (spec: "Local leasing", waiting in turn) ----------------------------

    /** A thread waiting for an entry of its quota. Fields guarded by {@link #queue}. */
    private static final class Waiter {
        final int tid;
        final long quota;
        final Thread thread;
        final long since = System.nanoTime(); // when it queued
        final long deadline; // its own budget's end
        SlotTable.Claimed got; // an entry given back by another thread, claimed for this one
        Asked asked;           // the agent's answer: a grant for the first waiter, or a refusal
        boolean done;

        Waiter(int tid, long quota, Thread thread, long deadline) {
            this.tid = tid;
            this.quota = quota;
            this.thread = thread;
            this.deadline = deadline;
        }
    }

    /** Waiting threads in arrival order; guards the quotas a HOLD request is on its way for. */
    private final ArrayList<Waiter> queue = new ArrayList<>();
    private final java.util.HashSet<Long> asking = new java.util.HashSet<>();
    /** When the agent last granted a HOLD request of each quota (guarded by {@link #queue}). */
    private final java.util.HashMap<Long, Long> grantedAt = new java.util.HashMap<>();
    private final java.util.concurrent.atomic.AtomicInteger waiting = new java.util.concurrent.atomic.AtomicInteger();

    /**
     * Queues the thread, sends a HOLD request for its quota unless one is on its way, and waits
     * for an entry given back or a grant, whichever comes first. A miss waits with the
     * first-acquire budget: the agent's answer is a round trip it may have to make a slot for, on
     * a node as busy as the invocations it serves, which a new pod's first concurrent requests
     * all take. The agent itself waits for admission budget or a free slot within the acquire
     * budget ({@link #hold}), so a container at its budget still sends the thread on quickly.
     */
    private SlotLease inTurn(long quota, String act, String inv, int tid, long[] current, int[] last) {
        long deadline = System.nanoTime() + leases.coldBudget(budgetNs);
        while (true) {
            Waiter w = new Waiter(tid, quota, Thread.currentThread(), deadline);
            boolean ask;
            synchronized (queue) {
                queue.add(w);
                waiting.incrementAndGet();
                serveLocked();
                ask = !w.done && asking.add(quota);
            }
            if (ask) recovery.thread("cpuslot-hold", () -> ask(w));
            while (true) {
                long left;
                synchronized (queue) {
                    if (w.done) break;
                    left = waitLeftLocked(w);
                    if (left <= 0) {
                        dequeueLocked(w);
                        return leases.noSlot(act, inv, quota, tid, "budget", "waited in turn for a held slot");
                    }
                }
                LockSupport.parkNanos(this, left);
            }
            if (w.got != null) {
                SlotLease l = place(w.got.index(), w.got.state(), act, inv, quota, tid, current, last);
                if (l != null) return l;
                continue; // the entry was not usable (marked GONE): wait again
            }
            Asked a = w.asked;
            if (a.ok() != null) return granted(a.conn(), a.ok(), a.fds(), quota, act, inv, tid, current, last);
            if (a.reason() == null) return null;
            return leases.noSlot(act, inv, quota, tid, a.reason(), a.detail());
        }
    }

    /**
     * How much longer w may wait: until its own deadline, or one budget after the agent's last
     * grant of its quota since w queued, whichever is later. HOLD requests of a quota go one at a
     * time, so the n-th of n threads missing together is served by the n-th answer: while the
     * agent answers each within the budget they all wait their turn; an agent that grants nothing
     * within it sends them on without a slot.
     */
    private long waitLeftLocked(Waiter w) {
        long now = System.nanoTime(), left = w.deadline - now;
        Long g = grantedAt.get(w.quota);
        if (g != null && g - w.since >= 0) left = Math.max(left, g + budgetNs - now);
        return left;
    }

    /** Hands free entries of the process's own to waiting threads, first come first served. */
    final void serveWaiters() {
        if (waiting.get() == 0) return;
        synchronized (queue) { serveLocked(); }
    }

    private void serveLocked() {
        for (int k = 0; k < queue.size(); ) {
            Waiter w = queue.get(k);
            SlotTable.Claimed c = claimOwn(w.quota, w.tid);
            if (c == null) { k++; continue; }
            w.got = c;
            finishLocked(w);
        }
    }

    /** A free entry of quota that this process published, claimed for tid; null when none. */
    private SlotTable.Claimed claimOwn(long quota, int tid) {
        long now = System.nanoTime();
        for (int i = 0; i < table.used(); i++) {
            if (holds.get(i) == null || table.asked(i) != quota || table.slot(i) == 0) continue;
            long st = table.claim(i, tid, quota, now);
            if (st != 0) return new SlotTable.Claimed(i, st);
        }
        return null;
    }

    private void dequeueLocked(Waiter w) {
        if (queue.remove(w)) waiting.decrementAndGet();
    }

    private void finishLocked(Waiter w) {
        dequeueLocked(w);
        w.done = true;
        LockSupport.unpark(w.thread);
    }

    /**
     * Sends HOLD requests for the asker's quota until no thread waits for it: a grant goes to the
     * first thread waiting for the quota (published free if none waits any more), a refusal to
     * the thread the request was sent for, if it still waits.
     */
    private void ask(Waiter asker) {
        long quota = asker.quota;
        while (true) {
            long until;
            synchronized (queue) { until = System.nanoTime() + waitLeftLocked(asker); }
            Asked a = hold(quota, until);
            Waiter to = null;
            synchronized (queue) {
                if (a.ok() != null) {
                    grantedAt.put(quota, System.nanoTime());
                    for (Waiter w : queue) if (w.quota == quota) { to = w; break; }
                } else if (queue.contains(asker)) {
                    to = asker;
                }
                if (to != null) {
                    to.asked = a;
                    finishLocked(to);
                }
            }
            if (to == null && a.ok() != null) publishFree(a, quota);
            synchronized (queue) {
                serveLocked();
                asker = null;
                for (Waiter w : queue) if (w.quota == quota) { asker = w; break; }
                if (asker == null) {
                    asking.remove(quota);
                    grantedAt.remove(quota); // no one waits for it: one entry per quota waited for
                    return;
                }
            }
        }
    }

    /** The thread claimed entry i (state s) and must move into its slot: one write. */
    private SlotLease place(int i, long s, String act, String inv, long quota, int tid, long[] current, int[] last) {
        long slot = table.slot(i);
        String err = fds.place(slot, ZERO);
        if (err != null) {
            // no fds for the slot (spec: treat as GONE), or the kernel refused: claim nothing here again
            count("local.place_failed");
            current[0] = 0;
            table.markGone(i);
            table.release(i, s, System.nanoTime());
            wake();
            return null;
        }
        current[0] = slot;
        last[0] = i;
        count("local.placed");
        return lease(i, s, act, inv, quota, tid, Protocol.OUTCOME_CACHE_HIT, Protocol.PLACE_SELF);
    }
}
