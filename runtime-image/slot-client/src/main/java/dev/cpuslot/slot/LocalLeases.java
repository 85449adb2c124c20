package dev.cpuslot.slot;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicReferenceArray;
import java.util.concurrent.locks.LockSupport;

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
 * a second, what they are granted now and how much of them to give back (HELD): after a CPU limit
 * shrink it gives back free entries, least recently used first, and marks busy ones GONE to drop
 * them once their invocations end.
 */
final class LocalLeases {
    private static final byte[] ZERO = {'0'};

    private final Transport transport;
    private final FdCache fds;
    private final Recovery recovery;
    private final Leases leases;
    private final Counters counters;
    private final SlotTable table;
    private final UsageReports reports;
    private final long budgetNs, releaseNs, idleNs, tickNs;
    private final boolean failClosed;
    /**
     * The process's own record of each entry's HOLD lease (null: the agent does not back it):
     * releases and re-declarations use this, never what the table says, so a scribbled table
     * cannot make the client release or re-declare anything it was not granted.
     */
    private record Held(long slot, long quota, long lease, Connection conn) {}
    private final AtomicReferenceArray<Held> held;
    /**
     * Each entry's usage batch (spec "Local leasing": the client may sum several invocations'
     * usage from one pair of readings). The slot's counters are cumulative, so warm invocations
     * of one action on one entry need no reading of their own: the counters are read when the
     * batch ends (it is {@link #batchNs} old at a release, another action claims the entry, an
     * invocation asks for its own usage, the entry idles or is dropped) and the difference goes to
     * USAGE for all of them. Fields are guarded by the entry's claim (the table's state word
     * orders them between the threads that take turns holding it).
     */
    private static final class Batch {
        /** The counters at the batch's start (the last reading); null: never read. */
        SlotCounters start;
        long readAt;
        String action;
        /** Invocations since start, by outcome (OK, FAILED, TIMEOUT). */
        final long[] n = new long[3];
        long total;

        void clear(SlotCounters at, long now) {
            start = at;
            readAt = now;
            action = null;
            n[0] = n[1] = n[2] = 0;
            total = 0;
        }
    }
    private final Batch[] batches;
    /** Entries whose lease must be re-declared (their connection died). */
    private final AtomicReferenceArray<Boolean> reclaim;
    /**
     * Per thread: [0] the entry it used last (-1 = none), [1] its kernel tid (a platform
     * thread's never changes: read once, not with a system call per invocation).
     */
    private final ThreadLocal<int[]> perThread = ThreadLocal.withInitial(() -> new int[]{-1, Native.gettid()});
    /** The connection HOLD leases are held on (borrowHold); holdLock picks a new one. */
    private volatile Connection holdConn;
    private final Object holdLock = new Object();
    private volatile Thread worker;
    private volatile boolean closed;
    private long lastReport, lastHeld;
    /** A batch of warm invocations on an entry this old is read at the release that ends it. */
    volatile long batchNs = BATCH_NS;
    static final long BATCH_NS = 100_000_000L;
    /** A free entry idle this long has its pending batch read by the background thread. */
    static final long BATCH_IDLE_NS = 1_000_000_000L;
    /** Rounds between HELD requests (the agent answers a process at most 5 a second). */
    static final long HELD_EVERY_NS = 1_000_000_000L;

    LocalLeases(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
                long budgetNs, long releaseNs, long idleNs, long tickNs, boolean failClosed) {
        this.transport = transport;
        this.fds = fds;
        this.recovery = recovery;
        this.leases = leases;
        this.counters = counters;
        this.hits = counters.adder("local.hit");
        this.releases = counters.adder("release.local");
        this.batchReads = counters.adder("local.batch_read");
        this.table = table;
        this.reports = new UsageReports(counters);
        this.budgetNs = budgetNs;
        this.releaseNs = releaseNs;
        this.idleNs = idleNs;
        this.tickNs = tickNs;
        this.failClosed = failClosed;
        this.held = new AtomicReferenceArray<>(table.capacity());
        this.reclaim = new AtomicReferenceArray<>(table.capacity());
        this.batches = new Batch[table.capacity()];
        for (int i = 0; i < batches.length; i++) batches[i] = new Batch();
    }

