package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Threads that miss at once wait in turn (spec: "Local leasing", waiting in turn), and a process
 * sends one HOLD request per quota at a time: the n-th of n threads missing together is served by
 * the n-th answer. Each answer within the acquire budget must keep the rest waiting; an agent
 * that answers none within it sends them on without a slot. The fake agent answers each HOLD
 * request after {@link #answerMs}.
 */
class LocalTurnBudgetTest extends LocalFixture {
    static final long MS = 1_000_000L;
    static final long BUDGET = 1000 * MS;

    final Leases leases = leases(BUDGET, BUDGET, 0);
    LocalLeases local;
    volatile long answerMs;
    volatile long laterAnswerMs = -1; // when set, every answer after the first takes this long
    final java.util.concurrent.atomic.AtomicInteger answered = new java.util.concurrent.atomic.AtomicInteger();
    volatile long lastWaitUs; // what the last HOLD request would wait at the agent for budget or a slot

    @BeforeEach
    void setUp() throws Exception {
        agentFlags(Protocol.HELLO_OK_LOCAL);
        transport.script = this::agent;
        local = local(leases, 8, BUDGET, BUDGET);
    }

    Object agent(Protocol.Message m) throws IOException {
        if (!(m instanceof Protocol.Acquire a)) throw new AssertionError("unexpected " + m);
        lastWaitUs = a.waitUs();
        try {
            Thread.sleep(answered.getAndIncrement() > 0 && laterAnswerMs >= 0 ? laterAnswerMs : answerMs); // the round trip on a busy node
        } catch (InterruptedException e) {
            throw new IOException(e);
        }
        return grant(a);
    }

    /** n threads acquire 250m at once and keep their leases; each result with its wait. */
    List<String> missTogether(int n) throws Exception { return missTogether(local, n); }

    List<String> missTogether(LocalLeases local, int n) throws Exception {
        CyclicBarrier start = new CyclicBarrier(n);
        List<String> out = java.util.Collections.synchronizedList(new ArrayList<>());
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            ts.add(Thread.ofPlatform().start(() -> {
                try {
                    start.await();
                } catch (Exception e) {
                    throw new AssertionError("start", e);
                }
                long t0 = System.nanoTime();
                SlotLease l = local.acquire(250, "guest/f", "");
                long waited = (System.nanoTime() - t0) / MS;
                out.add((l != null && l.active() ? "slot " + l.slot() : "none (" + (l == null ? "null" : l.reason()) + ")")
                        + " after " + waited + " ms");
            }));
        }
        for (Thread t : ts) t.join();
        return out;
    }

    @Test
    void threadsMissingAtOnceAreEachServedWhileEveryAnswerComesWithinTheBudget() throws Exception {
        // each answer in 0.4 of the budget: the third thread's turn comes after three answers,
        // past its own budget (the margin of each answer, 0.6 of it, is for a busy machine)
        answerMs = BUDGET * 2 / 5 / MS;
        List<String> got = missTogether(3);
        assertEquals(3, got.size());
        for (String g : got) assertTrue(g.startsWith("slot "), "each thread in a slot of its own: " + got);
        assertEquals(0, counters.get("noslot.budget"), got.toString());
    }

    @Test
    void aMissWaitsForTheAgentsAnswerWithTheFirstAcquireBudget() throws Exception {
        // a short normal budget, the first-acquire one long: once the process was granted a slot,
        // a miss is still a round trip the agent may have to make a slot for (on a node as busy as
        // the invocations it serves), of a quota the process holds no entry of or of one whose
        // entries are all taken; it waits for the answer with the first-acquire budget
        Leases ls = leases(BUDGET / 10, BUDGET, 0);
        ls.firstBudget(BUDGET * 10);
        LocalLeases lc = local(ls, 8, BUDGET / 10, BUDGET);
        SlotLease a = lc.acquire(250, "guest/f", "a");
        assertTrue(a.active(), "the process's first grant: " + a.reason());
        a.release(ReleaseOutcome.OK);
        answerMs = 3 * BUDGET / 10 / MS; // three normal budgets, well inside the first-acquire one
        SlotLease b = lc.acquire(500, "guest/f", "b");
        assertTrue(b.active(), "the first of another quota waits for the agent's answer: " + b.reason());
        // the longer budget is the answer's: waiting at the agent for admission budget or a free
        // slot keeps the normal one
        assertTrue(lastWaitUs <= BUDGET / 10 / 1000, "HOLD request waits at the agent " + lastWaitUs + " us");
        // a second 500m while the first holds its entry: a miss again
        SlotLease c = onOtherThread(() -> lc.acquire(500, "guest/f", "c"));
        assertTrue(c.active(), "a miss of a quota the process holds waits for the answer too: " + c.reason());
        assertTrue(lastWaitUs <= BUDGET / 10 / 1000, "HOLD request waits at the agent " + lastWaitUs + " us");
        onOtherThread(() -> { c.release(ReleaseOutcome.OK); return null; });
        b.release(ReleaseOutcome.OK);
    }

    @Test
    void threadsThatMissedAQuotaColdWaitTheirWholeBudgetForEachHold() throws Exception {
        // a new pod's first concurrent requests miss together; the first grant comes at once, the
        // others (the agent makes more slots on a busy node) take three normal budgets each. Each
        // HOLD request must have its thread's wait, not a fresh normal budget.
        Leases ls = leases(BUDGET / 10, BUDGET, 0);
        ls.firstBudget(BUDGET * 10);
        LocalLeases lc = local(ls, 8, BUDGET / 10, BUDGET);
        laterAnswerMs = 3 * BUDGET / 10 / MS;
        List<String> got = missTogether(lc, 3);
        assertEquals(3, got.size());
        for (String g : got) assertTrue(g.startsWith("slot "), "each thread in a slot of its own: " + got);
        assertTrue(lastWaitUs <= BUDGET / 10 / 1000, "HOLD request waits at the agent " + lastWaitUs + " us");
    }

    static SlotLease onOtherThread(java.util.concurrent.Callable<SlotLease> f) throws Exception {
        java.util.concurrent.atomic.AtomicReference<Object> got = new java.util.concurrent.atomic.AtomicReference<>();
        Thread t = Thread.ofPlatform().start(() -> {
            try {
                got.set(f.call());
            } catch (Exception e) {
                got.set(e);
            }
        });
        t.join();
        if (got.get() instanceof Exception e) throw e;
        return (SlotLease) got.get();
    }

    @Test
    void anAgentThatAnswersNothingWithinTheBudgetSendsEveryWaitingThreadOnWithoutASlot() throws Exception {
        // the first answer comes after three budgets: no thread waits for it
        answerMs = 3 * BUDGET / MS;
        List<String> got = missTogether(3);
        assertEquals(3, got.size());
        for (String g : got) {
            assertTrue(g.startsWith("none (budget)"), "every thread on without a slot: " + got);
            long waited = Long.parseLong(g.replaceAll(".* after (\\d+) ms", "$1"));
            assertTrue(waited < answerMs, "a thread waited for the late answer (" + waited + " ms): " + got);
        }
    }
}
