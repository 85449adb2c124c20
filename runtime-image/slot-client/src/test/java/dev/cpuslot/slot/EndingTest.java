package dev.cpuslot.slot;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.*;

/**
 * {@link SlotLease#end}: one call ends a lease with its outcome and gives its usage now or later,
 * with what is left to send after the caller's answer in {@link Ending#finish()}; on every path
 * (per-invocation with and without counters, local leasing, lingering, a lost connection, no
 * slot, a second end) it sends what the path needs and nothing more, and the RELEASE of a
 * measured lease follows the answer.
 */
class EndingTest {
    @TempDir
    Path dir;
    FakeAgent agent;
    SlotClient client;
    /** What the listener was told, in order: "usage cpu=N" per call. */
    final List<String> heard = new ArrayList<>();
    final Ending.Listener listener = (l, u, until, nanos) -> {
        assertTrue(nanos >= 0 && until > 0, "until " + until + ", nanos " + nanos);
        synchronized (heard) { heard.add("measured=" + u.measured() + " cpu=" + u.cpuNanos()); }
    };

    @BeforeEach
    void setUp() throws Exception {
        assertTrue(Native.available(), "FFM calls must link: " + Native.loadError());
        agent = new FakeAgent(dir).start();
    }

    @AfterEach
    void tearDown() throws Exception {
        if (client != null) client.close();
        agent.close();
    }

