package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.*;

/** Local leasing alone: a fake transport (an agent granting HOLD leases) and fds on made-up numbers. */
class LocalLeasesTest extends LocalFixture {
    static final long IDLE = 30 * S;

    final Leases leases = leases(S, S, 0);
    LocalLeases local;
    /** What the fake agent answers RECLAIM with (null: a new lease for the same slot). */
    volatile Protocol.Message reclaimAnswer;
    /** What the fake agent answers HOLD_LIST with. */
    volatile Protocol.Message holdListAnswer;
    /** The fake agent's admission budget (0: none): a HOLD request the held leases leave no room for is refused. */
    volatile long budget;
    /** The quotas of the HOLD requests the fake agent refused for budget. */
    final List<Long> overBudget = new java.util.concurrent.CopyOnWriteArrayList<>();
    /** The quota of each HOLD lease the fake agent granted. */
    final java.util.Map<Long, Long> grantedQuota = new java.util.HashMap<>();

    @BeforeEach
    void setUp() throws Exception {
        agentFlags(Protocol.HELLO_OK_LOCAL);
        transport.script = this::agent;
        local = local(leases, 4, S, S);
        local.batchNs = 0; // every release reads the counters; the batching tests set their own
    }

    /** Each HOLD grant is a new slot. */
    synchronized Object agent(Protocol.Message m) {
        if (m instanceof Protocol.Acquire a) {
            assertEquals(Protocol.ACQUIRE_HOLD, a.flags(), "a HOLD lease");
            assertEquals(0, a.tid());
            assertEquals(0, a.currentSlot());
            assertEquals("", a.action());
            assertEquals("", a.invocation());
            if (budget > 0) {
                long held = a.quotaMilli();
                for (var g : grantedQuota.entrySet())
                    if (!releases().contains(new Protocol.Release(g.getKey(), 0, Protocol.RELEASE_NO_REPLY))) held += g.getValue();
                if (held > budget) {
                    overBudget.add(a.quotaMilli());
                    return new Protocol.Error(Protocol.E_TIMEOUT, 0, "no budget");
                }
            }
            Transport.Reply r = grant(a);
            grantedQuota.put(((Protocol.AcquireOk) r.message()).lease(), a.quotaMilli());
            return r;
        }
        if (m instanceof Protocol.HoldList) {
            if (holdListAnswer != null) return holdListAnswer;
            throw new AssertionError("HOLD_LIST with no answer set");
        }
        if (m instanceof Protocol.Reclaim r) {
            if (reclaimAnswer != null) return reclaimAnswer;
            return reclaimed(r);
        }
        throw new AssertionError("unexpected " + m);
    }

    /** Runs r on a new platform thread (another kernel tid) and waits. */
    static <T> T onOtherThread(java.util.function.Supplier<T> r) throws Exception {
        AtomicReference<T> out = new AtomicReference<>();
        Thread t = Thread.ofPlatform().start(() -> out.set(r.get()));
        t.join();
        return out.get();
    }

    @Test
    void aMissAsksForAHoldLeaseThenTheThreadsNextInvocationSendsAndWritesNothing() {
        SlotLease a = local.acquire(250, "guest/fib", "a1");
        assertNotNull(a);
        assertTrue(a.active() && a.local(), a.toString());
        assertEquals(1, transport.count(Protocol.Acquire.class));
        assertEquals(List.of(new FakeFds.Write(10, "0")), ops.writes, "placed itself with one write");
        assertEquals("self", a.place());
        int e = a.entry;
        assertEquals(Native.gettid(), SlotTable.hold(table.state(e)), "the entry is the thread's");
        assertEquals(101, table.lease(e));
        assertEquals(250, table.asked(e));

        ops.counters.put(11, new SlotCounters(4_000, 100, 3, 1));
        Usage u = a.release(ReleaseOutcome.OK);
        assertEquals(new Usage(true, 4_000, 100, 3, 1), u, "the invocation's usage, from the counters");
        assertEquals(0, SlotTable.hold(table.state(e)), "released with one store");
        assertTrue(table.idleSince(e) > 0);
        assertEquals(Usage.NONE, a.release(ReleaseOutcome.OK), "a second release is a no-op");

        int sent = transport.sent.size();
        SlotLease b = local.acquire(250, "guest/fib", "a2");
        assertEquals("none", b.place(), "the thread sits in the slot already");
        assertEquals("affinity_hit", b.outcome());
        assertEquals(sent, transport.sent.size(), "nothing sent to the agent");
        assertEquals(1, ops.writes.size(), "nothing written");
        b.release(ReleaseOutcome.FAILED);
        assertEquals(sent, transport.sent.size(), "release sends nothing either");
        assertEquals(2, counters.get("release.local"));
    }

