package dev.cpuslot.slot;

/**
 * Local leasing (spec: "Local leasing"): the process holds slots with HOLD leases, keeps them in
 * its {@link SlotTable}, and leases them to its threads itself. An invocation claims a free entry
 * of its quota with one compare-and-swap (the entry its thread used last first: then the thread
 * already sits in the slot and nothing is written), places itself with one write when it must,
 * and gives the entry back with one store. Only a miss (no free entry of the quota) asks the
 * agent: ACQUIRE with HOLD, publish, place. Threads that miss wait in turn: an entry given back
 * goes to the first of them before anyone claims it again, and so does a HOLD lease granted
 * meanwhile (spec: "Local leasing", waiting in turn).
 *
 * <p>Off the invocation path, one background thread sends what invocations used as USAGE (at most
 * once a second, or early at 8 keys), releases entries idle for longer than the idle time, and
 * re-declares held slots with RECLAIM after a lost connection (an agent restart): invocations go
 * on claiming held slots while the agent is away. While it holds slots it also asks the agent, once
 * a second, what they are granted now and how much of them to give back (HOLD_LIST): after a CPU limit
 * shrink it gives back free entries, least recently used first, and marks busy ones GONE to drop
 * them once their invocations end.
 */
final class LocalLeases extends LocalUpkeep {
    LocalLeases(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
                long budgetNs, long releaseNs, long idleNs, long tickNs, boolean failClosed) {
        super(transport, fds, recovery, leases, counters, table, budgetNs, releaseNs, idleNs, tickNs, failClosed);
    }

    /** Creates the calling thread's per-thread state. */
    void prepareThread() { perThread.get(); }

    /**
     * Runs the local path's code once on a scratch table (no connection, no lease): the first
     * atomic access through a VarHandle links it, which a cold JVM would otherwise pay inside
     * the first invocation's acquire budget.
     */
    void warmCode() {
        try (java.lang.foreign.Arena a = java.lang.foreign.Arena.ofConfined()) {
            java.lang.foreign.MemorySegment m = a.allocate(SlotTable.size(1), 64);
            SlotTable.format(m, 1);
            SlotTable t = SlotTable.over(m);
            SlotTable.Claimed c = t.publish(1, 1, 1, 100_000, 0, 1, 1, 1);
            t.release(c.index(), c.state(), 1);
            SlotTable.Claimed d = t.findAndClaim(1, 1, 0, -1, 1);
            if (d != null) t.release(d.index(), d.state(), 1);
            t.claim(0, 1, 2, 1);
            t.markGone(0);
            t.setLease(0, 2);
            t.drop(0, (slot, lease, flags) -> { }, 1);
        }
        UsageReports r = new UsageReports(counters);
        r.add("warmup", ReleaseOutcome.OK, Usage.NONE);
        Protocol.encode(1, new Protocol.UsageReport(r.take(Protocol.MAX_USAGE_RECORDS)));
        Protocol.encode(1, new Protocol.Acquire(1, 1, 0, Protocol.ACQUIRE_HOLD, 0, "", ""));
        Protocol.encode(1, new Protocol.Reclaim(1, 1, 0, "", ""));
        Protocol.encode(1, new Protocol.HoldList());
        perThread.get();
    }

    /**
     * Gives the entry back (one store) and adds the invocation to its entry's usage batch. The
     * counters are read here only when the batch ends: it is {@link #batchNs} old, the invocation
     * wants its own usage, was stopped, or the entry is GONE. Returns the invocation's own usage
     * when the batch was it alone, else {@link Usage#NONE} (a batch read here goes to the
     * listener, as one read anywhere else).
     */
    Usage release(SlotLease l, ReleaseOutcome outcome) {
        l.lock.lock();
        try {
            if (l.released) return Usage.NONE;
            if (l.sleeping) sleepOrWakeLocked(l, false); // the entry goes back awake (or GONE)
            l.released = true;
            long now = System.nanoTime();
            Usage u = Usage.NONE;
            int o = outcome.code;
            if (o < Protocol.RELEASE_PLACEMENT_FAILED) { // PLACEMENT_FAILED: no invocation ran in the slot
                Batch b = batches[l.entry];
                b.action = l.action;
                b.n[o]++;
                b.total++;
                if (l.end != null || l.ownUsage || now - b.readAt >= batchNs || table.gone(l.entry)) {
                    u = closeBatch(b, l.end != null ? l.end : fds.readCounters(l.slot), now);
                    if (u.invocations() > 1) { // not this invocation's own: to the listener
                        heard(l.action, u);
                        u = Usage.NONE;
                        l.batched = true;
                    }
                } else {
                    l.batched = b.start != null; // read with the next ones (none without counters)
                }
            }
            table.release(l.entry, l.claim, now);
            serveWaiters();
            releases.increment();
            return u;
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * SLEEP or WAKE of the HOLD lease behind a claimed entry, on the connection that holds it
     * (the process's own record, never the table's). Returns whether it sleeps afterwards.
     */
    boolean sleepOrWake(SlotLease l, boolean sleep) {
        l.lock.lock();
        try {
            if (l.released) return false;
            return sleepOrWakeLocked(l, sleep);
        } finally {
            l.lock.unlock();
        }
    }

    /**
     * A WAKE goes to the entry's current HOLD lease: after a lost connection the background
     * thread may have re-declared it (an agent that stayed keeps it asleep under the new id). A
     * WAKE that cannot go out marks the entry GONE: its lease is released once the invocation
     * ends, which ends the sleep. Caller holds l.lock.
     */
    private boolean sleepOrWakeLocked(SlotLease l, boolean sleep) {
        if (sleep == l.sleeping) return l.sleeping;
        Hold h = holds.get(l.entry);
        boolean usable = h != null && h.slot() == l.slot && reclaim.get(l.entry) == null && transport.isAlive(h.conn())
                && Leases.lends(h.conn().hello);
        long deadline = System.nanoTime() + releaseNs;
        if (usable && leases.sendSleepOrWake(h.conn(), h.lease(), sleep, deadline)) {
            l.sleeping = sleep;
            count(sleep ? "lend.sleep" : "lend.wake");
            return sleep;
        }
        count("lend.unsent");
        if (!sleep) {
            table.markGone(l.entry);
            l.sleeping = false;
        }
        return l.sleeping;
    }

    Usage stop(SlotLease l) {
        l.lock.lock();
        try {
            if (l.released || l.start == null || l.end != null) return Usage.NONE;
            SlotCounters end = fds.readCounters(l.slot);
            if (end == null) return Usage.NONE;
            l.end = end;
            return end.since(l.start);
        } finally {
            l.lock.unlock();
        }
    }

    /** Sends what is pending and stops the background thread (the connections' close ends the HOLD leases). */
    void close() {
        closed = true;
        wake();
        try {
            closeBatches(System.nanoTime() + BATCH_IDLE_NS); // all free entries' batches
            reportOnce(System.nanoTime(), true);
        } catch (RuntimeException e) {
            count("local.error");
        }
    }
}