    /** Budgets no loaded machine's stall reaches: these are logic tests, not timing ones. */
    SlotClient.Builder builder() {
        return SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofSeconds(30))
                .firstAcquireBudget(Duration.ofSeconds(30)).releaseTimeout(Duration.ofSeconds(30))
                .monitorInterval(Duration.ofMillis(20)).reconnectBackoff(Duration.ofMillis(10));
    }

    /** Waits (at most 10 s, a loaded machine) until the agent got n RELEASEs; says what it got if not. */
    void awaitReleases(int n) throws InterruptedException {
        long until = System.nanoTime() + 10_000_000_000L;
        while (agent.count(Protocol.Release.class) < n && System.nanoTime() < until) Thread.sleep(5);
        assertEquals(n, agent.count(Protocol.Release.class), "RELEASEs the agent got; it got " + agent.received);
    }

    @Test
    void usageNowWithCounterFdsIsMeasuredAtTheEndAndTheOneWayReleaseFollowsInFinish() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).build();
        SlotLease l = client.acquire(250, "a", "1", true);
        assertTrue(l.active() && !l.local(), l.toString());
        agent.setCounters(l.slot(), 9_000_000, 1_000, 2, 1);
        Ending e = l.end(ReleaseOutcome.OK, true, listener);
        assertEquals(new Usage(true, 9_000_000, 1_000, 2, 1), e.usage());
        assertNull(e.later(), "the usage is final");
        assertEquals(List.of("measured=true cpu=9000000"), heard, "the listener hears it before the answer");
        assertEquals(0, client.counter("release.oneway"), "nothing sent before the answer: " + client.counters());
        agent.setCounters(l.slot(), 50_000_000, 0, 9, 0); // later use is not this invocation's
        assertEquals(e.usage(), e.finish());
        awaitReleases(1);
        Protocol.Release r = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).findFirst().orElseThrow();
        assertEquals(Protocol.RELEASE_NO_REPLY, r.flags(), "one-way");
        assertEquals(Protocol.RELEASE_OK_OUTCOME, r.outcome());
        assertEquals(e.usage(), e.finish(), "a second finish sends nothing");
        assertEquals(1, client.counter("release.oneway"));
        assertEquals(1, heard.size());
    }

    @Test
    void usageLaterSendsNothingAtTheEndAndFinishMeasuresReleasesAndCompletesTheFuture() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).build();
        SlotLease l = client.acquire(250, "a", "1", false);
        agent.setCounters(l.slot(), 7_000_000, 0, 1, 0);
        Ending e = l.end(ReleaseOutcome.FAILED, false, listener);
        assertEquals(Usage.NONE, e.usage());
        assertNotNull(e.later());
        assertFalse(e.later().isDone());
        assertTrue(heard.isEmpty(), heard.toString());
        assertEquals(0, client.counter("release.oneway"), "nothing sent before the answer: " + client.counters());
        AtomicReference<String> order = new AtomicReference<>();
        e.later().thenAccept(u -> order.set(heard.toString() + " then " + u.cpuNanos()));
        assertEquals(7_000_000, e.finish().cpuNanos());
        assertEquals("[measured=true cpu=7000000] then 7000000", order.get(), "the listener first, then the future");
        awaitReleases(1);
        Protocol.Release r = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).findFirst().orElseThrow();
        assertEquals(Protocol.RELEASE_FAILED, r.outcome());
        assertEquals(Protocol.RELEASE_NO_REPLY, r.flags());
        e.finish();
        assertEquals(1, heard.size(), "a second finish tells nobody again");
    }

    @Test
    void withoutCounterFdsTheUsageNowComesFromTheAgentsAnswerAtTheEnd() throws Exception {
        agent.statFds = 0; // placement fds only: the usage needs RELEASE_OK
        client = builder().build();
        SlotLease l = client.acquire(250, "a", "1", true);
        Ending e = l.end(ReleaseOutcome.OK, true, listener);
        assertTrue(e.usage().measured(), client.counters().toString());
        assertEquals(1000 * l.lease, e.usage().cpuNanos(), "RELEASE_OK's figure for the lease");
        assertEquals(1, agent.count(Protocol.Release.class), "released before the answer, with a reply");
        assertEquals(1, client.counter("release.ok"));
        e.finish();
        assertEquals(1, agent.count(Protocol.Release.class), "finish sends nothing more");
    }

    @Test
    void afterALostConnectionTheUsageNowIsTheReDeclaredLeasesAnswer() throws Exception {
        agent.statFds = 1;
        client = builder().build();
        SlotLease l = client.acquire(250, "a", "1", true);
        agent.restart(true);
        long until = System.nanoTime() + 10_000_000_000L;
        while (client.counter("reclaim.ok") == 0 && System.nanoTime() < until) Thread.sleep(10);
        assertEquals(1, client.counter("reclaim.ok"), client.counters().toString());
        Ending e = l.end(ReleaseOutcome.OK, true, listener);
        assertTrue(e.usage().measured(), client.counters().toString());
        assertEquals(1000 * l.lease, e.usage().cpuNanos(), "usage from RELEASE_OK of the re-declared lease");
        assertEquals(0, client.counter("release.oneway"));
        e.finish();
        assertEquals(1, agent.count(Protocol.Release.class), agent.received.toString());
    }

    @Test
    void aLocalSlotIsGivenBackAtTheEndWithItsOwnUsageAndFinishSendsNothing() throws Exception {
        agent.grantsLocal = true;
        agent.statFds = 1;
        client = builder().build();
        SlotLease l = client.acquire(250, "f", "1", true);
        assertTrue(l.active() && l.local(), l.toString());
        agent.setCounters(l.slot(), 5_000_000, 0, 1, 0);
        Ending e = l.end(ReleaseOutcome.OK, true, listener);
        assertEquals(5_000_000, e.usage().cpuNanos());
        assertNull(e.later());
        assertEquals(1, client.counter("release.local"), "given back at the end: the next invocation finds it free");
        e.finish();
        SlotLease next = client.acquire(250, "f", "2", true);
        assertEquals(l.slot(), next.slot());
        assertEquals(1, agent.count(Protocol.Acquire.class), "no second HOLD: the slot was free");
        assertEquals(0, agent.count(Protocol.Release.class), "no RELEASE per invocation");
        next.end(ReleaseOutcome.OK, true, null).finish();
    }

    @Test
    void aLocalSlotWithUsageLaterIsGivenBackInFinish() throws Exception {
        agent.grantsLocal = true;
        agent.statFds = 1;
        client = builder().build();
        SlotLease l = client.acquire(250, "f", "1", false);
        assertTrue(l.local(), l.toString());
        Ending e = l.end(ReleaseOutcome.OK, false, listener);
        assertEquals(0, client.counter("release.local"), "kept until the answer is out");
        e.finish();
        assertTrue(e.later().isDone());
        assertEquals(1, client.counter("release.local"));
        assertEquals(1, heard.size(), heard.toString());
        assertEquals(0, agent.count(Protocol.Release.class));
    }

    @Test
    void aLingeringLeaseIsMeasuredAtTheEndParkedInFinishAndReusedByTheNextInvocation() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).linger(Duration.ofSeconds(30)).build();
        SlotLease a = client.acquire(250, "a", "1", true);
        agent.setCounters(a.slot(), 4_000_000, 0, 1, 0);
        Ending e = a.end(ReleaseOutcome.OK, true, listener);
        assertEquals(4_000_000, e.usage().cpuNanos());
        assertEquals(0, client.parkedCount(), "parked in finish, after the answer");
        e.finish();
        assertEquals(1, client.parkedCount());
        SlotLease b = client.acquire(250, "a", "2", true);
        assertTrue(b.reused(), b.toString());
        agent.setCounters(a.slot(), 6_000_000, 0, 1, 0);
        assertEquals(2_000_000, b.end(ReleaseOutcome.OK, true, null).finish().cpuNanos(), "measured from the first one's end");
        assertEquals(0, agent.count(Protocol.Release.class), "nothing sent while it lingers: " + agent.received);
    }

    @Test
    void withoutASlotTheEndHasNoUsageAndSendsNothing() {
        client = SlotClient.builder().socket(dir.resolve("nobody.sock").toString()).acquireBudget(Duration.ofSeconds(30)).build();
        SlotLease l = client.acquire(250, "a", "1", false);
        assertFalse(l.active());
        Ending e = l.end(ReleaseOutcome.OK, false, listener);
        assertEquals(Usage.NONE, e.usage());
        assertNull(e.later(), "nothing will be measured: no future to wait for");
        assertEquals(List.of("measured=false cpu=0"), heard);
        assertEquals(Usage.NONE, e.finish());
        assertSame(Usage.NONE, Ending.NONE.finish());
        assertNull(Ending.NONE.later());
    }

    @Test
    void aSecondEndGivesTheSlotBackNowAndTheFirstsFinishSendsNothingMore() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).build();
        SlotLease l = client.acquire(250, "a", "1", true);
        Ending first = l.end(ReleaseOutcome.OK, true, listener);
        assertTrue(first.usage().measured());
        assertEquals(0, agent.count(Protocol.Release.class));
        // e.g. the worker failed between its end and its finish: the slot must not stay held
        assertSame(Ending.NONE, l.end(ReleaseOutcome.FAILED, true, listener));
        awaitReleases(1);
        Protocol.Release r = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).findFirst().orElseThrow();
        assertEquals(Protocol.RELEASE_FAILED, r.outcome());
        first.finish();
        assertSame(Ending.NONE, l.end(ReleaseOutcome.OK, true, listener), "a third end too");
        Thread.sleep(50); // a RELEASE sent by mistake would be read by now; the check below is of none
        assertEquals(1, agent.count(Protocol.Release.class), agent.received.toString());
        assertEquals(1, heard.size(), "only the first end is measured: " + heard);
    }
}
