package dev.cpuslot.slot;

import java.io.IOException;
import java.util.concurrent.TimeoutException;

/**
 * Local leasing's reclaim (see {@link LocalState}): the entries a lost connection held are
 * re-declared with RECLAIM on a new one (an agent restart), or dropped when the agent no longer
 * backs them.
 */
abstract sealed class LocalReclaim extends LocalAcquire permits LocalUpkeep {
    LocalReclaim(Transport transport, FdCache fds, Recovery recovery, Leases leases, Counters counters, SlotTable table,
                 long budgetNs, long releaseNs, long idleNs, long tickNs, boolean failClosed) {
        super(transport, fds, recovery, leases, counters, table, budgetNs, releaseNs, idleNs, tickNs, failClosed);
    }

    /** A connection died: the entries it granted are re-declared on a new one. */
    void lost(Connection c) {
        for (int i = 0; i < holds.length(); i++) {
            Hold h = holds.get(i);
            if (h != null && h.conn() == c) reclaim.set(i, Boolean.TRUE);
        }
    }

    /** A connection said HELLO: re-declare what waits. */
    void connected(Connection c) { wake(); }

    /** Re-declares (RECLAIM, tid 0) each entry whose connection died. */
    void reclaimOnce() {
        for (int i = 0; i < table.used(); i++) {
            if (reclaim.get(i) == null) continue;
            Hold h = holds.get(i);
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
                holds.set(i, new Hold(slot, h.quota(), ok.lease(), c));
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
            holds.set(i, null); // nothing to release when dropped
            table.markGone(i);
            reclaim.set(i, null);
            count("local.reclaim_refused");
        }
    }
}
