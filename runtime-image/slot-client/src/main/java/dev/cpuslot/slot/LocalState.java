package dev.cpuslot.slot;

import java.util.concurrent.atomic.AtomicReferenceArray;
import java.util.concurrent.locks.LockSupport;

/**
 * What local leasing ({@link LocalLeases}) holds: the process's record of each entry's HOLD lease,
 * the entries' usage batches, the hold connection, and the settings. Local leasing is one object
 * written in one file per part, as the Go client's local*.go: LocalState, {@link LocalMiss} (miss
 * and publish), {@link LocalAcquire} (acquire and waiting in turn), {@link LocalReclaim} (reclaim
 * after a lost connection), {@link LocalUpkeep} (the background thread) and {@link LocalLeases}
 * (release, lending, close), each class extending the one before it and calling only what it and
 * the classes before it declare. What a later part uses is package-private and final, so no call
 * on the claim path is virtual and no field is reached through another object.
 */
abstract sealed class LocalState permits LocalMiss {
    static final byte[] ZERO = {'0'};

    final Transport transport;
    final FdCache fds;
    final Recovery recovery;
    final Leases leases;
    final Counters counters;
    final SlotTable table;
    final UsageReports reports;
    final long budgetNs, releaseNs, idleNs, tickNs;
    final boolean failClosed;
    /**
     * The process's own record of each entry's HOLD lease (null: the agent does not back it):
     * releases and re-declarations use this, never what the table says, so a scribbled table
     * cannot make the client release or re-declare anything it was not granted.
     */
    record Hold(long slot, long quota, long lease, Connection conn) {}
    final AtomicReferenceArray<Hold> holds;
    /**
     * Each entry's usage batch (spec "Local leasing": the client may sum several invocations'
     * usage from one pair of readings). The slot's counters are cumulative, so warm invocations
     * of one action on one entry need no reading of their own: the counters are read when the
     * batch ends (it is {@link #batchNs} old at a release, another action claims the entry, an
     * invocation asks for its own usage, the entry idles or is dropped) and the difference goes to
     * USAGE for all of them. Fields are guarded by the entry's claim (the table's state word
     * orders them between the threads that take turns holding it).
     */
    static final class Batch {
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
    final Batch[] batches;
    /** Entries whose lease must be re-declared (their connection died). */
    final AtomicReferenceArray<Boolean> reclaim;
    /**
     * Per thread: [0] the entry it used last (-1 = none), [1] its kernel tid (a platform
     * thread's never changes: read once, not with a system call per invocation).
     */
    final ThreadLocal<int[]> perThread = ThreadLocal.withInitial(() -> new int[]{-1, Native.gettid()});
    /** The connection HOLD leases are held on (borrowHold); holdLock picks a new one. */
    volatile Connection holdConn;
    final Object holdLock = new Object();
    volatile Thread worker;
    volatile boolean closed;
    /** A batch of warm invocations on an entry this old is read at the release that ends it. */
    volatile long batchNs = BATCH_NS;
    static final long BATCH_NS = 100_000_000L;
    /** A free entry idle this long has its pending batch read by the background thread. */
    static final long BATCH_IDLE_NS = 1_000_000_000L;
    /** Rounds between HOLD_LIST requests (the agent answers a process at most 5 a second). */
    static final long HOLD_LIST_EVERY_NS = 1_000_000_000L;

    LocalState(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
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
        this.holds = new AtomicReferenceArray<>(table.capacity());
        this.reclaim = new AtomicReferenceArray<>(table.capacity());
        this.batches = new Batch[table.capacity()];
        for (int i = 0; i < batches.length; i++) batches[i] = new Batch();
    }

    SlotTable table() { return table; }
    UsageReports reports() { return reports; }

    final void count(String name) { counters.count(name); }
    /** Counted on every invocation: held, not looked up by name each time. */
    final java.util.concurrent.atomic.LongAdder hits, releases, batchReads;

    final SlotLease lease(int i, long s, String act, String inv, long quota, int tid, int outcome, int place) {
        SlotLease l = new SlotLease(leases, act, inv, quota, tid, null);
        l.local = (LocalLeases) this; // the only kind there is (sealed): a compare the JIT folds
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
    final void closeBatch(int i, long slot, long now) {
        Batch b = batches[i];
        if (b.total == 0) return; // nothing pending: no read
        String action = b.action;
        heard(action, closeBatch(b, fds.readCounters(slot), now));
    }

    /** Gets the usage of each batch of more than one invocation: see {@link SlotClient#onBatchRead}. */
    volatile java.util.function.BiConsumer<String, Usage> batchRead;

    final void heard(String action, Usage u) {
        java.util.function.BiConsumer<String, Usage> to = batchRead;
        if (!u.measured() || to == null) return;
        try {
            to.accept(action, u);
        } catch (RuntimeException e) {
            count("local.listener_error");
        }
    }

    final Usage closeBatch(Batch b, SlotCounters end, long now) {
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

    final void wake() {
        Thread w = worker;
        if (w != null) LockSupport.unpark(w);
    }
}
