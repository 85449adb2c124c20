package dev.cpuslot.slot;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/**
 * A lease is touched only on the connection that holds it, and an ACQUIRE may wait there for
 * budget (spec: "Transport", "Lifetimes"). Many threads acquire, sleep, wake and release against
 * an agent that admits two leases at a time and refuses a frame naming another connection's
 * lease: every frame naming a lease goes on its own connection, none waits behind an ACQUIRE
 * that waits for the budget it frees, and nothing hangs.
 */
class LeaseConnectionTest {
    @TempDir
    Path dir;
    FakeAgent agent;
    SlotClient client;

    @BeforeEach
    void setUp() throws Exception {
        assertTrue(Native.available(), "FFM calls must link: " + Native.loadError());
        agent = new FakeAgent(dir);
        agent.budgetMilli = 500;
        agent.statFds = 1;
        agent.lends = true;
        agent.start();
    }

    @AfterEach
    void tearDown() throws Exception {
        if (client != null) client.close();
        agent.close();
    }

    @ParameterizedTest
    @ValueSource(booleans = {true, false})
    void manyThreadsWithASmallBudgetNeverWaitBehindTheirOwnLeases(boolean local) throws Exception {
        agent.grantsLocal = local;
        client = SlotClient.builder().socket(agent.socket.toString()).maxConnections(3).acquireBudget(Duration.ofSeconds(30))
                .monitorInterval(Duration.ofMillis(20)).reconnectBackoff(Duration.ofMillis(10))
                .local(local).localIdle(Duration.ofMillis(20)).build();
        int threads = 8, rounds = 40;
        CountDownLatch go = new CountDownLatch(1), done = new CountDownLatch(threads);
        ConcurrentLinkedQueue<String> failures = new ConcurrentLinkedQueue<>();
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            ts.add(Thread.ofPlatform().daemon().start(() -> {
                try {
                    go.await();
                    for (int k = 0; k < rounds; k++) {
                        SlotLease l = client.acquire(250, "c", "k" + k);
                        if (!l.active()) {
                            failures.add(l.toString());
                            continue;
                        }
                        if (k % 2 == 0) {
                            l.sleep();
                            l.wake();
                        }
                        l.release(ReleaseOutcome.OK);
                    }
                } catch (Throwable t) {
                    failures.add(t.toString());
                } finally {
                    done.countDown();
                }
            }));
        }
        go.countDown();
        if (!done.await(5, TimeUnit.MINUTES)) {
            StringBuilder dump = new StringBuilder();
            for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
                dump.append(e.getKey()).append('\n');
                for (StackTraceElement f : e.getValue()) dump.append("    ").append(f).append('\n');
            }
            fail("threads still running after 5 minutes (a lease's frame stuck behind a waiting ACQUIRE?) "
                    + client.counters() + "\n" + dump);
        }
        assertEquals(List.of(), List.copyOf(failures), client.counters().toString());
        assertEquals(0, agent.foreign.get(), "frames that named another connection's lease: " + client.counters());
        assertEquals(0, agent.pipelined.get(), "a request was sent while another was in flight");
    }
}
