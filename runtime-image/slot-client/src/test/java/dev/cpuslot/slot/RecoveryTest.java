package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;

import static org.junit.jupiter.api.Assertions.*;

/** Re-declaring leases after a lost connection, alone: a fake transport that fails on demand. */
class RecoveryTest {
    final Counters counters = new Counters();
    final FakeTransport transport = new FakeTransport();
    final FakeFds ops = new FakeFds();
    final FdCache fds = new FdCache(ops, counters);
    final Recovery recovery = new Recovery(transport, fds, counters, 1_000_000_000L, 1_000_000_000L, 1_000_000_000L);
    final Leases leases = new Leases(transport, fds, recovery, counters, 1_000_000_000L, 1_000_000_000L, 0, false, true);

    @BeforeEach
    void setUp() {
        assertTrue(Native.available(), "acquire reads the thread's kernel tid: " + Native.loadError());
        transport.listener = recovery;
        transport.script = m -> {
            if (m instanceof Protocol.Acquire a)
                return new Protocol.AcquireOk(100, 3, a.quotaMilli(), 100_000, Protocol.OUTCOME_CACHE_HIT, 0, Protocol.PLACE_DONE, 0);
            throw new AssertionError("unexpected " + m);
        };
    }

    /** A lease held on a connection that the agent then dropped. */
    SlotLease orphaned() {
        SlotLease l = leases.acquire(250, "act", "inv");
        assertTrue(l.active(), l.toString());
        transport.dropConnection();
        assertEquals(1, recovery.orphanCount(), "a dead connection's lease is an orphan");
        return l;
    }

    @Test
    void whileTheAgentIsAwayOrphansStayAndAreReclaimedOnceItAnswers() {
        SlotLease l = orphaned();
        transport.connectError = new IOException("connection refused");
        recovery.checkOnce();
        recovery.checkOnce();
        assertEquals(1, recovery.orphanCount(), "still away: try again later");
        assertEquals(0, transport.count(Protocol.Reclaim.class));

        transport.connectError = null;
        transport.script = m -> {
            Protocol.Reclaim r = (Protocol.Reclaim) m;
            assertEquals(3, r.slot());
            assertEquals(250, r.quotaMilli());
            assertEquals(Native.gettid(), r.tid());
            assertEquals("act", r.action());
            assertEquals("inv", r.invocation());
            return new Protocol.AcquireOk(200, 3, 250, 100_000, Protocol.OUTCOME_CACHE_HIT, 0, Protocol.PLACE_NONE, 0);
        };
        recovery.checkOnce();
        assertEquals(0, recovery.orphanCount());
        assertEquals(200, l.lease, "the new agent's lease id");
        assertTrue(transport.isAlive(l.conn));
        assertTrue(l.conn.leases.contains(l));
        assertEquals(1, counters.get("reclaim.ok"));
    }

    @Test
    void aLeaseTheNewAgentDoesNotKnowIsLostAndItsReleaseSendsNothing() {
        SlotLease l = orphaned();
        transport.script = m -> new Protocol.Error(Protocol.E_UNKNOWN_LEASE, 0, "no such slot");
        recovery.checkOnce();
        assertTrue(l.lost());
        assertEquals(0, recovery.orphanCount());
        int sent = transport.sent.size();
        assertEquals(Usage.NONE, l.release(ReleaseOutcome.OK));
        assertEquals(sent, transport.sent.size());
        assertEquals(1, counters.get("release.lost"));
    }

    @Test
    void aReclaimThatFailsKillsItsConnectionAndTheLeaseStaysOrphaned() {
        SlotLease l = orphaned();
        transport.script = m -> { throw new IOException("connection reset"); };
        recovery.checkOnce();
        assertEquals(2, transport.killed.size(), "the first and the reclaiming connection");
        assertFalse(l.lost());
        assertEquals(1, recovery.orphanCount());
    }

    @Test
    void releaseReclaimsFirstAndWaitsForTheAgentsUsage() {
        SlotLease l = orphaned();
        transport.script = m -> switch (m) {
            case Protocol.Reclaim r -> new Protocol.AcquireOk(300, 3, 250, 100_000, Protocol.OUTCOME_CACHE_HIT, 0, Protocol.PLACE_NONE, 0);
            case Protocol.Release r -> {
                assertEquals(300, r.lease());
                assertEquals(0, r.flags(), "after a reconnect the release waits for the reply");
                yield new Protocol.ReleaseOk(42, 0, 1, 0);
            }
            default -> throw new AssertionError("unexpected " + m);
        };
        assertEquals(new Usage(true, 42, 0, 1, 0), l.release(ReleaseOutcome.OK));
        assertEquals(0, recovery.orphanCount());
        assertEquals(1, counters.get("release.ok"));
    }

    @Test
    void aReleasedLeaseIsNoLongerAnOrphan() {
        SlotLease l = orphaned();
        transport.connectError = new IOException("connection refused");
        assertEquals(Usage.NONE, l.release(ReleaseOutcome.OK));
        assertEquals(1, counters.get("release.unreachable"));
        assertEquals(0, recovery.orphanCount());
        recovery.checkOnce();
        assertEquals(0, transport.count(Protocol.Reclaim.class));
    }

    @Test
    void aDrainThatFailsKillsTheConnection() {
        SlotLease l = leases.acquire(250, "act", "inv");
        transport.late = m -> { throw new IOException("agent closed the connection"); };
        recovery.drainNow(l.conn);
        assertEquals(1, transport.killed.size());
        assertEquals(1, recovery.orphanCount(), "its lease is re-declared later");
    }
}
