package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicLongArray;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Local leasing under a full budget (spec: "Local leasing", waiting in turn): more threads than
 * the budget admits held slots, in a closed loop. The fake agent grants two HOLD leases and
 * queues any further one for its wait, then answers TIMEOUT (admission policy queue with the
 * process's own held slots filling the budget).
 */
class LocalFairnessTest extends LocalFixture {
    final Leases leases = leases(S, S, 0);
    LocalLeases local;

    @BeforeEach
    void setUp() throws Exception {
        agentFlags(Protocol.HELLO_OK_LOCAL);
        transport.script = this::agent;
        local = local(leases, 8, S, S);
    }

    Object agent(Protocol.Message m) throws IOException {
        if (m instanceof Protocol.Acquire a) {
            synchronized (this) {
                if (nextSlot <= 2) return grant(a);
            }
            try {
                Thread.sleep(a.waitUs() / 1000); // queued for the budget the process's held slots keep
            } catch (InterruptedException e) {
                throw new IOException(e);
            }
            return new Protocol.Error(Protocol.E_TIMEOUT, 0, "no budget");
        }
        throw new AssertionError("unexpected " + m);
    }

    @Test
    void everyThreadOfAClosedLoopCompletesItsShareWhenTheBudgetHoldsFewerSlotsThanThreads() throws Exception {
        int threads = 3;
        long total = 100L * threads;
        AtomicLongArray done = new AtomicLongArray(threads), failed = new AtomicLongArray(threads);
        AtomicLong sum = new AtomicLong();
        List<Thread> ts = new ArrayList<>();
        // all start the loop together and run at least half a second: a thread started late or
        // descheduled on a busy machine would find the others nearly done (the counted loop is
        // about 15 ms of work), which says nothing of turns
        long[] runUntil = new long[1];
        CyclicBarrier start = new CyclicBarrier(threads, () -> runUntil[0] = System.nanoTime() + 500_000_000L);
        for (int w = 0; w < threads; w++) {
            int me = w;
            ts.add(Thread.ofPlatform().start(() -> {
                try {
                    start.await();
                } catch (Exception e) {
                    throw new AssertionError("start", e);
                }
                while (sum.get() < total || System.nanoTime() - runUntil[0] < 0) {
                    SlotLease l = local.acquire(250, "guest/fair", "");
                    if (l == null || !l.active()) {
                        failed.incrementAndGet(me);
                        continue;
                    }
                    long until = System.nanoTime() + 50_000; // the invocation
                    while (System.nanoTime() < until) Thread.onSpinWait();
                    l.release(ReleaseOutcome.OK);
                    done.incrementAndGet(me);
                    sum.incrementAndGet();
                }
            }));
        }
        for (Thread t : ts) t.join();
        long[] d = new long[threads], f = new long[threads];
        for (int w = 0; w < threads; w++) { d[w] = done.get(w); f[w] = failed.get(w); }
        long fair = sum.get() / threads;
        for (int w = 0; w < threads; w++) {
            assertTrue(d[w] * 4 >= fair && f[w] == 0, "thread " + w + " completed " + d[w] + " (an equal share is " + fair
                    + ") and failed " + f[w] + "; all: done " + Arrays.toString(d) + " failed " + Arrays.toString(f));
        }
    }
}
