package dev.cpuslot.slot;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.LockSupport;

/**
 * Local leasing's upkeep (see {@link LocalState}): the background thread's rounds, which send usage
 * batches as USAGE, free entries of dead threads, ask HOLD_LIST and give back what the agent wants back,
 * and drop idle and GONE entries.
 */
abstract sealed class LocalUpkeep extends LocalReclaim permits LocalLeases {
    LocalUpkeep(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
                long budgetNs, long releaseNs, long idleNs, long tickNs, boolean failClosed) {
        super(transport, fds, recovery, leases, counters, table, budgetNs, releaseNs, idleNs, tickNs, failClosed);
    }

    private long lastReport, lastHoldList;
    void start() {
        worker = recovery.thread("cpuslot-local", this::loop);
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
        holdListOnce(now);
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
            if (holds.get(i) == null) continue;
            long s = table.state(i);
            int h = SlotTable.hold(s);
            if (h == 0 || h == SlotTable.CONTROL || h < 0 || h > (1 << 22)) continue;
            if (Native.threadGone(h) && table.freeDead(i, s, now)) count("local.freed_dead");
        }
    }

    /**
     * Asks HOLD_LIST, at most once a second and only while the process holds slots, of an agent that
     * announced it (an older agent is never asked), and applies the answer.
     */
    void holdListOnce(long now) {
        if (now - lastHoldList < HOLD_LIST_EVERY_NS) return;
        boolean any = false;
        for (int i = 0; i < table.used() && !any; i++) any = holds.get(i) != null;
        if (!any) return;
        long deadline = System.nanoTime() + releaseNs;
        Connection c = holdConn;
        try {
            if (c == null) return;
            transport.borrow(c, System.nanoTime()); // not behind a HOLD that waits: next round
        } catch (IOException | TimeoutException e) {
            return;
        }
        if (c.hello == null || (c.hello.flags() & Protocol.HELLO_OK_HOLD_LIST) == 0 || (c.hello.flags() & Protocol.HELLO_OK_LOCAL) == 0) {
            transport.giveBack(c);
            return;
        }
        lastHoldList = now;
        Transport.Reply r = recovery.callOrDrop(c, new Protocol.HoldList(), deadline);
        if (r == null) return;
        transport.giveBack(c);
        fds.discard(r.fds());
        if (r.message() instanceof Protocol.HoldListOk ok) {
            count("local.hold_list");
            giveBack(ok, now);
        } else {
            count("local.hold_list_refused"); // REJECTED for the rate: next round
        }
    }

    /**
     * Applies a HOLD_LIST_OK: each entry takes its lease's current grant (quota, DEGRADED), and entries
     * adding up to give_back_m are given back: free ones now, least recently used first; busy ones
     * are marked GONE (no new claim takes them) and dropped by dropIdle once their invocation ends.
     */
    void giveBack(Protocol.HoldListOk ok, long now) {
        listedBudget = ok.budgetMilli();
        Map<Long, Protocol.HoldLease> byLease = new HashMap<>();
        for (Protocol.HoldLease l : ok.leases()) byLease.put(l.lease(), l);
        long want = ok.giveBackMilli();
        List<Integer> free = new ArrayList<>(), busy = new ArrayList<>();
        for (int i = 0; i < table.used(); i++) {
            Hold h = holds.get(i);
            if (h == null || table.slot(i) != h.slot()) continue;
            Protocol.HoldLease l = byLease.get(h.lease());
            if (l != null && l.slot() == h.slot()) {
                table.setGranted(i, l.quotaMilli(), (l.flags() & Protocol.HOLD_DEGRADED) != 0);
                holds.compareAndSet(i, h, h = new Hold(h.slot(), l.quotaMilli(), h.lease(), h.conn()));
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
            Hold h = holds.get(i);
            if (h == null) continue;
            int d = dropHeld(i, now);
            if (d == UNSENT) return; // the agent is away: next round
            if (d == KEPT) table.markGone(i); // claimed meanwhile: given back once free
            count("local.given_back");
            want -= Math.min(want, h.quota());
        }
        for (int i : busy) {
            if (want == 0) return;
            Hold h = holds.get(i);
            if (h == null) continue;
            table.markGone(i);
            count("local.given_back");
            want -= Math.min(want, h.quota());
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
            // a lease the agent still backs is released, by the process's own record
            int d = dropHeld(i, now);
            if (d != KEPT) count(gone ? "local.dropped_gone" : "local.dropped_idle");
            if (d == UNSENT) return; // the agent is away: its lease ends with our connections
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
            if (holds.get(i) == null || table.slot(i) == 0 || SlotTable.hold(table.state(i)) != 0) continue;
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
}