    SlotTable table() { return table; }
    UsageReports reports() { return reports; }

    private void count(String name) { counters.count(name); }
    /** Counted on every invocation: held, not looked up by name each time. */
    private final java.util.concurrent.atomic.LongAdder hits, releases, batchReads;

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
        Protocol.encode(1, new Protocol.Held());
        perThread.get();
    }

    // ---- acquire ----------------------------------------------------------------------------

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
        // the batch is one action's: another action's invocation (or one that wants its own
        // usage) reads the counters first and starts a batch of its own
        if (b.start == null || (b.total > 0 && (ownUsage || !act.equals(b.action)))) {
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

    /** A HOLD request's outcome: a grant (ok set), a refusal (reason set), or neither: the per-invocation path. */
    private record Asked(Connection conn, Protocol.AcquireOk ok, int[] fds, String reason, String detail) {}

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
            if (ask) SlotClient.daemon("cpuslot-hold").start(() -> ask(w));
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
    private void serveWaiters() {
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
            if (held.get(i) == null || table.asked(i) != quota || table.slot(i) == 0) continue;
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

    /** A grant no thread waits for any more: a free entry for the next invocation. */
    private void publishFree(Asked a, long quota) {
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
        held.set(e.index(), new Held(ok.slot(), ok.quotaMilli(), ok.lease(), a.conn()));
        reclaim.set(e.index(), null);
        batches[e.index()].clear(null, 0);
        if (!transport.isAlive(a.conn())) reclaim.set(e.index(), Boolean.TRUE);
        table.release(e.index(), e.state(), System.nanoTime());
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

    private SlotLease lease(int i, long s, String act, String inv, long quota, int tid, int outcome, int place) {
        SlotLease l = new SlotLease(leases, act, inv, quota, tid, null);
        l.local = this;
        l.entry = i;
        l.claim = s;
        l.slot = table.slot(i);
        l.quotaMilli = table.quota(i);
        l.periodUs = table.period(i);
        l.lease = table.lease(i);
        l.flags = (table.flags(i) & SlotTable.FLAG_DEGRADED) != 0 ? Protocol.ACQ_FLAG_DEGRADED : 0;
        l.outcome = outcome;
        l.place = place;
        return l;
    }

    /**
     * Reads entry i's counters (the caller holds the entry) and sends its pending batch to USAGE:
     * every invocation under its outcome, the CPU once (the agent counts CPU per action). Returns
     * the batch's usage (all its invocations), or {@link Usage#NONE} when nothing could be read.
     */
    private void closeBatch(int i, long slot, long now) {
        Batch b = batches[i];
        if (b.total == 0) return; // nothing pending: no read
        String action = b.action;
        heard(action, closeBatch(b, fds.readCounters(slot), now));
    }

    /** Gets the usage of each batch of more than one invocation: see {@link SlotClient#onBatchRead}. */
    volatile java.util.function.BiConsumer<String, Usage> batchRead;

    private void heard(String action, Usage u) {
        java.util.function.BiConsumer<String, Usage> to = batchRead;
        if (!u.measured() || to == null) return;
        try {
            to.accept(action, u);
        } catch (RuntimeException e) {
            count("local.listener_error");
        }
    }

    private Usage closeBatch(Batch b, SlotCounters end, long now) {
        Usage u = Usage.NONE;
        if (b.total > 0) {
            batchReads.increment();
            Usage d = end != null && b.start != null ? end.since(b.start) : Usage.NONE;
            boolean cpu = true;
            boolean early = false;
            for (int o = 0; o < b.n.length; o++) {
                if (b.n[o] == 0) continue;
                early |= reports.add(b.action, o, b.n[o], cpu ? d.cpuNanos() : 0, cpu ? d.throttledNanos() : 0);
                cpu = false;
            }
            if (early) wake();
            if (d.measured())
                u = new Usage(true, d.cpuNanos(), d.throttledNanos(), d.periods(), d.throttledPeriods(), b.total);
        }
        b.clear(end, now);
        return u;
    }

    /**
     * ACQUIRE with HOLD, off the waiting threads, answered by until: the thread it is sent for
     * waits that long anyway (its budget, or one after the last grant of its quota), and at
     * least the acquire budget. The round trip may be slow (the agent may have to make a slot,
     * on a node as busy as the invocations it serves); waiting at the agent for admission budget
     * or a free slot keeps the acquire budget.
     */
    private Asked hold(long quota, long until) {
        count("local.miss");
        long budget = leases.budget(budgetNs), waitCapUs = Math.max(1, budget / 1000);
        Leases.Answer a = leases.ask(Math.max(until, System.nanoTime() + budget), (c, waitUs) ->
                // an agent without HOLD leases: the per-invocation path
                c.hello == null || (c.hello.flags() & Protocol.HELLO_OK_LOCAL) == 0 ? null
                        : new Protocol.Acquire(quota, Math.min(waitUs, waitCapUs), 0, Protocol.ACQUIRE_HOLD, 0, "", ""), this::borrowHold);
        if (a == null) {
            count("local.refused");
            return new Asked(null, null, null, null, null);
        }
        if (a.ok() != null) {
            transport.reserve(a.conn()); // the per-invocation path waits on it no more
            transport.giveBack(a.conn());
        }
        return new Asked(a.conn(), a.ok(), a.fds(), a.reason(), a.detail());
    }

    private SlotLease granted(Connection c, Protocol.AcquireOk ok, int[] got, long quota, String act, String inv, int tid,
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
        held.set(e.index(), new Held(ok.slot(), ok.quotaMilli(), ok.lease(), c));
        reclaim.set(e.index(), null);
        batches[e.index()].clear(null, 0);
        if (!transport.isAlive(c)) reclaim.set(e.index(), Boolean.TRUE); // died before we noted the owner
        String err = ok.place() == Protocol.PLACE_NONE && current[0] == ok.slot() ? null : fds.place(ok.slot(), ZERO);
        if (err != null) {
            current[0] = 0;
            count("place.failed");
            releaseHold(c, ok.lease(), ReleaseOutcome.PLACEMENT_FAILED);
            held.set(e.index(), null); // released: dropped without another RELEASE once free
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

    /** One-way RELEASE of a HOLD lease on c, the connection that holds it. False when it could not be sent. */
    private boolean releaseHold(Connection c, long lease, ReleaseOutcome outcome) {
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
     * The hold connection, borrowed: every HOLD lease is asked for, re-declared, listed (HELD) and
     * reported (USAGE) on it, and released, slept and woken beside whatever request is in flight
     * there (a lease is touched only on the connection that holds it, spec: "Lifetimes"). Reserved:
     * the per-invocation path never waits on it. A new one replaces it when it died (its entries
     * are re-declared there).
     */
    private Connection borrowHold(long deadline) throws IOException, TimeoutException {
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

    // ---- release ----------------------------------------------------------------------------

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
            if (l.sleeping) napLocked(l, false); // the entry goes back awake (or GONE)
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

    // ---- lending: SLEEP and WAKE -------------------------------------------------------------

    /**
     * SLEEP or WAKE of the HOLD lease behind a claimed entry, on the connection that holds it
     * (the process's own record, never the table's). Returns whether it sleeps afterwards.
     */
    boolean nap(SlotLease l, boolean sleep) {
        l.lock.lock();
        try {
            if (l.released) return false;
            return napLocked(l, sleep);
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
    private boolean napLocked(SlotLease l, boolean sleep) {
        if (sleep == l.sleeping) return l.sleeping;
        Held h = held.get(l.entry);
        boolean usable = h != null && h.slot() == l.slot && reclaim.get(l.entry) == null && transport.isAlive(h.conn())
                && Leases.lends(h.conn().hello);
        long deadline = System.nanoTime() + releaseNs;
        if (usable && leases.sendNap(h.conn(), h.lease(), sleep, deadline)) {
            l.sleeping = sleep;
            count(sleep ? "nap.sleep" : "nap.wake");
            return sleep;
        }
        count("nap.unsent");
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

    // ---- connections ------------------------------------------------------------------------

    /** A connection died: the entries it granted are re-declared on a new one. */
    void lost(Connection c) {
        for (int i = 0; i < held.length(); i++) {
            Held h = held.get(i);
            if (h != null && h.conn() == c) reclaim.set(i, Boolean.TRUE);
        }
    }

    /** A connection said HELLO: re-declare what waits. */
    void connected(Connection c) { wake(); }

    private void wake() {
        Thread w = worker;
        if (w != null) LockSupport.unpark(w);
    }

    // ---- the background thread --------------------------------------------------------------

    void start() {
        worker = SlotClient.daemon("cpuslot-local").start(this::loop);
    }

    private void loop() {
        while (!closed) {
            LockSupport.parkNanos(tickNs);
            if (closed) return;
            try {
                tick(System.nanoTime());
            } catch (RuntimeException e) {
                count("local.error");
            }
        }
    }

    /** One round: re-declare, report usage, free dead claims, ask what is held, drop idle and gone entries. */
    void tick(long now) {
        reclaimOnce();
        closeBatches(now);
        reportOnce(now, false);
        freeDead(now);
        serveWaiters();
        heldOnce(now);
        dropIdle(now);
    }

    /**
     * Frees the process's own entries claimed by a thread that no longer exists: a thread of a
     * process sharing the table, or of this one, that died in an invocation would otherwise hold
     * the entry and its slot for ever. Dead means the kernel has no thread of that TID (ESRCH); a
     * TID reused by a live thread keeps the claim, and the compare-and-swap on the state read
     * before the check leaves a claim made since alone.
     */
    void freeDead(long now) {
        for (int i = 0; i < table.used(); i++) {
            if (held.get(i) == null) continue;
            long s = table.state(i);
            int h = SlotTable.hold(s);
            if (h == 0 || h == SlotTable.CONTROL || h < 0 || h > (1 << 22)) continue;
            if (Native.threadGone(h) && table.freeDead(i, s, now)) count("local.freed_dead");
        }
    }

    /**
     * Asks HELD, at most once a second and only while the process holds slots, of an agent that
     * announced it (an older agent is never asked), and applies the answer.
     */
    void heldOnce(long now) {
        if (now - lastHeld < HELD_EVERY_NS) return;
        boolean any = false;
        for (int i = 0; i < table.used() && !any; i++) any = held.get(i) != null;
        if (!any) return;
        long deadline = System.nanoTime() + releaseNs;
        Connection c = holdConn;
        try {
            if (c == null) return;
            transport.borrow(c, System.nanoTime()); // not behind a HOLD that waits: next round
        } catch (IOException | TimeoutException e) {
            return;
        }
        if (c.hello == null || (c.hello.flags() & Protocol.HELLO_OK_HELD) == 0 || (c.hello.flags() & Protocol.HELLO_OK_LOCAL) == 0) {
            transport.giveBack(c);
            return;
        }
        lastHeld = now;
        Transport.Reply r = recovery.callOrDrop(c, new Protocol.Held(), deadline);
        if (r == null) return;
        transport.giveBack(c);
        fds.discard(r.fds());
        if (r.message() instanceof Protocol.HeldOk ok) {
            count("local.held");
            giveBack(ok, now);
        } else {
            count("local.held_refused"); // REJECTED for the rate: next round
        }
    }

    /**
     * Applies a HELD_OK: each entry takes its lease's current grant (quota, DEGRADED), and entries
     * adding up to give_back_m are given back: free ones now, least recently used first; busy ones
     * are marked GONE (no new claim takes them) and dropped by dropIdle once their invocation ends.
     */
    void giveBack(Protocol.HeldOk ok, long now) {
        Map<Long, Protocol.HeldLease> byLease = new HashMap<>();
        for (Protocol.HeldLease l : ok.leases()) byLease.put(l.lease(), l);
        long want = ok.giveBackMilli();
        List<Integer> free = new ArrayList<>(), busy = new ArrayList<>();
        for (int i = 0; i < table.used(); i++) {
            Held h = held.get(i);
            if (h == null || table.slot(i) != h.slot()) continue;
            Protocol.HeldLease l = byLease.get(h.lease());
            if (l != null && l.slot() == h.slot()) {
                table.setGranted(i, l.quotaMilli(), (l.flags() & Protocol.HELD_DEGRADED) != 0);
                held.compareAndSet(i, h, h = new Held(h.slot(), l.quotaMilli(), h.lease(), h.conn()));
            }
            if (table.gone(i)) {
                want -= Math.min(want, h.quota()); // given back already, its invocation still running
                continue;
            }
            if (reclaim.get(i) != null) continue;
            (SlotTable.hold(table.state(i)) == 0 ? free : busy).add(i);
        }
        free.sort(Comparator.comparingLong(table::idleSince));
        for (int i : free) {
            if (want == 0) return;
            Held h = held.get(i);
            if (h == null) continue;
            boolean[] sent = {true};
            boolean dropped = table.drop(i, (slot, lease, flags) -> {
                Held mine = held.getAndSet(i, null);
                closeBatch(i, slot, System.nanoTime()); // the entry is held for the drop: read once more
                if (mine != null) sent[0] = releaseHold(mine.conn(), mine.lease(), ReleaseOutcome.OK);
                batches[i].clear(null, 0);
            }, now);
            if (!sent[0]) return; // the agent is away: next round
            if (!dropped) table.markGone(i); // claimed meanwhile: given back once free
            count("local.given_back");
            want -= Math.min(want, h.quota());
        }
        for (int i : busy) {
            if (want == 0) return;
            Held h = held.get(i);
            if (h == null) continue;
            table.markGone(i);
            count("local.given_back");
            want -= Math.min(want, h.quota());
        }
    }

    /** Re-declares (RECLAIM, tid 0) each entry whose connection died. */
    void reclaimOnce() {
        for (int i = 0; i < table.used(); i++) {
            if (reclaim.get(i) == null) continue;
            Held h = held.get(i);
            if (h == null || table.gone(i)) {
                reclaim.set(i, null);
                continue;
            }
            long slot = h.slot();
            long deadline = System.nanoTime() + releaseNs;
            Connection c;
            try {
                c = borrowHold(deadline);
            } catch (IOException | TimeoutException e) {
                return; // the agent is still away: next round
            }
            Transport.Reply r = recovery.callOrDrop(c, new Protocol.Reclaim(slot, h.quota(), 0, "", ""), deadline);
            if (r == null) return;
            transport.giveBack(c);
            if (r.message() instanceof Protocol.AcquireOk ok && ok.slot() == slot && r.fds().length == ok.nfds()) {
                if (r.fds().length > 0) fds.put(slot, r.fds(), c.hello);
                table.setLease(i, ok.lease());
                held.set(i, new Held(slot, h.quota(), ok.lease(), c));
                transport.reserve(c); // it holds a lease now
                reclaim.set(i, null);
                if (!transport.isAlive(c)) reclaim.set(i, Boolean.TRUE);
                count("local.reclaimed");
                continue;
            }
            fds.discard(r.fds());
            if (r.message() instanceof Protocol.Error e && e.code() != Protocol.E_UNKNOWN_LEASE && e.code() != Protocol.E_REJECTED) {
                count("local.reclaim_error");
                return; // NOT_READY, INTERNAL...: next round
            }
            // refused (UNKNOWN_LEASE, REJECTED) or a grant of another slot: the agent does not back this one
            held.set(i, null); // nothing to release when dropped
            table.markGone(i);
            reclaim.set(i, null);
            count("local.reclaim_refused");
        }
    }

    /**
     * Sends pending usage: once a second, and at once when 8 keys wait ({@code force}: all of it,
     * as at close). Records that cannot be sent wait for the next round.
     */
    void reportOnce(long now, boolean force) {
        while (reports.keys() > 0) {
            boolean due = force || reports.keys() >= UsageReports.EARLY || now - lastReport >= 1_000_000_000L;
            if (!due) return;
            List<Protocol.UsageRecord> rs = reports.take(Protocol.MAX_USAGE_RECORDS);
            if (rs.isEmpty()) return;
            if (!send(new Protocol.UsageReport(rs))) {
                reports.putBack(rs);
                return;
            }
            lastReport = now;
            count("usage.sent");
            if (!force && reports.keys() < UsageReports.EARLY) return;
        }
    }

    /** Sends a USAGE on the hold connection, where the leases it reports on are held. */
    private boolean send(Protocol.Message m) {
        Connection c = holdConn;
        if (c == null || !transport.isAlive(c) || c.hello == null || (c.hello.flags() & Protocol.HELLO_OK_LOCAL) == 0)
            return false; // an agent that knows no USAGE would close the connection
        try {
            transport.sendBeside(c, m, System.nanoTime() + releaseNs);
            return true;
        } catch (TimeoutException e) {
            // nothing was written
        } catch (IOException e) {
            transport.kill(c, e.getMessage());
        }
        return false;
    }

    /**
     * Drops free entries idle for the idle time and free GONE entries, releasing the HOLD leases
     * the agent still backs. An entry waiting to be re-declared stays.
     */
    void dropIdle(long now) {
        for (int i = 0; i < table.used(); i++) {
            if (table.slot(i) == 0 || SlotTable.hold(table.state(i)) != 0 || reclaim.get(i) != null) continue;
            boolean gone = table.gone(i);
            if (!gone && now - table.idleSince(i) < idleNs) continue;
            boolean[] sent = {true};
            int idx = i;
            boolean dropped = table.drop(i, (slot, lease, flags) -> {
                // a lease the agent still backs is released, by the process's own record
                Held h = held.getAndSet(idx, null);
                closeBatch(idx, slot, System.nanoTime()); // the entry is held for the drop: read once more
                if (h != null) sent[0] = releaseHold(h.conn(), h.lease(), ReleaseOutcome.OK);
                batches[idx].clear(null, 0);
            }, now);
            if (dropped) count(gone ? "local.dropped_gone" : "local.dropped_idle");
            if (!sent[0]) return; // the agent is away: its lease ends with our connections
        }
    }

    /**
     * Reads the pending batches of free entries idle for {@link #BATCH_IDLE_NS} (so that their
     * usage reaches the agent within about a second of the last invocation), taking each entry
     * for the read and giving it back with its idle time unchanged.
     */
    void closeBatches(long now) {
        long[] out = new long[1];
        for (int i = 0; i < table.used(); i++) {
            if (held.get(i) == null || table.slot(i) == 0 || SlotTable.hold(table.state(i)) != 0) continue;
            long idle = table.idleSince(i);
            if (now - idle < BATCH_IDLE_NS) continue;
            if (table.control(i, out) != SlotTable.CLAIMED) continue;
            try {
                if (batches[i].total > 0) closeBatch(i, table.slot(i), now);
            } finally {
                table.release(i, out[0], idle);
            }
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
