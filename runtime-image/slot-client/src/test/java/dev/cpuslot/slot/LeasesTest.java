package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.concurrent.TimeoutException;

import static org.junit.jupiter.api.Assertions.*;

/** Acquire, release and lingering alone: a fake transport and fds on made-up numbers. */
class LeasesTest {
    static final long LINGER = 1_000_000_000L;

    final Counters counters = new Counters();
    final FakeTransport transport = new FakeTransport();
    final FakeFds ops = new FakeFds();
    final FdCache fds = new FdCache(ops, counters);
    final Recovery recovery = new Recovery(transport, fds, counters, 1_000_000_000L, 1_000_000_000L, 1_000_000_000L);
    long nextLease = 100;
    /** Fd numbers the fake agent hands out: slot*10 places, slot*10+1 counts. */
    boolean passFds = true;
    final java.util.Set<Long> granted = new java.util.HashSet<>();
    int place = Protocol.PLACE_SELF;

    @BeforeEach
    void setUp() {
        assertTrue(Native.available(), "acquire reads the thread's kernel tid: " + Native.loadError());
        transport.listener = recovery;
        transport.script = this::agent;
    }

    Leases leases(long lingerNs, boolean failClosed) {
        return new Leases(transport, fds, recovery, counters, 1_000_000_000L, 1_000_000_000L, lingerNs, failClosed, true);
    }

    /** A well-behaved agent: slot = quota / 250; fds on the first grant of each slot. */
    Object agent(Protocol.Message m) {
        if (m instanceof Protocol.Acquire a) {
            long slot = a.quotaMilli() / 250;
            boolean first = granted.add(slot) && passFds;
            int[] f = first ? new int[]{(int) slot * 10, (int) slot * 10 + 1} : new int[0];
            if (first) ops.counters.put((int) slot * 10 + 1, new SlotCounters(0, 0, 0, 0));
            var ok = new Protocol.AcquireOk(++nextLease, slot, a.quotaMilli(), 100_000,
                    a.currentSlot() == slot ? Protocol.OUTCOME_AFFINITY_HIT : Protocol.OUTCOME_CACHE_HIT, 0,
                    a.currentSlot() == slot ? Protocol.PLACE_NONE : place, f.length);
            return new Transport.Reply(new Protocol.Frame(1, ok.type(), 1, ok), f);
        }
        if (m instanceof Protocol.Release) return new Protocol.ReleaseOk(7, 0, 1, 0);
        throw new AssertionError("unexpected " + m);
    }