    @Test
    void anotherThreadTakesAFreeEntryOfItsQuotaWithOneWriteAndAHeldOneIsNeverShared() throws Exception {
        SlotLease a = local.acquire(250, "f", "a1");
        // while the main thread holds slot 1, another thread misses and gets slot 2
        SlotLease b = onOtherThread(() -> local.acquire(250, "f", "b1"));
        assertNotEquals(a.slot(), b.slot());
        assertEquals(2, transport.count(Protocol.Acquire.class));
        b.release(ReleaseOutcome.OK);
        a.release(ReleaseOutcome.OK);
        // a third thread: both entries free, it sits in neither: one write, no message
        SlotLease c = onOtherThread(() -> local.acquire(250, "f", "c1"));
        assertEquals("self", c.place());
        assertEquals(2, transport.count(Protocol.Acquire.class), "a free entry of the quota: no miss");
        c.release(ReleaseOutcome.OK);
        // another quota is a miss
        SlotLease d = local.acquire(500, "f", "d1");
        assertEquals(3, transport.count(Protocol.Acquire.class));
        assertEquals(500, d.quotaMilli());
        d.release(ReleaseOutcome.OK);
    }

    @Test
    void usageGoesOutOffThePathSummedPerActionAndOutcomeAtMostOnceASecondOrEarlyAtEightKeys() {
        long now = System.nanoTime();
        ops.counters.put(11, new SlotCounters(0, 0, 0, 0));
        for (int k = 0; k < 3; k++) {
            SlotLease l = local.acquire(250, "guest/a", "i" + k);
            ops.counters.put(11, new SlotCounters(l.start.cpuNanos() + 1_000, l.start.throttledNanos() + 10, 0, 0));
            l.release(ReleaseOutcome.OK);
        }
        local.acquire(250, "guest/b", "x").release(ReleaseOutcome.TIMEOUT);
        assertTrue(transport.oneWay.isEmpty(), "nothing sent on the invocation path");
        local.reportOnce(now, false);
        Protocol.UsageReport r = (Protocol.UsageReport) transport.oneWay.getLast();
        assertEquals(List.of(new Protocol.UsageRecord("guest/a", 0, 3, 3_000, 30),
                new Protocol.UsageRecord("guest/b", Protocol.RELEASE_TIMEOUT, 1, 0, 0)), r.records());

        local.acquire(250, "guest/c", "y").release(ReleaseOutcome.OK);
        local.reportOnce(now + S / 2, false);
        assertEquals(1, transport.count(Protocol.UsageReport.class), "not again within a second");
        local.reportOnce(now + S, false);
        assertEquals(2, transport.count(Protocol.UsageReport.class), "a second later");

        for (int k = 0; k < 9; k++) local.acquire(250, "act-" + k, "z").release(ReleaseOutcome.OK);
        local.reportOnce(now + S + 1, false);
        assertEquals(3, transport.count(Protocol.UsageReport.class), "early at 8 keys");
        assertEquals(8, ((Protocol.UsageReport) transport.oneWay.getLast()).records().size());
        assertEquals(1, local.reports().keys(), "the ninth waits for the next second");
        local.close();
        assertEquals(4, transport.count(Protocol.UsageReport.class), "close sends what is pending");
    }

    @Test
    void usageThatCannotBeSentWaitsForTheAgent() {
        SlotLease l = local.acquire(250, "f", "1");
        l.release(ReleaseOutcome.OK);
        transport.dropConnection();
        transport.connectError = new IOException("agent away");
        local.reportOnce(System.nanoTime(), true);
        assertEquals(0, transport.count(Protocol.UsageReport.class));
        assertEquals(1, local.reports().keys());
        transport.connectError = null;
        local.reportOnce(System.nanoTime(), true);
        assertEquals(0, transport.count(Protocol.UsageReport.class), "usage goes where its leases are held: not re-declared yet");
        local.reclaimOnce();
        local.reportOnce(System.nanoTime(), true);
        assertEquals(List.of(new Protocol.UsageRecord("f", 0, 1, 0, 0)),
                ((Protocol.UsageReport) transport.oneWay.getLast()).records());
    }

    @Test
    void whileTheAgentIsAwayHeldSlotsAreStillClaimedAndAfterItReturnsTheyAreReDeclared() {
        SlotLease a = local.acquire(250, "f", "1");
        int e = a.entry;
        a.release(ReleaseOutcome.OK);
        transport.dropConnection(); // the agent restarts
        transport.connectError = new IOException("agent away");
        int sent = transport.sent.size();
        for (int k = 0; k < 3; k++) {
            SlotLease l = local.acquire(250, "f", "away-" + k);
            assertTrue(l.active(), "a held slot keeps serving while the agent is away: " + l);
            l.release(ReleaseOutcome.OK);
        }
        SlotLease other = local.acquire(750, "f", "miss");
        assertFalse(other.active(), "a miss fails open while the agent is away");
        assertEquals("unreachable", other.reason());
        local.tick(System.nanoTime());
        assertEquals(sent, transport.sent.size(), "nothing reaches an absent agent");

        transport.connectError = null;
        SlotLease busy = local.acquire(250, "f", "during-reclaim"); // re-declared while a thread uses it
        local.reclaimOnce();
        Protocol.Reclaim r = (Protocol.Reclaim) transport.sent.stream().filter(m -> m instanceof Protocol.Reclaim)
                .findFirst().orElseThrow();
        assertEquals(new Protocol.Reclaim(a.slot(), 250, 0, "", ""), r, "RECLAIM of the held slot with tid 0");
        assertEquals(nextLease, table.lease(e), "the new lease id is in the entry");
        busy.release(ReleaseOutcome.OK);
        local.reclaimOnce();
        assertEquals(1, transport.count(Protocol.Reclaim.class), "once");
    }

