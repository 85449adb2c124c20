package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/**
 * SLEEP and WAKE (spec: "Lending"): sent only to an agent that announced LEND, one-way, on the
 * lease's own connection, with its RELEASE after them on the same one.
 */
class LendingTest extends LocalFixture {
    static final int SLEEP = Protocol.RELEASE_SLEEP | Protocol.RELEASE_NO_REPLY;
    static final int WAKE = Protocol.RELEASE_WAKE | Protocol.RELEASE_NO_REPLY;

    @BeforeEach
    void setUp() {
        transport.script = this::agent;
    }

    /** Each grant a new slot. */
    synchronized Object agent(Protocol.Message m) {
        if (m instanceof Protocol.Acquire a) return grant(a);
        if (m instanceof Protocol.Reclaim r) return reclaimed(r);
        if (m instanceof Protocol.Release) return new Protocol.ReleaseOk(7, 0, 1, 0);
        throw new AssertionError("unexpected " + m);
    }

    Leases leases(long lingerNs) { return leases(S, S, lingerNs); }

    LocalLeases local(Leases leases) throws Native.NativeException { return local(leases, 4, S, S); }

    /** The RELEASEs sent after the ACQUIRE, with their connections. */
    List<FakeTransport.Sent> releases() {
        return transport.log.stream().filter(s -> s.m() instanceof Protocol.Release).toList();
    }

    static Protocol.Release rel(FakeTransport.Sent s) { return (Protocol.Release) s.m(); }

    @Test
    void withoutLendNothingIsSent() {
        agentFlags(0);
        SlotLease a = leases(0).acquire(250, "act", "inv");
        assertTrue(a.active(), a.toString());
        assertFalse(a.sleep(), "an agent without LEND would take SLEEP for a RELEASE");
        a.wake();
        assertFalse(a.sleeping());
        assertEquals(1, transport.sent.size(), "the ACQUIRE only");
        a.release(ReleaseOutcome.OK);
        assertEquals(0, rel(releases().getFirst()).flags() & (Protocol.RELEASE_SLEEP | Protocol.RELEASE_WAKE));
    }

    @Test
    void sleepWakeAndReleaseGoInOrderOnTheLeasesOwnConnection() {
        agentFlags(Protocol.HELLO_OK_LEND);
        Leases ls = leases(0);
        SlotLease a = ls.acquire(250, "act", "inv");
        Connection own = a.conn;
        transport.openAnother(); // any other request would now go on another connection
        assertTrue(a.sleep());
        assertTrue(a.sleep(), "a sleeping lease stays asleep");
        a.wake();
        a.wake();
        assertFalse(a.sleeping());
        a.release(ReleaseOutcome.OK);
        List<FakeTransport.Sent> rs = releases();
        assertEquals(3, rs.size(), rs.toString());
        assertEquals(new Protocol.Release(a.lease, 0, SLEEP), rel(rs.get(0)));
        assertEquals(new Protocol.Release(a.lease, 0, WAKE), rel(rs.get(1)));
        assertEquals(new Protocol.Release(a.lease, 0, Protocol.RELEASE_NO_REPLY), rel(rs.get(2)));
        for (FakeTransport.Sent s : rs) assertSame(own, s.on(), "on the lease's own connection: " + s);
        assertEquals(1, counters.get("lend.sleep"));
        assertEquals(1, counters.get("lend.wake"));
    }

    @Test
    void aWakeWithoutASleepSendsNothingAndAReleasedLeaseNeitherSleepsNorWakes() {
        agentFlags(Protocol.HELLO_OK_LEND);
        SlotLease a = leases(0).acquire(250, "act", "inv");
        a.wake();
        a.release(ReleaseOutcome.OK);
        assertFalse(a.sleep());
        a.wake();
        assertEquals(1, releases().size(), "the RELEASE only: " + releases());
    }

    @Test
    void aLingeringLeaseIsWokenBeforeItIsKept() {
        agentFlags(Protocol.HELLO_OK_LEND);
        Leases ls = leases(60 * S);
        SlotLease a = ls.acquire(250, "act", "inv");
        assertTrue(a.sleep());
        a.release(ReleaseOutcome.OK); // forgot to wake: the next invocation must not run "asleep"
        assertEquals(1, ls.parkedCount());
        List<FakeTransport.Sent> rs = releases();
        assertEquals(2, rs.size(), rs.toString());
        assertEquals(WAKE, rel(rs.get(1)).flags());
        SlotLease b = ls.acquire(250, "act", "inv-2");
        assertTrue(b.reused());
        assertFalse(b.sleeping());
        ls.close();
    }

    @Test
    void aWakeAfterALostConnectionGoesToTheReDeclaredLease() {
        agentFlags(Protocol.HELLO_OK_LEND);
        SlotLease a = leases(0).acquire(250, "act", "inv");
        long before = a.lease;
        assertTrue(a.sleep());
        transport.dropConnection();
        a.wake();
        assertNotEquals(before, a.lease, "re-declared under a new id");
        List<FakeTransport.Sent> rs = releases();
        assertEquals(new Protocol.Release(a.lease, 0, WAKE), rel(rs.getLast()), "the agent keeps the sleep under the new id");
        assertSame(a.conn, rs.getLast().on());
        assertFalse(a.sleeping());
    }

    @Test
    void aLocalLeaseSleepsThroughItsHoldLeaseOnTheConnectionThatHoldsIt() throws Exception {
        agentFlags(Protocol.HELLO_OK_LOCAL | Protocol.HELLO_OK_LEND);
        Leases ls = leases(0);
        LocalLeases local = local(ls);
        SlotLease a = local.acquire(250, "act", "inv");
        assertTrue(a.active() && a.local(), a.toString());
        Connection own = transport.log.getFirst().on();
        long hold = table.lease(a.entry);
        transport.openAnother();
        assertTrue(a.sleep());
        a.release(ReleaseOutcome.OK); // a release of a sleeper gives the entry back awake
        List<FakeTransport.Sent> rs = releases();
        assertEquals(2, rs.size(), rs.toString());
        assertEquals(new Protocol.Release(hold, 0, SLEEP), rel(rs.get(0)));
        assertEquals(new Protocol.Release(hold, 0, WAKE), rel(rs.get(1)));
        for (FakeTransport.Sent s : rs) assertSame(own, s.on());
        assertFalse(table.gone(a.entry));
        local.close();
    }

    @Test
    void aLocalLeaseWithoutLendSendsNothing() throws Exception {
        agentFlags(Protocol.HELLO_OK_LOCAL);
        LocalLeases local = local(leases(0));
        SlotLease a = local.acquire(250, "act", "inv");
        assertFalse(a.sleep());
        a.release(ReleaseOutcome.OK);
        assertEquals(0, releases().size());
        local.close();
    }

    @Test
    void aLocalWakeThatCannotGoOutGivesTheHeldSlotBack() throws Exception {
        agentFlags(Protocol.HELLO_OK_LOCAL | Protocol.HELLO_OK_LEND);
        LocalLeases local = local(leases(0));
        SlotLease a = local.acquire(250, "act", "inv");
        assertTrue(a.sleep());
        transport.dropConnection(); // the background thread has not re-declared it yet
        a.wake();
        assertTrue(table.gone(a.entry), "its lease is released once free: that ends the sleep");
        assertEquals(1, counters.get("lend.unsent"));
        a.release(ReleaseOutcome.OK);
        local.close();
    }
}