    @Test
    void acquirePlacesTheThreadThroughTheCachedFdAndReleasesOneWayWithTheCountersUsage() {
        Leases l = leases(0, false);
        SlotLease a = l.acquire(250, "act", "inv-1");
        assertTrue(a.active(), a.toString());
        Protocol.Acquire sent = (Protocol.Acquire) transport.sent.getFirst();
        assertEquals(Native.gettid(), sent.tid());
        assertEquals(0, sent.currentSlot());
        assertEquals(List.of(new FakeFds.Write(10, "0")), ops.writes, "\"0\" to the placement fd only");
        ops.counters.put(11, new SlotCounters(3_000, 10, 2, 1));
        Usage u = a.release(ReleaseOutcome.OK);
        assertEquals(new Usage(true, 3_000, 10, 2, 1), u);
        Protocol.Release r = (Protocol.Release) transport.oneWay.getFirst();
        assertEquals(a.lease, r.lease());
        assertEquals(Protocol.RELEASE_NO_REPLY, r.flags());
        assertEquals(Usage.NONE, a.release(ReleaseOutcome.OK), "a second release is a no-op");
        assertEquals(2, transport.sent.size());

        SlotLease b = l.acquire(250, "act", "inv-2");
        assertEquals(1, ((Protocol.Acquire) transport.sent.get(2)).currentSlot(), "the thread says where it sits");
        assertEquals("none", b.place());
        assertEquals(1, ops.writes.size(), "already in the slot: no write");
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void withoutCounterFdsTheReleaseWaitsForTheAgentsUsage() {
        passFds = false;
        place = Protocol.PLACE_DONE;
        Leases l = leases(LINGER, false);
        SlotLease a = l.acquire(500, "act", "inv");
        assertEquals("done", a.place());
        assertEquals(new Usage(true, 7, 0, 1, 0), a.release(ReleaseOutcome.OK));
        assertTrue(transport.oneWay.isEmpty());
        assertEquals(0, l.parkedCount(), "without counters nothing lingers");
        assertEquals(1, counters.get("release.ok"));
    }

    @Test
    void aLingeringLeaseIsReusedForTheSameActionAndQuotaAndEndsOnAnotherOrOnExpiry() {
        Leases l = leases(LINGER, false);
        SlotLease a = l.acquire(250, "act", "inv-1");
        a.release(ReleaseOutcome.OK);
        assertEquals(1, l.parkedCount());
        assertEquals(1, transport.sent.size(), "parking sends nothing");

        SlotLease b = l.acquire(250, "act", "inv-2");
        assertTrue(b.reused());
        assertEquals(a.lease, b.lease);
        assertEquals("inv-2", b.invocation());
        assertEquals(1, transport.sent.size(), "reuse sends nothing");
        b.release(ReleaseOutcome.OK);

        SlotLease c = l.acquire(500, "act", "inv-3"); // another quota: the lingering lease ends first
        assertFalse(c.reused());
        assertEquals(a.lease, ((Protocol.Release) transport.sent.get(1)).lease());
        assertInstanceOf(Protocol.Acquire.class, transport.sent.get(2));
        c.release(ReleaseOutcome.OK);

        l.expireOnce(c.parkedAt + LINGER - 1);
        assertEquals(1, l.parkedCount(), "not idle long enough");
        l.expireOnce(c.parkedAt + LINGER);
        assertEquals(0, l.parkedCount());
        assertEquals(c.lease, ((Protocol.Release) transport.sent.getLast()).lease());
        assertEquals(1, counters.get("linger.expired"));
    }

    @Test
    void aFailedInvocationDoesNotLingerAndCloseReleasesLingeringLeases() {
        Leases l = leases(LINGER, false);
        l.acquire(250, "act", "inv-1").release(ReleaseOutcome.FAILED);
        assertEquals(0, l.parkedCount());
        SlotLease b = l.acquire(250, "act", "inv-2");
        b.release(ReleaseOutcome.OK);
        assertEquals(1, l.parkedCount());
        l.close();
        assertEquals(0, l.parkedCount());
        assertEquals(b.lease, ((Protocol.Release) transport.sent.getLast()).lease());
        assertEquals("closed", l.acquire(250, "act", "inv-3").reason());
    }

    @Test
    void fdsThatDoNotMatchTheAnswerAreClosedAndTheLeaseGoesBack() {
        transport.script = m -> {
            if (m instanceof Protocol.Acquire) {
                var ok = new Protocol.AcquireOk(5, 1, 250, 100_000, Protocol.OUTCOME_CREATED, 0, Protocol.PLACE_SELF, 2);
                return new Transport.Reply(new Protocol.Frame(1, ok.type(), 1, ok), new int[]{77});
            }
            return new Protocol.ReleaseOk(0, 0, 0, 0);
        };
        SlotLease a = leases(0, false).acquire(250, "act", "inv");
        assertEquals("fd_mismatch", a.reason());
        assertTrue(ops.closed.contains(77));
        assertEquals(ReleaseOutcome.PLACEMENT_FAILED.code(), ((Protocol.Release) transport.sent.getLast()).outcome());
    }

    /** An ERROR grants nothing: fds that come with one (a faulty or hostile agent) are closed. */
    @Test
    void fdsThatComeWithAnErrorAreClosed() {
        transport.script = m -> {
            var e = new Protocol.Error(Protocol.E_REJECTED, 0, "with fds");
            return new Transport.Reply(new Protocol.Frame(1, e.type(), 1, e), new int[]{78, 79});
        };
        SlotLease a = leases(0, false).acquire(250, "act", "inv");
        assertFalse(a.active());
        assertTrue(ops.closed.containsAll(List.of(78, 79)), "closed: " + ops.closed);
    }

    @Test
    void aFailedPlacementGivesNoSlotAndReleasesAsPlacementFailed() {
        ops.writeError = new Native.NativeException("write: EACCES", 13);
        SlotLease a = leases(0, false).acquire(250, "act", "inv");
        assertEquals("placement_failed", a.reason());
        assertEquals(ReleaseOutcome.PLACEMENT_FAILED.code(), ((Protocol.Release) transport.sent.getLast()).outcome());
        assertTrue(transport.oneWay.isEmpty(), "a failed placement is released with a reply");
    }

    @Test
    void agentErrorsBecomeTheReasonNotReadyIsRetriedAndFailClosedThrows() {
        int[] calls = {0};
        transport.script = m -> ++calls[0] == 1 ? new Protocol.Error(Protocol.E_NOT_READY, 1, "warming") : agent(m);
        assertTrue(leases(0, false).acquire(250, "act", "inv").active());
        assertEquals(2, calls[0]);

        transport.script = m -> new Protocol.Error(Protocol.E_REJECTED, 0, "over budget");
        assertEquals("REJECTED", leases(0, false).acquire(250, "act", "inv").reason());
        SlotUnavailableException e = assertThrows(SlotUnavailableException.class, () -> leases(0, true).acquire(250, "act", "inv"));
        assertEquals("REJECTED", e.reason());
        assertEquals("invalid_quota", leases(0, false).acquire(0, "act", "inv").reason());
    }

    @Test
    void aTimedOutAcquireIsDrainedAndTheLateLeaseReleased() throws Exception {
        transport.script = m -> {
            if (m instanceof Protocol.Acquire) throw new TimeoutException();
            return new Protocol.ReleaseOk(0, 0, 0, 0);
        };
        var late = new Protocol.AcquireOk(9, 2, 500, 100_000, Protocol.OUTCOME_CACHE_HIT, 0, Protocol.PLACE_SELF, 2);
        transport.late = m -> new Transport.Reply(new Protocol.Frame(1, late.type(), 1, late), new int[]{20, 21});
        SlotLease a = leases(0, false).acquire(500, "act", "inv");
        assertEquals("budget", a.reason());
        long until = System.nanoTime() + 30_000_000_000L;
        while (counters.get("drain.released") == 0 && System.nanoTime() < until) Thread.sleep(5);
        assertEquals(1, counters.get("drain.released"), "the drainer never released the late lease: " + counters.snapshot());
        Protocol.Release r = (Protocol.Release) transport.sent.getLast();
        assertEquals(9, r.lease());
        assertEquals(ReleaseOutcome.TIMEOUT.code(), r.outcome());
        assertEquals(1, fds.size(), "the late answer's fds are cached, not leaked");
    }
}