    @Test
    void aSlotTheRestartedAgentRefusesIsMarkedGoneAndDroppedWithoutARelease() {
        SlotLease a = local.acquire(250, "f", "1");
        int e = a.entry;
        a.release(ReleaseOutcome.OK);
        transport.dropConnection();
        reclaimAnswer = new Protocol.Error(Protocol.E_UNKNOWN_LEASE, 0, "no such slot");
        local.reclaimOnce();
        assertTrue(table.gone(e));
        long acquires = transport.count(Protocol.Acquire.class);
        SlotLease b = local.acquire(250, "f", "2");
        assertNotEquals(a.slot(), b.slot(), "nothing is claimed in a GONE entry: a miss");
        assertEquals(acquires + 1, transport.count(Protocol.Acquire.class));
        local.dropIdle(System.nanoTime());
        assertEquals(0, table.slot(e), "dropped once free");
        assertEquals(0, transport.count(Protocol.Release.class), "the agent does not back it: no RELEASE");
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void aSlotIdleForTheIdleTimeIsReleasedToTheAgent() {
        SlotLease a = local.acquire(250, "f", "1");
        int e = a.entry;
        long lease = table.lease(e);
        a.release(ReleaseOutcome.OK);
        long released = table.idleSince(e);
        local.dropIdle(released + IDLE - 1);
        assertEquals(0, transport.count(Protocol.Release.class), "not idle long enough");
        local.dropIdle(released + IDLE);
        Protocol.Release r = (Protocol.Release) transport.oneWay.getLast();
        assertEquals(new Protocol.Release(lease, 0, Protocol.RELEASE_NO_REPLY), r);
        assertEquals(0, table.slot(e), "the entry is empty");
        SlotLease b = local.acquire(250, "f", "2");
        assertEquals(2, transport.count(Protocol.Acquire.class), "the next invocation misses");
        local.dropIdle(System.nanoTime() + 10 * IDLE);
        assertEquals(1, transport.count(Protocol.Release.class), "a held entry is never dropped");
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void anAgentWithoutLocalLeasingLeavesThePerInvocationPath() {
        transport.hello = new Protocol.HelloOk(1, 1, 0, 1, 1, "old agent", 0, List.of());
        assertNull(local.acquire(250, "f", "1"), "the caller takes the old path");
        assertEquals(0, transport.count(Protocol.Acquire.class), "no HOLD asked of an agent that grants none");
        assertNull(local.acquire(250, "f", "2"));
        assertEquals(0, transport.connects.get(), "the agent's last HELLO_OK said no LOCAL: not asked again");
    }

    @Test
    void aMissAsksAsThePerInvocationPathDoesNotReadyIsRetriedAndAnErrorIsTheReason() {
        int[] calls = {0};
        transport.script = m -> m instanceof Protocol.Acquire && ++calls[0] == 1
                ? new Protocol.Error(Protocol.E_NOT_READY, 1, "warming") : agent(m);
        SlotLease a = local.acquire(250, "f", "1");
        assertTrue(a.active() && a.local(), a.toString());
        assertEquals(2, calls[0], "NOT_READY asked again within the budget");
        a.release(ReleaseOutcome.OK);

        transport.script = m -> m instanceof Protocol.Acquire ? new Protocol.Error(Protocol.E_REJECTED, 0, "over budget") : agent(m);
        SlotLease b = local.acquire(500, "f", "2"); // no entry of this quota: a miss
        assertEquals("REJECTED", b.reason(), "a miss's refusal is the lease's reason, as on the per-invocation path");
        assertEquals(1, counters.get("noslot.REJECTED"));
    }

    @Test
    void aFullTableGivesTheHoldBackAndLeavesTheCallToTheOldPath() throws Exception {
        List<SlotLease> held = new ArrayList<>();
        for (int k = 0; k < table.capacity(); k++) {
            held.add(onOtherThread(() -> local.acquire(250, "f", "x")));
        }
        assertNull(local.acquire(250, "f", "one too many"));
        Protocol.Release r = (Protocol.Release) transport.oneWay.getLast();
        assertEquals(nextLease, r.lease(), "the extra HOLD lease is released");
        for (SlotLease l : held) l.release(ReleaseOutcome.OK);
    }

    @Test
    void aSlotWithoutFdsIsTreatedAsGone() throws Exception {
        SlotLease a = onOtherThread(() -> local.acquire(250, "f", "1"));
        a.release(ReleaseOutcome.OK);
        fds.close(); // the process no longer holds the slot's fds
        SlotLease b = local.acquire(250, "f", "2");
        assertTrue(table.gone(a.entry));
        assertNotEquals(a.slot(), b.slot(), "a miss instead");
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void anEntryTheThreadNoLongerUsesStillIdlesOutWhileItRunsAnotherQuota() {
        SlotLease a = local.acquire(250, "f", "1");
        int e = a.entry;
        a.release(ReleaseOutcome.OK);
        long idle = table.idleSince(e), state = table.state(e);
        for (int k = 0; k < 3; k++) local.acquire(500, "g", "x" + k).release(ReleaseOutcome.OK);
        assertEquals(idle, table.idleSince(e), "another quota's invocations leave the 250m entry's idle time alone");
        assertEquals(state, table.state(e), "and do not claim it");
        local.dropIdle(idle + IDLE);
        assertEquals(0, table.slot(e), "so it idles out");
    }

    @Test
    void aScribbledTableCannotMakeTheClientReleaseOrReDeclareWhatItWasNotGranted() {
        SlotLease a = local.acquire(250, "f", "1");
        int e = a.entry;
        long granted = table.lease(e);
        a.release(ReleaseOutcome.OK);
        // an invocation of this process writes over its own table
        var m = table.memory();
        m.set(java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED, SlotTable.HEADER + 64L * e + SlotTable.LEASE, 999_999L);
        m.set(java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED, SlotTable.HEADER + 64L * e + SlotTable.QUOTA, 4000);
        transport.dropConnection();
        local.reclaimOnce();
        Protocol.Reclaim rc = (Protocol.Reclaim) transport.sent.stream().filter(x -> x instanceof Protocol.Reclaim).findFirst().orElseThrow();
        assertEquals(new Protocol.Reclaim(a.slot(), 250, 0, "", ""), rc, "re-declared as granted, not as the table says");
        long reclaimed = table.lease(e);
        assertNotEquals(granted, reclaimed);
        m.set(java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED, SlotTable.HEADER + 64L * e + SlotTable.LEASE, 999_999L);
        local.dropIdle(System.nanoTime() + 2 * IDLE);
        Protocol.Release r = (Protocol.Release) transport.oneWay.getLast();
        assertEquals(reclaimed, r.lease(), "the lease the agent granted is released, not the table's 999999");
    }

    // ---- giving back (spec: HOLD_LIST) ---------------------------------------------------------------

    /** The agent announces HOLD_LIST (and LOCAL). */
    void announceHoldList() {
        transport.hello = new Protocol.HelloOk(1, 1, Protocol.HELLO_OK_LOCAL | Protocol.HELLO_OK_HOLD_LIST, 1, 1, "fake", 0, List.of());
    }

    /** The one-way RELEASEs sent (USAGE aside). */
    List<Protocol.Message> releases() {
        return transport.oneWay.stream().filter(m -> m instanceof Protocol.Release).toList();
    }

    static Protocol.HoldListOk holdListOk(long budget, long giveBack, Protocol.HoldLease... ls) {
        return new Protocol.HoldListOk(budget, giveBack, List.of(ls));
    }

    /**
     * A miss whose HOLD request the process's own free entries of other quotas leave no room for
     * (spec: "Local leasing", making room): they are given back, least recently used first, before
     * the request (the budget HELLO_OK announced), or after the agent refused it for budget (none
     * announced). Before, the process kept them idle for 30 s while its calls of another quota
     * waited at the agent for budget and went on without a slot (e2e: a Knative pod's 100m calls
     * behind an idle 500m slot).
     */
    @Test
    void aMissGivesBackFreeEntriesOfOtherQuotasThatLeaveNoRoomWithTheBudgetAnnounced() throws Exception {
        missMakesRoom(true);
    }

    @Test
    void aMissGivesBackFreeEntriesOfOtherQuotasAfterARefusalForBudget() throws Exception {
        missMakesRoom(false);
    }

    private void missMakesRoom(boolean announced) throws Exception {
        budget = 1000;
        if (announced) transport.hello = new Protocol.HelloOk(1, 1, Protocol.HELLO_OK_LOCAL, 1, 1, "fake", budget, List.of());
        SlotLease big = local.acquire(750, "f", "a");
        big.release(ReleaseOutcome.OK);
        Thread.sleep(1); // idle_since apart
        SlotLease small = local.acquire(150, "f", "b");
        small.release(ReleaseOutcome.OK);
        SlotLease l = local.acquire(500, "f", "c");
        assertTrue(l != null && l.active() && l.quotaMilli == 500, "a 500m call beside 900m held idle in a 1000m budget: " + l);
        assertEquals(List.of(new Protocol.Release(big.lease, 0, Protocol.RELEASE_NO_REPLY)), releases(),
                "the least recently used free entry of another quota is given back, and only it (150m + 500m fit)");
        for (int i = 0; i < table.used(); i++) assertNotEquals(big.slot(), table.slot(i), "the 750m slot is in no entry");
        assertEquals(small.slot(), table.slot(small.entry), "the 150m entry is still held");
        assertEquals(announced ? 3 : 4, transport.count(Protocol.Acquire.class), "HOLD requests (and one refused without the budget announced)");
        l.release(ReleaseOutcome.OK);
    }

    /**
     * Two misses of one quota at once: the first one's grant is handed to its thread, which puts
     * it in the table on its own thread, while the second HOLD request is made. Making room for
     * the second counts that grant (CI: RuntimeWithAgentIT's four 100m calls, two without a slot:
     * the second request went to the agent with no room made, and waited there past its budget).
     */
    @Test
    void aMissCountsTheGrantItsQuotasLastMissIsStillPublishing() throws Exception {
        budget = 1000;
        transport.hello = new Protocol.HelloOk(1, 1, Protocol.HELLO_OK_LOCAL, 1, 1, "fake", budget, List.of());
        local = local(leases, 16, S, S);
        for (long q : new long[]{500, 250}) {
            SlotLease l = onOtherThread(() -> local.acquire(q, "f", "idle" + q));
            l.release(ReleaseOutcome.OK);
        }
        List<SlotLease> busy = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.concurrent.CyclicBarrier go = new java.util.concurrent.CyclicBarrier(3);
        List<Thread> ts = new ArrayList<>();
        for (int k = 0; k < 3; k++) {
            int n = k;
            ts.add(Thread.ofPlatform().start(() -> {
                try {
                    go.await();
                } catch (Exception e) {
                    throw new AssertionError(e);
                }
                busy.add(local.acquire(100, "f", "c" + n));
            }));
        }
        for (Thread t : ts) t.join();
        assertEquals(List.of(), overBudget, "HOLD requests sent with no room made for them");
        for (SlotLease l : busy) assertTrue(l.active(), "every 100m call in a slot: " + busy);
        for (SlotLease l : busy) l.release(ReleaseOutcome.OK);
    }

    /**
     * A miss decides what room to make from what the process holds, and a grant of another quota
     * still on its way (asked, not yet answered) is held too: a 300m miss while a 400m HOLD is at
     * the agent, with a free 500m entry in a 1000m budget, gives the 500m back before it asks.
     * Decided before its turn on the hold connection, it counted 800m, asked with no room made and
     * waited at the agent for budget that only its own next move could free.
     */
    @Test
    void aMissCountsAGrantOfAnotherQuotaStillOnItsWay() throws Exception {
        budget = 1000;
        transport.hello = new Protocol.HelloOk(1, 1, Protocol.HELLO_OK_LOCAL, 1, 1, "fake", budget, List.of());
        transport.exclusive = true;
        local = local(leases, 16, S, S);
        SlotLease idle = onOtherThread(() -> local.acquire(500, "f", "idle"));
        idle.release(ReleaseOutcome.OK);
        var atAgent = new java.util.concurrent.CountDownLatch(1);
        var open = new java.util.concurrent.CountDownLatch(1);
        transport.script = m -> {
            if (m instanceof Protocol.Acquire a && a.quotaMilli() == 400) {
                atAgent.countDown();
                try {
                    open.await();
                } catch (InterruptedException e) {
                    throw new java.io.IOException(e);
                }
            }
            return agent(m);
        };
        List<SlotLease> got = new java.util.concurrent.CopyOnWriteArrayList<>();
        Thread a = Thread.ofPlatform().start(() -> got.add(local.acquire(400, "f", "a")));
        assertTrue(atAgent.await(60, java.util.concurrent.TimeUnit.SECONDS), "the 400m HOLD at the agent");
        Thread b = Thread.ofPlatform().start(() -> got.add(local.acquire(300, "f", "b")));
        Thread.sleep(100); // time for the 300m miss to decide (not visible here); the outcome does not depend on it
        open.countDown();
        a.join();
        b.join();
        assertEquals(List.of(), overBudget, "HOLD requests sent with no room made for them");
        assertEquals(List.of(new Protocol.Release(idle.lease, 0, Protocol.RELEASE_NO_REPLY)), releases(), "the free 500m given back");
        for (SlotLease l : got) assertTrue(l != null && l.active(), "both calls in a slot: " + got);
        for (SlotLease l : got) l.release(ReleaseOutcome.OK);
    }

    @Test
    void afterAShrinkAFreeHeldSlotIsGivenBackLeastRecentlyUsedFirstAndABusyOneKeepsRunning() throws Exception {
        announceHoldList();
        SlotLease busy = local.acquire(250, "f", "a");
        SlotLease idle1 = onOtherThread(() -> local.acquire(250, "f", "b"));
        SlotLease idle2 = onOtherThread(() -> local.acquire(250, "f", "c"));
        idle2.release(ReleaseOutcome.OK);
        Thread.sleep(1); // idle_since apart
        idle1.release(ReleaseOutcome.OK);
        holdListAnswer = holdListOk(1000, 0, new Protocol.HoldLease(busy.lease, busy.slot(), 250, 0),
                new Protocol.HoldLease(idle1.lease, idle1.slot(), 250, 0), new Protocol.HoldLease(idle2.lease, idle2.slot(), 250, 0));
        long now = System.nanoTime() + 10 * S;
        local.tick(now);
        assertEquals(1, transport.count(Protocol.HoldList.class));
        assertEquals(0, releases().size(), "within the budget: nothing given back");
        local.tick(now + S / 2);
        assertEquals(1, transport.count(Protocol.HoldList.class), "at most one HOLD_LIST a second");

        holdListAnswer = holdListOk(500, 200, new Protocol.HoldLease(busy.lease, busy.slot(), 250, 0),
                new Protocol.HoldLease(idle1.lease, idle1.slot(), 250, 0), new Protocol.HoldLease(idle2.lease, idle2.slot(), 250, 0));
        local.tick(now + S);
        assertEquals(2, transport.count(Protocol.HoldList.class));
        assertEquals(List.of(new Protocol.Release(idle2.lease, 0, Protocol.RELEASE_NO_REPLY)), releases(),
                "the least recently used free slot is given back, and only one (250m >= 200m)");
        assertEquals(0, table.slot(idle2.entry), "its entry is empty");
        assertTrue(busy.active(), "the running invocation keeps its slot");
        assertFalse(table.gone(busy.entry));
        assertEquals(0, busy.release(ReleaseOutcome.OK).cpuNanos());
    }

    @Test
    void whenEveryHeldSlotIsBusyOneIsMarkedGoneAndGivenBackOnceItsInvocationEnds() throws Exception {
        announceHoldList();
        SlotLease a = local.acquire(250, "f", "a");
        // b's invocation runs on a thread that lives until the test ends (a claim by a thread that
        // ended would be freed as a dead holder's)
        var alive = new java.util.concurrent.CountDownLatch(1);
        var got = new java.util.concurrent.SynchronousQueue<SlotLease>();
        Thread.ofPlatform().daemon().start(() -> {
            try {
                got.put(local.acquire(250, "f", "b"));
                alive.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        SlotLease b = got.take();
        try {
            busyBoth(a, b);
        } finally {
            alive.countDown();
        }
    }

    private void busyBoth(SlotLease a, SlotLease b) {
        holdListAnswer = holdListOk(400, 100, new Protocol.HoldLease(a.lease, a.slot(), 250, 0), new Protocol.HoldLease(b.lease, b.slot(), 250, 0));
        long now = System.nanoTime() + 10 * S;
        local.tick(now);
        assertEquals(0, releases().size(), "both busy: nothing released yet");
        int gone = table.gone(a.entry) ? a.entry : b.entry;
        assertTrue(table.gone(gone) ^ table.gone(gone == a.entry ? b.entry : a.entry), "exactly one marked GONE");
        // the next round is asked the same; the GONE entry counts as given back already
        local.tick(now + S);
        assertTrue(table.gone(gone) && !table.gone(gone == a.entry ? b.entry : a.entry), "no second entry marked");
        a.release(ReleaseOutcome.OK);
        b.release(ReleaseOutcome.OK);
        holdListAnswer = holdListOk(400, 100, new Protocol.HoldLease(a.lease, a.slot(), 250, 0), new Protocol.HoldLease(b.lease, b.slot(), 250, 0));
        local.tick(now + 2 * S);
        long lease = gone == a.entry ? a.lease : b.lease;
        assertEquals(List.of(new Protocol.Release(lease, 0, Protocol.RELEASE_NO_REPLY)), releases(),
                "the GONE entry given back once free, and nothing more");
        // the other entry serves the next invocation as usual
        SlotLease c = local.acquire(250, "f", "c");
        assertEquals(2, transport.count(Protocol.Acquire.class), "no miss");
        c.release(ReleaseOutcome.OK);
    }

    @Test
    void aDegradedLeaseRaisedLaterUpdatesItsEntry() {
        announceHoldList();
        SlotLease a = local.acquire(250, "f", "a");
        a.release(ReleaseOutcome.OK);
        holdListAnswer = holdListOk(1000, 0, new Protocol.HoldLease(a.lease, a.slot(), 200, Protocol.HOLD_DEGRADED));
        long now = System.nanoTime() + 10 * S;
        local.tick(now);
        assertEquals(200, table.quota(a.entry));
        assertTrue((table.flags(a.entry) & SlotTable.FLAG_DEGRADED) != 0);
        holdListAnswer = holdListOk(1000, 0, new Protocol.HoldLease(a.lease, a.slot(), 250, 0));
        local.tick(now + S);
        assertEquals(250, table.quota(a.entry));
        assertEquals(0, table.flags(a.entry) & SlotTable.FLAG_DEGRADED, "raised: no longer degraded");
        SlotLease b = local.acquire(250, "f", "b");
        assertEquals(250, b.quotaMilli());
        assertFalse(b.degraded());
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void anAgentThatDidNotAnnounceHoldListIsNeverAsked() {
        SlotLease a = local.acquire(250, "f", "a");
        a.release(ReleaseOutcome.OK);
        long now = System.nanoTime() + 10 * S;
        local.tick(now);
        local.tick(now + 2 * S);
        assertEquals(0, transport.count(Protocol.HoldList.class));
    }

    @Test
    void aRefusedHoldListIsTriedAgainNextRoundAndGivesNothingBack() {
        announceHoldList();
        SlotLease a = local.acquire(250, "f", "a");
        a.release(ReleaseOutcome.OK);
        holdListAnswer = new Protocol.Error(Protocol.E_REJECTED, 200, "rate");
        long now = System.nanoTime() + 10 * S;
        local.tick(now);
        assertEquals(0, releases().size());
        assertEquals(1, counters.get("local.hold_list_refused"));
        holdListAnswer = holdListOk(0, 0, new Protocol.HoldLease(a.lease, a.slot(), 250, 0));
        local.tick(now + S);
        assertEquals(2, transport.count(Protocol.HoldList.class));
        assertEquals(250, table.slot(a.entry) != 0 ? table.quota(a.entry) : -1);
    }

    // ---- a dead holder's claim (spec: free_dead) ------------------------------------------------

    @Test
    void anOwnEntryClaimedByAThreadThatDiedIsFreedAndOneClaimedByALiveThreadIsNot() throws Exception {
        SlotLease a = local.acquire(250, "f", "a");
        SlotLease b = onOtherThread(() -> local.acquire(250, "f", "b"));
        a.release(ReleaseOutcome.OK);
        b.release(ReleaseOutcome.OK);
        // a sharer's thread claims entry a and dies holding it; a live one (this thread) holds b
        int[] dead = new int[1];
        Thread t = Thread.ofPlatform().start(() -> dead[0] = Native.gettid());
        t.join();
        // join returns when the Java thread ended; its OS thread exits just after
        for (long until = System.nanoTime() + 30 * S; !Native.threadGone(dead[0]) && System.nanoTime() < until; ) Thread.sleep(1);
        assertTrue(Native.threadGone(dead[0]), "the thread's TID is gone within 30 s of its end");
        assertFalse(Native.threadGone(Native.gettid()));
        long now = System.nanoTime();
        assertNotEquals(0, table.claim(a.entry, dead[0], 250, now), "claimed by the thread that died");
        assertNotEquals(0, table.claim(b.entry, Native.gettid(), 250, now), "claimed by a live thread");
        int gen = SlotTable.gen(table.state(a.entry));
        local.tick(now + S);
        assertEquals(0, SlotTable.hold(table.state(a.entry)), "the dead thread's claim is freed");
        assertEquals(gen + 1, SlotTable.gen(table.state(a.entry)), "with the next generation");
        assertEquals(Native.gettid(), SlotTable.hold(table.state(b.entry)), "a live thread's claim stands");
        assertEquals(1, counters.get("local.freed_dead"));
        // the freed entry serves again, with no miss
        SlotLease c = onOtherThread(() -> local.acquire(250, "f", "c"));
        assertEquals(a.entry, c.entry);
        assertEquals(2, transport.count(Protocol.Acquire.class));
        c.release(ReleaseOutcome.OK);
    }

    // ---- usage batching: one counter read per batch of warm invocations ---------------------

    static SlotCounters used(long cpu, long thr) { return new SlotCounters(cpu, thr, 0, 0); }

    /** Sums of every USAGE record sent so far: {invocations, cpu, throttled}. */
    long[] usageSums() {
        long[] s = new long[3];
        for (Protocol.Message m : transport.oneWay)
            if (m instanceof Protocol.UsageReport r)
                for (Protocol.UsageRecord u : r.records()) { s[0] += u.invocations(); s[1] += u.cpuNanos(); s[2] += u.throttledNanos(); }
        return s;
    }

    @Test
    void warmInvocationsOfOneActionOnAHeldEntryReadTheCountersOncePerBatchAndUsageStaysExact() {
        local.batchNs = 3600 * S; // a batch closes by age only in the background here
        SlotLease first = local.acquire(250, "guest/hello", "0");
        int e = first.entry;
        int reads = ops.reads.get();
        ops.counters.put(11, used(1_000, 10));
        assertFalse(first.release(ReleaseOutcome.OK).measured(), "batched: its own figure is not read");
        for (int k = 1; k < 50; k++) {
            SlotLease l = local.acquire(250, "guest/hello", "i" + k);
            assertEquals("affinity_hit", l.outcome());
            assertEquals(e, l.entry);
            ops.counters.put(11, used(1_000L * (k + 1), 10L * (k + 1)));
            assertFalse(l.release(k == 7 ? ReleaseOutcome.FAILED : ReleaseOutcome.OK).measured(), "invocation " + k);
            assertTrue(l.batched(), "its usage is in the batch");
        }
        assertEquals(reads, ops.reads.get(), "no counter read on the warm path");
        assertTrue(transport.oneWay.isEmpty(), "nothing sent on the invocation path");

        List<String> heard = new ArrayList<>();
        local.batchRead = (act, u) -> heard.add(act + " " + u);
        local.closeBatches(System.nanoTime() + 2 * LocalLeases.BATCH_IDLE_NS);
        assertEquals(reads + 1, ops.reads.get(), "one read closed the batch of the idle entry");
        assertEquals(List.of("guest/hello " + new Usage(true, 50_000, 500, 0, 0, 50)), heard, "read off a release: to the listener");
        assertEquals(0, SlotTable.hold(table.state(e)), "given back free");
        local.reportOnce(System.nanoTime(), true);
        assertEquals(List.of(new Protocol.UsageRecord("guest/hello", 0, 49, 50_000, 500),
                        new Protocol.UsageRecord("guest/hello", Protocol.RELEASE_FAILED, 1, 0, 0)),
                ((Protocol.UsageReport) transport.oneWay.getLast()).records(),
                "every invocation counted with its outcome; the batch's CPU (the action's) once");
    }

    @Test
    void anInvocationThatWantsItsOwnUsageReadsItsStartEvenAfterTheBatchWasClosedWhileIdle() {
        local.batchNs = 3600 * S;
        SlotLease a = local.acquire(250, "f", "a");
        ops.counters.put(11, used(3_000, 30));
        a.release(ReleaseOutcome.OK);
        local.closeBatches(System.nanoTime() + 2 * LocalLeases.BATCH_IDLE_NS); // the upkeep, while idle
        // CPU the slot counts after that read and before the next start (a thread of the runtime
        // still in the slot, or a late counter): not the next invocation's
        ops.counters.put(11, used(5_000, 50));
        SlotLease own = local.acquire(250, "f", "own", true);
        ops.counters.put(11, used(5_400, 54));
        Usage u = own.release(ReleaseOutcome.OK);
        assertTrue(u.measured(), "its own usage: " + u);
        assertEquals(400, u.cpuNanos(), "only what ran between its own start and end: " + u);
    }

    @Test
    void aBatchOlderThanTheBatchTimeIsReadAtTheReleaseThatEndsItAndGoesToTheListener() {
        local.batchNs = 3600 * S;
        SlotLease a = local.acquire(250, "f", "a");
        ops.counters.put(11, used(3_000, 30));
        a.release(ReleaseOutcome.OK);
        SlotLease b = local.acquire(250, "f", "b");
        ops.counters.put(11, used(5_000, 50));
        local.batchNs = 0; // the batch is old now
        List<Usage> heard = new ArrayList<>();
        local.batchRead = (act, x) -> heard.add(x);
        assertEquals(Usage.NONE, b.release(ReleaseOutcome.OK), "not this invocation's own usage");
        assertEquals(List.of(new Usage(true, 5_000, 50, 0, 0, 2)), heard, "the batch's usage, two invocations, to the listener");
        local.reportOnce(System.nanoTime(), true);
        assertArrayEquals(new long[]{2, 5_000, 50}, usageSums());
    }

    @Test
    void anInvocationThatAsksForItsOwnUsageGetsExactlyItsOwnAfterBatchedOnes() {
        local.batchNs = 3600 * S;
        for (int k = 0; k < 3; k++) {
            SlotLease l = local.acquire(250, "f", "b" + k);
            ops.counters.put(11, used(1_000L * (k + 1), 0));
            l.release(ReleaseOutcome.OK);
        }
        SlotLease own = local.acquire(250, "f", "own", true);
        assertEquals("affinity_hit", own.outcome());
        ops.counters.put(11, used(3_000 + 700, 7));
        assertEquals(new Usage(true, 700, 7, 0, 0), own.release(ReleaseOutcome.OK), "its own figure, not the batch's");
        assertFalse(own.batched());
        local.closeBatches(System.nanoTime() + 2 * LocalLeases.BATCH_IDLE_NS);
        local.reportOnce(System.nanoTime(), true);
        assertArrayEquals(new long[]{4, 3_700, 7}, usageSums(), "the batch before it and it, each counted once");
    }

    @Test
    void anotherActionOnTheEntryEndsTheBatchAtItsClaimSoEachActionGetsItsOwnCpu() {
        local.batchNs = 3600 * S;
        for (int k = 0; k < 2; k++) {
            SlotLease l = local.acquire(250, "guest/a", "a" + k);
            ops.counters.put(11, used(2_000L * (k + 1), 0));
            l.release(ReleaseOutcome.OK);
        }
        SlotLease b = local.acquire(250, "guest/b", "b");
        ops.counters.put(11, used(4_000 + 900, 0));
        b.release(ReleaseOutcome.OK);
        local.closeBatches(System.nanoTime() + 2 * LocalLeases.BATCH_IDLE_NS);
        local.reportOnce(System.nanoTime(), true);
        assertEquals(List.of(new Protocol.UsageRecord("guest/a", 0, 2, 4_000, 0),
                new Protocol.UsageRecord("guest/b", 0, 1, 900, 0)),
                ((Protocol.UsageReport) transport.oneWay.getLast()).records());
    }

    @Test
    void aPendingBatchIsReadBeforeItsEntryIsDroppedAndAtClose() {
        local.batchNs = 3600 * S;
        SlotLease a = local.acquire(250, "f", "a");
        ops.counters.put(11, used(6_000, 60));
        a.release(ReleaseOutcome.OK);
        local.dropIdle(System.nanoTime() + 2 * IDLE);
        assertEquals(0, table.slot(a.entry), "dropped idle");
        SlotLease b = local.acquire(500, "f", "b"); // another entry, slot 2
        ops.counters.put(21, used(8_000, 0));
        b.release(ReleaseOutcome.OK);
        local.close();
        assertArrayEquals(new long[]{2, 14_000, 60}, usageSums(), "both batches reached the agent");
    }

    @Test
    void aBusyEntryIsNotTakenToCloseItsBatchAndABatchYoungerThanTheIdleTimeWaits() {
        local.batchNs = 3600 * S;
        SlotLease a = local.acquire(250, "f", "a");
        a.release(ReleaseOutcome.OK);
        int reads = ops.reads.get();
        local.closeBatches(System.nanoTime());
        assertEquals(reads, ops.reads.get(), "a batch just added to waits");
        SlotLease b = local.acquire(250, "f", "b");
        local.closeBatches(System.nanoTime() + 2 * LocalLeases.BATCH_IDLE_NS);
        assertEquals(reads, ops.reads.get(), "a claimed entry is not read");
        assertEquals(Native.gettid(), SlotTable.hold(table.state(b.entry)));
        b.release(ReleaseOutcome.OK);
    }
}
