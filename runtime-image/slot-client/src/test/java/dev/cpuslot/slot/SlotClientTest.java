package dev.cpuslot.slot;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.*;

class SlotClientTest {
    @TempDir
    Path dir;
    FakeAgent agent;
    SlotClient client;

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

    SlotClient.Builder builder() {
        // the first acquisition (connect, HELLO, fds) has a budget no loaded machine's stall
        // reaches: a test that is about that budget sets its own
        return SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofMillis(500))
                .firstAcquireBudget(Duration.ofSeconds(30))
                .monitorInterval(Duration.ofMillis(20)).reconnectBackoff(Duration.ofMillis(10));
    }

    static int openFds() throws Exception {
        try (var s = Files.list(Path.of("/proc/self/fd"))) {
            return (int) s.count();
        }
    }

    @Test
    void acquirePlacesTheCallingThreadByWritingZeroToThePassedFd() throws Exception {
        client = builder().build();
        SlotLease l = client.acquire(250, "guest/fib", "act-1");
        assertTrue(l.active(), l.toString());
        assertEquals("created", l.outcome());
        assertEquals("self", l.place());
        assertEquals(250, l.quotaMilli());
        assertEquals(Native.gettid(), l.tid());
        assertEquals("0", agent.slotContent(l.slot()), "the thread wrote \"0\" to its slot fd");
        Protocol.Acquire sent = (Protocol.Acquire) agent.received.stream()
                .filter(m -> m instanceof Protocol.Acquire).findFirst().orElseThrow();
        assertEquals(Native.gettid(), sent.tid());
        assertEquals("guest/fib", sent.action());
        assertEquals("act-1", sent.invocation());
        assertTrue(sent.waitUs() > 0 && sent.waitUs() <= 30_000_000, "wait_us within the first acquisition's budget: " + sent.waitUs());
        Usage u = l.release(ReleaseOutcome.OK);
        assertTrue(u.measured());
        assertEquals(1000 * 101, u.cpuNanos(), "usage is what RELEASE_OK said for lease 101");
        assertEquals(7, u.throttledNanos());
        assertEquals(Usage.NONE, l.release(ReleaseOutcome.OK), "second release is a no-op");
        assertEquals(1, agent.count(Protocol.Release.class));
        assertEquals(1, client.counter("release.ok"));
        assertEquals(1, client.counter("acquire.created"));
    }

    @Test
    void sameThreadSameQuotaIsAnAffinityHitWithoutWriteAndFdsAreCachedPerSlot() throws Exception {
        // budgets far above any stall of a loaded machine: with the class's 500 ms budget and the
        // 1 s release timeout, a fake agent thread stalled that long makes the client fail open or
        // drop the connection (new connection: fds sent again), and the affinity checks then fail
        // for the right reasons. This is a logic test, not a timing one.
        client = builder().maxConnections(1).acquireBudget(Duration.ofSeconds(30)).releaseTimeout(Duration.ofSeconds(30)).build();
        SlotLease a = client.acquire(500, "a", "1");
        assertTrue(a.active(), a + " " + client.counters());
        a.release(ReleaseOutcome.OK);
        SlotLease b = client.acquire(500, "a", "2");
        // what happened, for a failure under load: the client's events and what the agent got
        java.util.function.Supplier<String> why = () -> a + " then " + b + "; client " + client.counters() + "; agent got " + agent.received;
        assertEquals("affinity_hit", b.outcome(), why);
        assertEquals("none", b.place(), why);
        assertEquals("0", agent.slotContent(b.slot()), () -> "NONE: no second write; " + why.get());
        b.release(ReleaseOutcome.OK);
        // another thread gets the same slot: nfds=0 on this connection, the cached fd is used
        AtomicReference<SlotLease> other = new AtomicReference<>();
        Thread t = Thread.ofPlatform().start(() -> other.set(client.acquire(500, "a", "3")));
        t.join();
        assertEquals("cache_hit", other.get().outcome());
        assertEquals("self", other.get().place());
        assertEquals("00", agent.slotContent(other.get().slot()));
        other.get().release(ReleaseOutcome.OK);
        assertEquals(1, client.counter("fds.received"), () -> "fds arrived once and were reused; " + why.get());
        List<Long> sentCurrent = agent.received.stream().filter(m -> m instanceof Protocol.Acquire)
                .map(m -> ((Protocol.Acquire) m).currentSlot()).toList();
        assertEquals(List.of(0L, a.slot(), 0L), sentCurrent, () -> "current_slot: none, then the slot, then none for a new thread; " + why.get());
    }

    @Test
    void newFdsReplaceCachedOnesAndTheOldOnesAreClosed() throws Exception {
        agent.alwaysSendFds = true;
        client = builder().maxConnections(1).build();
        client.acquire(300, "x", "warm").release(ReleaseOutcome.OK);
        int before = openFds();
        for (int i = 0; i < 20; i++) {
            Thread t = Thread.ofPlatform().start(() -> client.acquire(300, "x", "i").release(ReleaseOutcome.OK));
            t.join();
        }
        assertTrue(client.counter("fds.replaced") >= 20, client.counters().toString());
        assertTrue(openFds() <= before + 1, "replaced fds are closed: " + before + " -> " + openFds());
        assertEquals(1, client.cachedSlots());
    }

    @Test
    void agentUnreachableFailsOpenQuicklyAndIsCounted() {
        // a budget far above any stall: failing open quickly is returning long before it
        client = SlotClient.builder().socket(dir.resolve("nobody.sock").toString()).acquireBudget(Duration.ofSeconds(30)).build();
        long t0 = System.nanoTime();
        SlotLease l = client.acquire(250, "a", "1");
        long ms = (System.nanoTime() - t0) / 1_000_000;
        assertFalse(l.active());
        assertEquals("unreachable", l.reason());
        assertEquals(Usage.NONE, l.release(ReleaseOutcome.OK));
        assertTrue(ms < 10_000, "fail-open took " + ms + " ms: it waited for the 30 s budget");
        client.acquire(250, "a", "2");
        assertEquals(2, client.counter("noslot.unreachable"));
    }

    @Test
    void failClosedThrows() {
        client = SlotClient.builder().socket(dir.resolve("nobody.sock").toString()).failClosed(true).build();
        SlotUnavailableException e = assertThrows(SlotUnavailableException.class, () -> client.acquire(250, "a", "1"));
        assertEquals("unreachable", e.reason());
    }

    @Test
    void acquireNeverBlocksLongerThanTheBudgetAndALateLeaseIsReleased() throws Exception {
        // one connection and no monitor probing it: the slow ACQUIRE below must go out on it (with
        // the 20 ms monitor a probe could hold the connection past the budget on a loaded machine,
        // a new connection's HELLO then used it up, and no ACQUIRE went out to be drained)
        client = builder().acquireBudget(Duration.ofMillis(50)).firstAcquireBudget(Duration.ZERO).maxConnections(1)
                .monitorInterval(Duration.ofHours(1)).build();
        assertTrue(client.warmUp(Duration.ofSeconds(30)), "connection up: " + client.counters()); // no 50 ms budget for that
        // the answer comes 40 budgets late: an acquire that returns before half of that did not
        // wait for it (no tighter wall-clock bound: a loaded machine stretches any of them)
        agent.acquireDelayMs = 2000;
        long t0 = System.nanoTime();
        SlotLease l = client.acquire(100, "slow", "s");
        long ms = (System.nanoTime() - t0) / 1_000_000;
        assertFalse(l.active());
        assertEquals("budget", l.reason());
        assertTrue(ms < 1000, "acquire took " + ms + " ms with a 50 ms budget: it waited for the late answer");
        // the drainer reads the late ACQUIRE_OK and releases it with outcome TIMEOUT
        long until = System.nanoTime() + 10_000_000_000L;
        while (agent.received.stream().noneMatch(m -> m instanceof Protocol.Release r && r.outcome() == Protocol.RELEASE_TIMEOUT)
                && System.nanoTime() < until) Thread.sleep(10);
        assertTrue(agent.received.stream().anyMatch(m -> m instanceof Protocol.Release r && r.outcome() == Protocol.RELEASE_TIMEOUT),
                () -> "no RELEASE with TIMEOUT; client " + client.counters() + "; agent got " + agent.received);
        assertEquals(1, client.counter("drain.released"));
        agent.acquireDelayMs = 0;
        SlotLease ok = client.acquire(100, "after", "a");
        assertTrue(ok.active(), "connection usable after the drain: " + ok);
        ok.release(ReleaseOutcome.OK);
    }

    @Test
    void afterAnAgentRestartHeldLeasesAreReclaimedAndReleasedOnTheNewConnection() throws Exception {
        client = builder().build();
        SlotLease l = client.acquire(250, "guest/long", "inv-9");
        assertTrue(l.active());
        long oldLease = l.lease;
        agent.restart(true);
        long until = System.nanoTime() + 3_000_000_000L;
        while (agent.count(Protocol.Reclaim.class) == 0 && System.nanoTime() < until) Thread.sleep(10);
        Protocol.Reclaim rc = (Protocol.Reclaim) agent.received.stream().filter(m -> m instanceof Protocol.Reclaim)
                .findFirst().orElseThrow(() -> new AssertionError("no RECLAIM: " + client.counters()));
        assertEquals(l.slot(), rc.slot());
        assertEquals(l.tid(), rc.tid());
        assertEquals("guest/long", rc.action());
        assertEquals("inv-9", rc.invocation());
        Usage u = l.release(ReleaseOutcome.OK);
        assertTrue(u.measured(), client.counters().toString());
        assertNotEquals(oldLease, l.lease);
        assertEquals(1, client.counter("reclaim.ok"));
        assertEquals(0, client.orphanCount());
    }

    @Test
    void aLeaseTheRestartedAgentDoesNotKnowIsLostAndTheInvocationGoesOn() throws Exception {
        client = builder().monitorInterval(Duration.ofSeconds(30)).build(); // reclaim at release
        SlotLease l = client.acquire(250, "a", "1");
        agent.restart(false);
        Usage u = l.release(ReleaseOutcome.OK);
        assertFalse(u.measured());
        assertTrue(l.lost());
        assertEquals(1, client.counter("reclaim.lost"));
        SlotLease again = client.acquire(250, "a", "2");
        assertTrue(again.active(), "new acquires work on a new connection: " + again);
        again.release(ReleaseOutcome.OK);
    }

    @Test
    void agentErrorsGiveNoSlotWithTheErrorAsReason() {
        agent.acquireHook = a -> new Protocol.Error(Protocol.E_REJECTED, 0, "does not fit");
        client = builder().build();
        SlotLease l = client.acquire(1500, "a", "1");
        assertFalse(l.active());
        assertEquals("REJECTED", l.reason());
        assertEquals(1, client.counter("noslot.REJECTED"));
    }

    @Test
    void notReadyIsRetriedWithinTheBudget() {
        AtomicInteger n = new AtomicInteger();
        agent.acquireHook = a -> n.getAndIncrement() < 2 ? new Protocol.Error(Protocol.E_NOT_READY, 5, "preparing") : null;
        client = builder().build();
        SlotLease l = client.acquire(250, "a", "1");
        assertTrue(l.active(), l.toString());
        assertEquals(3, agent.count(Protocol.Acquire.class));
        l.release(ReleaseOutcome.OK);
    }

    @Test
    void agentPlacesModeSendsTheFlagAndWritesNothing() throws Exception {
        agent.helloFlags = Protocol.HELLO_OK_AGENT_PLACES;
        client = builder().build();
        SlotLease l = client.acquire(250, "a", "1");
        assertEquals("done", l.place());
        assertEquals("", agent.slotContent(l.slot()));
        Protocol.Acquire sent = (Protocol.Acquire) agent.received.stream().filter(m -> m instanceof Protocol.Acquire)
                .findFirst().orElseThrow();
        assertEquals(Protocol.ACQUIRE_AGENT_PLACES, sent.flags());
        l.release(ReleaseOutcome.OK);
    }

    @Test
    void virtualThreadsGetNoSlot() throws Exception {
        client = builder().build();
        AtomicReference<SlotLease> r = new AtomicReference<>();
        Thread.ofVirtual().start(() -> r.set(client.acquire(250, "a", "1"))).join();
        assertEquals("virtual_thread", r.get().reason());
    }

    @Test
    void manyConcurrentInvocationsShareAFewConnectionsWithOneRequestInFlightEach() throws Exception {
        client = builder().maxConnections(3).acquireBudget(Duration.ofSeconds(2)).build();
        int threads = 16, rounds = 20;
        CountDownLatch go = new CountDownLatch(1);
        AtomicInteger ok = new AtomicInteger();
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            int q = 100 * (1 + i % 4);
            ts.add(Thread.ofPlatform().start(() -> {
                try {
                    go.await();
                } catch (InterruptedException e) {
                    return;
                }
                for (int k = 0; k < rounds; k++) {
                    SlotLease l = client.acquire(q, "c", "k" + k);
                    if (l.active() && l.release(ReleaseOutcome.OK).measured()) ok.incrementAndGet();
                }
            }));
        }
        go.countDown();
        for (Thread t : ts) t.join();
        // a release goes on its lease's connection; beside an ACQUIRE in flight there it is
        // one-way, and its usage unknown (spec: "Transport")
        assertEquals(threads * rounds, ok.get() + client.counters().getOrDefault("release.beside", 0L), client.counters().toString());
        assertEquals(0, agent.pipelined.get(), "a request was sent while another was in flight");
        assertTrue(agent.connections.get() <= 3, "connections: " + agent.connections.get());
    }

    @Test
    void withCounterFdsTheReleaseIsOneWayAndTheUsageComesFromTheCounters() throws Exception {
        agent.statFds = 1; // v2: cpu.stat
        client = builder().maxConnections(1).build();
        SlotLease l = client.acquire(250, "guest/fib", "act-1");
        assertTrue(l.active(), l.toString());
        assertEquals("0", agent.slotContent(l.slot()), "\"0\" goes to the placement fd only");
        agent.setCounters(l.slot(), 30_000_000, 5_000_000, 12, 4); // what the kernel counted meanwhile
        Usage u = l.release(ReleaseOutcome.OK);
        assertEquals(new Usage(true, 30_000_000, 5_000_000, 12, 4), u);
        awaitReleases(1); // one-way: release() returned before the agent read it
        Protocol.Release sent = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release)
                .findFirst().orElseThrow();
        assertEquals(Protocol.RELEASE_NO_REPLY, sent.flags());
        assertEquals(1, client.counter("release.oneway"));
        // the connection is still in step: the next request gets its own answer
        SlotLease again = client.acquire(250, "guest/fib", "act-2");
        assertEquals("affinity_hit", again.outcome());
        agent.setCounters(again.slot(), 31_000_000, 5_000_000, 13, 4);
        assertEquals(1_000_000, again.release(ReleaseOutcome.FAILED).cpuNanos());
        awaitReleases(2);
        assertTrue(agent.leases.isEmpty(), "the agent got both one-way releases: " + agent.leases);
    }

    void awaitReleases(int n) throws InterruptedException {
        long until = System.nanoTime() + 3_000_000_000L;
        while (agent.count(Protocol.Release.class) < n && System.nanoTime() < until) Thread.sleep(5);
        assertEquals(n, agent.count(Protocol.Release.class));
    }

    @Test
    void cgroupV1CountersComeFromCpuStatAndCpuacctUsage() throws Exception {
        agent.statFds = 2; // v1: cpu.stat, cpuacct.usage
        client = builder().build();
        SlotLease l = client.acquire(500, "a", "1");
        assertTrue(l.active(), l.toString());
        assertEquals("0", agent.slotContent(l.slot()));
        agent.setCounters(l.slot(), 7_000_123, 2_000_456, 3, 1);
        assertEquals(new Usage(true, 7_000_123, 2_000_456, 3, 1), l.release(ReleaseOutcome.OK));
        assertEquals(1, client.counter("release.oneway"));
    }

    @Test
    void afterAReconnectTheReleaseWaitsForTheAgentsUsage() throws Exception {
        agent.statFds = 1;
        client = builder().build();
        SlotLease l = client.acquire(250, "guest/long", "inv-9");
        agent.restart(true);
        long until = System.nanoTime() + 3_000_000_000L;
        while (client.counter("reclaim.ok") == 0 && System.nanoTime() < until) Thread.sleep(10);
        Usage u = l.release(ReleaseOutcome.OK);
        assertTrue(u.measured(), client.counters().toString());
        assertEquals(1000 * l.lease, u.cpuNanos(), "usage from RELEASE_OK of the re-declared lease");
        assertEquals(0, client.counter("release.oneway"));
        Protocol.Release sent = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release)
                .findFirst().orElseThrow();
        assertEquals(0, sent.flags());
    }

    @Test
    void countersParseWhatTheKernelRenders() {
        SlotCounters v2 = SlotCounters.parse("usage_usec 1234\nuser_usec 1000\nsystem_usec 234\nnr_periods 10\n"
                + "nr_throttled 3\nthrottled_usec 4500\nnr_bursts 0\nburst_usec 0\n", null);
        assertEquals(new SlotCounters(1_234_000, 4_500_000, 10, 3), v2);
        SlotCounters v1 = SlotCounters.parse("nr_periods 10\nnr_throttled 3\nthrottled_time 4500123\n", "98765432\n");
        assertEquals(new SlotCounters(98_765_432, 4_500_123, 10, 3), v1);
        assertEquals(new Usage(true, 1, 0, 0, 0), new SlotCounters(5, 9, 9, 9).since(new SlotCounters(4, 9, 9, 9)));
    }

    @Test
    void countersReadWithPreadReuseNoBytesOfAnEarlierReading(@org.junit.jupiter.api.io.TempDir java.nio.file.Path dir)
            throws Exception {
        org.junit.jupiter.api.Assumptions.assumeTrue(Native.available(), "needs the FFM natives");
        java.nio.file.Path stat = dir.resolve("cpu.stat"), acct = dir.resolve("cpuacct.usage");
        java.nio.file.Files.writeString(stat, "nr_periods 123456789\nnr_throttled 3\nthrottled_time 4500123\nnr_bursts 0\n");
        java.nio.file.Files.writeString(acct, "98765432\n");
        int s = Native.open(stat.toString(), 0, 0), a = Native.open(acct.toString(), 0, 0);
        try {
            assertEquals(new SlotCounters(98_765_432, 4_500_123, 123_456_789, 3), SlotCounters.read(s, a));
            // a shorter rendering in the same thread's buffer: only its own bytes count
            java.nio.file.Files.writeString(stat, "nr_periods 7\n");
            java.nio.file.Files.writeString(acct, "5\n");
            assertEquals(new SlotCounters(5, 0, 7, 0), SlotCounters.read(s, a));
            // v2: one fd, no cpuacct.usage; keys match whole words only
            java.nio.file.Files.writeString(stat, "usage_usec 12\nusage_usec_x 99\nnr_periods 1\nthrottled_usec 2\n");
            assertEquals(new SlotCounters(12_000, 2_000, 1, 0), SlotCounters.read(s, -1));
        } finally {
            Native.close(s);
            Native.close(a);
        }
    }

    @Test
    void stopMeasuresNowAndTheOneWayReleaseCanFollowLater() throws Exception {
        agent.statFds = 1;
        client = builder().build();
        SlotLease l = client.acquire(250, "a", "1");
        agent.setCounters(l.slot(), 9_000_000, 0, 2, 0);
        Usage stopped = l.stop();
        assertEquals(new Usage(true, 9_000_000, 0, 2, 0), stopped);
        assertEquals(0, agent.count(Protocol.Release.class), "stop() does not talk to the agent");
        agent.setCounters(l.slot(), 50_000_000, 0, 9, 0); // later use is not this invocation's
        assertEquals(stopped, l.release(ReleaseOutcome.OK));
        awaitReleases(1);
        assertEquals(Usage.NONE, l.stop(), "nothing to stop after release");
    }

    // ---- lingering ------------------------------------------------------------------------------

    List<String> kinds() {
        return agent.received.stream().map(m -> m.getClass().getSimpleName()).toList();
    }

    @Test
    void aLingeringLeaseIsReusedForTheSameActionAndQuotaWithNoMessageToTheAgent() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).linger(Duration.ofSeconds(30)).build();
        SlotLease a = client.acquire(250, "guest/fib", "act-1");
        assertTrue(a.active(), a.toString());
        assertFalse(a.reused());
        agent.setCounters(a.slot(), 10_000_000, 1_000_000, 3, 1);
        assertEquals(new Usage(true, 10_000_000, 1_000_000, 3, 1), a.release(ReleaseOutcome.OK));
        assertEquals(1, client.parkedCount());
        int sent = agent.received.size();
        for (int i = 2; i <= 20; i++) {
            SlotLease b = client.acquire(250, "guest/fib", "act-" + i);
            assertTrue(b.reused(), "invocation " + i + ": " + b);
            assertEquals(a.slot(), b.slot());
            assertEquals("affinity_hit", b.outcome());
            assertEquals("none", b.place());
            assertEquals("act-" + i, b.invocation());
            agent.setCounters(a.slot(), 10_000_000 + (i - 1) * 1_000_000L, 1_000_000, 2 + i, 1);
            // this invocation's usage only: one ms since the previous one's end
            assertEquals(new Usage(true, 1_000_000, 0, 1, 0), b.release(ReleaseOutcome.OK), "invocation " + i);
            assertEquals(Usage.NONE, b.release(ReleaseOutcome.OK), "second release of a handle is a no-op");
        }
        assertEquals(sent, agent.received.size(), "no message to the agent on reuse: " + kinds());
        assertEquals(1, agent.count(Protocol.Acquire.class));
        assertEquals(0, agent.count(Protocol.Release.class));
        assertEquals(1, agent.leases.size(), "the agent still sees the one lease");
        assertEquals(19, client.counter("linger.reused"));
        assertEquals("0", agent.slotContent(a.slot()), "no placement write on reuse");
        assertEquals(Usage.NONE, a.release(ReleaseOutcome.OK), "the first handle is spent");
        client.close();
        client = null;
        awaitReleases(1);
        Protocol.Release r = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).findFirst().orElseThrow();
        assertEquals(Protocol.RELEASE_OK_OUTCOME, r.outcome());
        assertTrue(agent.leases.isEmpty(), "close() released the lingering lease");
    }

    @Test
    void anotherActionOrQuotaOnTheThreadReleasesTheLingeringLeaseFirst() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).linger(Duration.ofSeconds(30)).build();
        client.acquire(250, "a", "1").release(ReleaseOutcome.OK);
        SlotLease b = client.acquire(250, "b", "2"); // another action, same quota
        assertFalse(b.reused());
        assertEquals(List.of("Hello", "Acquire", "Release", "Acquire"), kinds());
        Protocol.Release r = (Protocol.Release) agent.received.get(2);
        assertEquals(Protocol.RELEASE_NO_REPLY, r.flags(), "one-way");
        b.release(ReleaseOutcome.OK);
        SlotLease c = client.acquire(500, "b", "3"); // same action, another quota
        assertFalse(c.reused());
        assertEquals(List.of("Hello", "Acquire", "Release", "Acquire", "Release", "Acquire"), kinds());
        assertEquals(2, client.counter("linger.ended"));
        assertEquals(1, agent.leases.size(), "only the current lease is held: " + agent.leases);
        c.release(ReleaseOutcome.OK);
    }

    @Test
    void anIdleLingeringLeaseExpiresWithARelease() throws Exception {
        agent.statFds = 1;
        client = builder().linger(Duration.ofMillis(50)).build();
        SlotLease a = client.acquire(250, "a", "1");
        a.release(ReleaseOutcome.OK);
        assertEquals(0, agent.count(Protocol.Release.class), "parked, not released");
        awaitReleases(1);
        assertEquals(1, client.counter("linger.expired"));
        assertEquals(0, client.parkedCount());
        long until = System.nanoTime() + 3_000_000_000L;
        while (!agent.leases.isEmpty() && System.nanoTime() < until) Thread.sleep(5);
        assertTrue(agent.leases.isEmpty());
        SlotLease b = client.acquire(250, "a", "2");
        assertFalse(b.reused(), "expired: a new ACQUIRE");
        assertEquals(2, agent.count(Protocol.Acquire.class));
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void otherOutcomesReleaseAtOnceAndWithoutCounterFdsNothingLingers() throws Exception {
        agent.statFds = 1;
        client = builder().linger(Duration.ofSeconds(30)).build();
        client.acquire(250, "a", "1").release(ReleaseOutcome.FAILED);
        awaitReleases(1);
        client.acquire(250, "a", "2").release(ReleaseOutcome.TIMEOUT);
        awaitReleases(2);
        assertEquals(0, client.parkedCount());
        assertEquals(2, agent.count(Protocol.Acquire.class));
        client.close();
        agent.statFds = 0; // an agent that passes placement fds only: usage needs RELEASE_OK
        client = builder().linger(Duration.ofSeconds(30)).build();
        Thread t = Thread.ofPlatform().start(() -> assertTrue(client.acquire(300, "a", "3").release(ReleaseOutcome.OK).measured()));
        t.join();
        assertEquals(0, client.parkedCount());
        assertEquals(1, client.counter("release.ok"));
    }

    /** A thread's last lease (a function's load, on a thread that ends with it) is given back at once, never parked. */
    @Test
    void aThreadsLastLeaseIsReleasedAtOnceNotKeptLingering() throws Exception {
        agent.statFds = 1;
        client = builder().maxConnections(1).linger(Duration.ofSeconds(30)).build();
        SlotLease a = client.acquire(250, "a", "load-1");
        agent.setCounters(a.slot(), 5_000_000, 0, 1, 0);
        assertEquals(5_000_000, a.releaseLast(ReleaseOutcome.OK).cpuNanos(), "its usage, as a release's");
        assertEquals(0, client.parkedCount(), "not parked for a next invocation");
        assertEquals(0, client.counter("linger.parked"));
        awaitReleases(1);
        Protocol.Release r = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).findFirst().orElseThrow();
        assertEquals(Protocol.RELEASE_OK_OUTCOME, r.outcome());
        assertEquals(Usage.NONE, a.releaseLast(ReleaseOutcome.OK), "a second release is a no-op");
        assertEquals(Usage.NONE, a.release(ReleaseOutcome.OK));
        SlotLease b = client.acquire(250, "a", "2");
        assertFalse(b.reused(), "a new ACQUIRE");
        b.release(ReleaseOutcome.FAILED);
    }

    @Test
    void stopThenReleaseParksWithTheStoppedReadingAndAnotherThreadDoesNotReuse() throws Exception {
        agent.statFds = 1;
        client = builder().linger(Duration.ofSeconds(30)).build();
        SlotLease a = client.acquire(250, "a", "1");
        agent.setCounters(a.slot(), 4_000_000, 0, 1, 0);
        Usage stopped = a.stop();
        agent.setCounters(a.slot(), 6_000_000, 0, 1, 0);
        assertEquals(stopped, a.release(ReleaseOutcome.OK));
        AtomicReference<SlotLease> other = new AtomicReference<>();
        Thread.ofPlatform().start(() -> other.set(client.acquire(250, "a", "2"))).join();
        assertFalse(other.get().reused(), "a lease lingers for its own thread only");
        other.get().release(ReleaseOutcome.FAILED);
        SlotLease b = client.acquire(250, "a", "3");
        assertTrue(b.reused());
        agent.setCounters(a.slot(), 7_000_000, 0, 1, 0);
        assertEquals(3_000_000, b.release(ReleaseOutcome.OK).cpuNanos(), "measured from the stopped reading on");
    }

    @Test
    void afterAReconnectALingeringLeaseIsReclaimedAndNotReused() throws Exception {
        agent.statFds = 1;
        client = builder().linger(Duration.ofSeconds(30)).build();
        client.acquire(250, "a", "1").release(ReleaseOutcome.OK);
        agent.restart(true);
        long until = System.nanoTime() + 3_000_000_000L;
        while (client.counter("reclaim.ok") == 0 && System.nanoTime() < until) Thread.sleep(10);
        assertEquals(1, client.counter("reclaim.ok"), "the lingering lease was re-declared: " + client.counters());
        SlotLease b = client.acquire(250, "a", "2");
        assertTrue(b.active(), b.toString());
        assertFalse(b.reused(), "not from before the reconnect");
        assertEquals(1, client.counter("release.ok"), "the re-declared lease was released with a reply first");
        assertEquals(1, agent.leases.size(), agent.leases.toString());
        b.release(ReleaseOutcome.OK);
    }

    /**
     * A new container's first acquisitions run code no invocation ran yet: until the first grant
     * they have the first-acquire budget; after it, the acquire budget again, except for a local
     * miss, which waits for the agent's answer with the first-acquire budget. Both paths: local
     * leasing (a HOLD miss) and one ACQUIRE per invocation.
     */
    @ParameterizedTest
    @ValueSource(booleans = {true, false})
    void theFirstAcquisitionsWaitForTheFirstBudgetAndLaterOnesForTheBudget(boolean local) throws Exception {
        agent.grantsLocal = local;
        agent.statFds = 1;
        // the answer comes 10 budgets late; the first budget is 100 budgets (no tighter bound: a loaded machine)
        client = builder().acquireBudget(Duration.ofMillis(50)).firstAcquireBudget(Duration.ofSeconds(5)).local(local).build();
        assertTrue(client.warmUp(Duration.ofSeconds(30)), "connection up: " + client.counters());
        agent.acquireDelayMs = 500;
        SlotLease first = client.acquire(250, "first", "f");
        assertTrue(first.active(), "the first acquisition waited for the late grant: " + first + " " + client.counters());
        assertEquals(local, first.local());
        // another quota: a miss again. Local leasing: a miss is a round trip the agent may have
        // to make a slot for, and waits for its answer with the first budget. One ACQUIRE per
        // invocation: after a grant, 50 ms.
        SlotLease second = client.acquire(500, "second", "s");
        if (local) {
            assertTrue(second.active(), "a miss waited for the late grant: " + second + " " + client.counters());
        } else {
            assertFalse(second.active(), "after a grant the 50 ms budget applies: " + second);
            assertEquals("budget", second.reason());
        }
        second.release(ReleaseOutcome.OK);
        first.release(ReleaseOutcome.OK);
        agent.acquireDelayMs = 0;
    }

    @Test
    void warmUpConnectsAndSaysHelloWithoutAcquiringAndTheFirstAcquireUsesThatConnection() throws Exception {
        client = builder().acquireBudget(Duration.ofMillis(50)).build();
        assertTrue(client.warmUp(Duration.ofSeconds(5)), client.counters().toString());
        assertEquals(1, agent.count(Protocol.Hello.class), "one HELLO");
        assertEquals(0, agent.count(Protocol.Acquire.class), "the warm-up acquires nothing");
        assertEquals(0, agent.count(Protocol.Release.class));
        assertEquals(1, client.counter("warmup.connected"));
        assertEquals(0, client.counter("acquire.calls"), "no acquire counted: " + client.counters());
        assertNotNull(client.agentInfo(), "HELLO_OK seen");
        assertTrue(client.warmUp(Duration.ofSeconds(5)), "again: the open connection is reused");
        assertEquals(1, agent.count(Protocol.Hello.class), "no second connection: " + client.counters());
        SlotLease l = client.acquire(250, "a", "1");
        assertTrue(l.active(), l.toString());
        assertEquals(1, agent.count(Protocol.Hello.class), "the acquire used the warm connection");
        assertEquals(1, client.counter("connect.ok"));
        l.release(ReleaseOutcome.OK);
    }

    @Test
    void warmUpWithoutAnAgentFailsOpenAndAcquireConnectsLazilyOnceTheAgentIsThere() throws Exception {
        agent.stop();
        client = builder().build();
        assertFalse(client.warmUp(Duration.ofSeconds(5)));
        assertEquals(1, client.counter("warmup.unreachable"), client.counters().toString());
        assertEquals(0, client.counter("connect.backoff"));
        agent.restart(false);
        SlotLease l = client.acquire(250, "a", "1");
        assertTrue(l.active(), "no backoff left by the warm-up: " + l + " " + client.counters());
        l.release(ReleaseOutcome.OK);
    }

    @Test
    void prepareThreadAndWarmUpWithoutAgentNeverThrowAndNeverTakeALease() throws Exception {
        client = builder().build();
        Thread t = Thread.ofPlatform().start(() -> client.prepareThread());
        t.join();
        Thread.ofVirtual().start(() -> client.prepareThread()).join(); // no-op on a virtual thread
        client.close();
        assertFalse(client.warmUp(Duration.ofSeconds(1)), "closed");
        assertEquals(0, agent.count(Protocol.Acquire.class));
        client = null;
    }

    // ---- local leasing ----------------------------------------------------------------------

    /** Waits (at most 10 s, a loaded machine) until the agent received n messages of a type. */
    void awaitReceived(Class<?> type, long n) throws InterruptedException {
        long until = System.nanoTime() + 10_000_000_000L;
        while (agent.count(type) < n && System.nanoTime() < until) Thread.sleep(5);
        assertTrue(agent.count(type) >= n, "the agent got " + agent.count(type) + " " + type.getSimpleName()
                + ", want " + n + "; client counters " + client.counters());
    }

    @Test
    void localLeasingIsOnByDefaultWhenTheAgentGrantsIt() throws Exception {
        agent.grantsLocal = true;
        agent.statFds = 1;
        client = builder().build();
        assertTrue(client.local());
        SlotLease a = client.acquire(250, "guest/fib", "a1", true); // its own usage: not batched
        assertTrue(a.active() && a.local(), a.toString());
        Protocol.Hello h = (Protocol.Hello) agent.received.getFirst();
        assertEquals(Protocol.HELLO_FD_PASSING | Protocol.HELLO_LOCAL, h.flags());
        Protocol.Acquire acq = (Protocol.Acquire) agent.received.stream().filter(m -> m instanceof Protocol.Acquire)
                .findFirst().orElseThrow();
        assertEquals(Protocol.ACQUIRE_HOLD, acq.flags());
        assertEquals("0", agent.slotContent(a.slot()), "placed itself through the passed fd");
        agent.setCounters(a.slot(), 5_000_000, 0, 1, 0);
        Usage u = a.release(ReleaseOutcome.OK);
        assertEquals(5_000_000, u.cpuNanos());
        for (int k = 0; k < 5; k++) {
            SlotLease b = client.acquire(250, "guest/fib", "b" + k);
            assertEquals("none", b.place(), "the thread sits in its held slot: " + b);
            b.release(ReleaseOutcome.OK);
        }
        assertEquals(1, agent.count(Protocol.Acquire.class), "one ACQUIRE (HOLD) for six invocations");
        assertEquals(0, agent.count(Protocol.Release.class), "no RELEASE per invocation");
        assertEquals("0", agent.slotContent(a.slot()), "one placement write in all");
        // The reports may come in more than one flush (the first can go out
        // before the last releases): wait until they add up, then check them all.
        long until = System.nanoTime() + 10_000_000_000L;
        long[] sum = usageSum();
        while (sum[0] < 6 && System.nanoTime() < until) {
            Thread.sleep(5);
            sum = usageSum();
        }
        assertEquals(6, sum[0], "USAGE counts each invocation; client counters " + client.counters());
        assertEquals(5_000_000, sum[1]);
    }

    /** Invocations and CPU over every USAGE report the agent got, each record checked for its action. */
    private long[] usageSum() {
        long invocations = 0, cpu = 0;
        for (Object m : agent.received.toArray()) {
            if (!(m instanceof Protocol.UsageReport r)) continue;
            for (Protocol.UsageRecord rec : r.records()) {
                assertEquals("guest/fib", rec.action());
                invocations += rec.invocations();
                cpu += rec.cpuNanos();
            }
        }
        return new long[]{invocations, cpu};
    }

    @Test
    void localLeasingOffKeepsTheRoundTripPerInvocation() throws Exception {
        agent.grantsLocal = true;
        agent.statFds = 1;
        client = builder().local(false).build();
        assertFalse(client.local());
        for (int k = 0; k < 3; k++) {
            SlotLease l = client.acquire(250, "f", "i" + k);
            assertTrue(l.active() && !l.local(), l.toString());
            l.release(ReleaseOutcome.OK);
        }
        assertEquals(3, agent.count(Protocol.Acquire.class));
        assertEquals(0, ((Protocol.Hello) agent.received.getFirst()).flags() & Protocol.HELLO_LOCAL, "LOCAL not asked");
    }

    @Test
    void anAgentWithoutLocalLeasingServesThePerInvocationPath() throws Exception {
        agent.statFds = 1;
        client = builder().build();
        for (int k = 0; k < 2; k++) {
            SlotLease l = client.acquire(250, "f", "i" + k);
            assertTrue(l.active() && !l.local(), l.toString());
            l.release(ReleaseOutcome.OK);
        }
        assertEquals(2, agent.count(Protocol.Acquire.class));
        assertTrue(agent.received.stream().noneMatch(m -> m instanceof Protocol.Acquire a && (a.flags() & Protocol.ACQUIRE_HOLD) != 0));
        assertEquals(2, client.counter("acquire.calls"));
    }

    @Test
    void invocationsKeepTheirSlotsThroughAnAgentRestartAndTheHeldSlotsAreReDeclared() throws Exception {
        agent.grantsLocal = true;
        agent.statFds = 1;
        client = builder().build();
        SlotLease a = client.acquire(250, "f", "before");
        long slot = a.slot();
        a.release(ReleaseOutcome.OK);
        agent.stop();
        agent.leases.clear(); // a restarted agent adopts the slots and forgets the leases
        for (int k = 0; k < 5; k++) {
            SlotLease l = client.acquire(250, "f", "away-" + k);
            assertTrue(l.active(), "every invocation in a slot while the agent is away: " + l);
            assertEquals(slot, l.slot());
            l.release(ReleaseOutcome.OK);
        }
        agent.start();
        awaitReceived(Protocol.Reclaim.class, 1);
        Protocol.Reclaim rc = (Protocol.Reclaim) agent.received.stream().filter(m -> m instanceof Protocol.Reclaim)
                .findFirst().orElseThrow();
        assertEquals(new Protocol.Reclaim(slot, 250, 0, "", ""), rc);
        SlotLease after = client.acquire(250, "f", "after");
        assertEquals(slot, after.slot());
        assertEquals(1, agent.count(Protocol.Acquire.class), "no new HOLD lease needed");
        after.release(ReleaseOutcome.OK);
    }
}
