package dev.cpuslot.runtime.exec;

import com.google.gson.JsonElement;
import com.google.gson.JsonPrimitive;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.slot.FakeAgent;
import dev.cpuslot.slot.Protocol;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The worker pool without HTTP: what a worker tells an invocation's hop, and when; what each job
 * promises (a deadline ends it with a timeout and its lease released as TIMEOUT, its lease ended
 * with its outcome and its usage now or later, a removed function's queued jobs fail, no job
 * waits past its deadline for a sandbox), with a slot client on the fake agent.
 */
class FunctionPoolTest {
    @TempDir
    Path dir;

    static final long MINUTE = TimeUnit.SECONDS.toNanos(60);

    /**
     * A function whose argument says what it does: "ok" returns ok, "throw" fails, "block" waits
     * until {@code gate} opens (or its worker is cancelled); "no sandbox" when {@code sandboxes} is false.
     */
    private static Function scripted(CountDownLatch gate, boolean sandboxes) {
        return new Function() {
            @Override public String name() { return "scripted"; }
            @Override public String language() { return "java"; }
            @Override public Map<String, String> initEnv() { return Map.of(); }
            @Override public Sandbox newSandbox() {
                if (!sandboxes) throw new IllegalStateException("no room");
                return new Sandbox() {
                    @Override public JsonElement invoke(JsonElement args, Map<String, String> env) throws Exception {
                        switch (args.getAsString()) {
                            case "throw" -> throw new FunctionError("it failed", null);
                            case "block" -> gate.await();
                            default -> {}
                        }
                        return new JsonPrimitive("ok");
                    }
                    @Override public void cancel(Thread worker) { worker.interrupt(); }
                    @Override public void close() {}
                };
            }
        };
    }

    private static FunctionPool.Task task(String what, long quotaMilli, boolean usageInReply) {
        return new FunctionPool.Task(new JsonPrimitive(what), Map.of(), quotaMilli, "scripted", "id-" + what, null, usageInReply);
    }

    private SlotClient client(FakeAgent agent) {
        // budgets no loaded machine's stall reaches: these are logic tests
        return SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofSeconds(30))
                .firstAcquireBudget(Duration.ofSeconds(30)).releaseTimeout(Duration.ofSeconds(30)).local(false).build();
    }

    /** The RELEASEs the agent got, by outcome, once it got n (at most 10 s, a loaded machine; then says what it got). */
    private static List<Integer> releases(FakeAgent agent, int n) throws InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (agent.count(Protocol.Release.class) < n && System.nanoTime() < until) Thread.sleep(5);
        List<Integer> got = agent.received.stream().filter(m -> m instanceof Protocol.Release)
                .map(m -> ((Protocol.Release) m).outcome()).toList();
        assertEquals(n, got.size(), "RELEASEs the agent got; it got " + agent.received);
        return got;
    }

    /**
     * A prestarted worker makes the pool's one sandbox and readies its own thread before any call,
     * stays past the idle time until its first job (its sandbox is the one /init made), and runs
     * that job on the thread it readied; the pool makes no other.
     */
    @Test
    void aPrestartedWorkerIsReadyBeforeTheFirstCallAndWaitsForIt() throws Exception {
        List<String> events = java.util.Collections.synchronizedList(new ArrayList<>());
        Function f = new Function() {
            @Override public String name() { return "prestarted"; }
            @Override public String language() { return "java"; }
            @Override public Map<String, String> initEnv() { return Map.of(); }
            @Override public Sandbox newSandbox() {
                events.add("sandbox on " + Thread.currentThread().getName());
                return new Sandbox() {
                    @Override public void prepareThread() { events.add("prepared on " + Thread.currentThread().getName()); }
                    @Override public JsonElement invoke(JsonElement args, Map<String, String> env) {
                        events.add("invoked on " + Thread.currentThread().getName());
                        return new JsonPrimitive("ok");
                    }
                    @Override public void cancel(Thread worker) { worker.interrupt(); }
                    @Override public void close() { events.add("closed"); }
                };
            }
        };
        try (FunctionPool pool = new FunctionPool(f, 2, 50, null, new Metrics())) {
            pool.prestart();
            pool.prestart(); // once only
            long until = System.nanoTime() + MINUTE;
            while (events.size() < 2 && System.nanoTime() < until) Thread.sleep(5);
            Thread.sleep(300); // six idle times: a worker that has not run its first job stays
            assertEquals(1, pool.created());
            assertEquals(1, pool.live(), "the prestarted worker retired before its first job: " + events);
            assertEquals(1, pool.idle());
            FunctionPool.Outcome o = pool.invoke(task("ok", 0, true), System.nanoTime() + MINUTE);
            assertNull(o.error(), String.valueOf(o));
            assertEquals(1, pool.created(), "the first call made a worker of its own");
            String worker = events.get(0).substring("sandbox on ".length());
            assertEquals(List.of("sandbox on " + worker, "prepared on " + worker, "invoked on " + worker), events);
        }
    }

    @Test
    void aDeadlineEndsTheJobWithATimeoutItsLeaseReleasedAsTimeoutAndThePermitFreed() throws Exception {
        CountDownLatch never = new CountDownLatch(1);
        try (FakeAgent agent = new FakeAgent(dir).start(); SlotClient slots = client(agent);
             FunctionPool pool = new FunctionPool(scripted(never, true), 1, 60_000, slots, new Metrics())) {
            agent.statFds = 1;
            FunctionPool.Outcome warm = pool.invoke(task("ok", 250, true), System.nanoTime() + MINUTE);
            assertNull(warm.error(), String.valueOf(warm));
            assertEquals(List.of(Protocol.RELEASE_OK_OUTCOME), releases(agent, 1));
            FunctionPool.Outcome o = pool.invoke(task("block", 250, true), System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(300));
            assertTrue(o.timedOut(), String.valueOf(o));
            assertEquals("the action exceeded its time limit", o.error());
            // the caller's end, or the worker's when its slot came after the deadline: TIMEOUT either way
            assertEquals(List.of(Protocol.RELEASE_OK_OUTCOME, Protocol.RELEASE_TIMEOUT), releases(agent, 2));
            assertEquals(1, pool.abandoned(), "the cancelled worker is retired");
            // the permit came back at the deadline: the pool of one runs the next job on a new worker
            FunctionPool.Outcome next = pool.invoke(task("ok", 250, true), System.nanoTime() + MINUTE);
            assertNull(next.error(), String.valueOf(next));
            assertEquals(2, pool.created());
        }
    }

    @Test
    void aJobsLeaseIsEndedWithItsOutcomeAndItsUsageComesNowOrAfterTheAnswer() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start(); SlotClient slots = client(agent);
             FunctionPool pool = new FunctionPool(scripted(new CountDownLatch(0), true), 1, 60_000, slots, new Metrics())) {
            agent.statFds = 1;
            FunctionPool.Outcome now = pool.invoke(task("ok", 250, true), System.nanoTime() + MINUTE);
            assertNull(now.usageLater(), "asked for in the reply: final now");
            assertTrue(now.usage().measured(), String.valueOf(now));
            FunctionPool.Outcome later = pool.invoke(task("ok", 250, false), System.nanoTime() + MINUTE);
            assertEquals(Usage.NONE, later.usage());
            assertNotNull(later.usageLater());
            Usage u = later.usageLater().get(10, TimeUnit.SECONDS);
            assertTrue(u.measured(), "read after the answer: " + u);
            FunctionPool.Outcome failed = pool.invoke(task("throw", 250, true), System.nanoTime() + MINUTE);
            assertEquals("it failed", failed.error());
            assertFalse(failed.timedOut());
            assertEquals(List.of(Protocol.RELEASE_OK_OUTCOME, Protocol.RELEASE_OK_OUTCOME, Protocol.RELEASE_FAILED), releases(agent, 3));
            assertEquals(1, pool.created(), "one worker ran all three");
        }
    }

    @Test
    void aRemovedFunctionsQueuedJobFailsAndTheRunningOneEnds() throws Exception {
        CountDownLatch gate = new CountDownLatch(1);
        FunctionPool pool = new FunctionPool(scripted(gate, true), 1, 60_000, null, new Metrics());
        AtomicReference<FunctionPool.Outcome> first = new AtomicReference<>(), queued = new AtomicReference<>();
        Thread a = Thread.ofPlatform().start(() -> first.set(invoke(pool, "block")));
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (pool.busy() == 0 && System.nanoTime() < until) Thread.sleep(5);
        assertEquals(1, pool.busy(), "the first job runs");
        Thread b = Thread.ofPlatform().start(() -> queued.set(invoke(pool, "ok")));
        while (b.getState() != Thread.State.TIMED_WAITING && System.nanoTime() < until) Thread.sleep(5);
        assertEquals(Thread.State.TIMED_WAITING, b.getState(), "the second job waits for the pool's one sandbox");
        pool.close();
        gate.countDown();
        a.join(TimeUnit.SECONDS.toMillis(10));
        b.join(TimeUnit.SECONDS.toMillis(10));
        assertFalse(a.isAlive() || b.isAlive(), "both jobs answered");
        assertNull(first.get().error(), "the running job ends as it would: " + first.get());
        assertEquals("the function was removed", queued.get().error());
        assertFalse(queued.get().timedOut());
    }

    private static FunctionPool.Outcome invoke(FunctionPool pool, String what) {
        try {
            return pool.invoke(task(what, 0, true), System.nanoTime() + MINUTE);
        } catch (InterruptedException e) {
            throw new AssertionError(e);
        }
    }

    @Test
    void aJobWithNoFreeSandboxBeforeItsDeadlineTimesOutWithoutRunning() throws Exception {
        CountDownLatch gate = new CountDownLatch(1);
        try (FunctionPool pool = new FunctionPool(scripted(gate, true), 1, 60_000, null, new Metrics())) {
            Thread a = Thread.ofPlatform().start(() -> invoke(pool, "block"));
            long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (pool.busy() == 0 && System.nanoTime() < until) Thread.sleep(5);
            FunctionPool.Outcome o = pool.invoke(task("ok", 0, true), System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(100));
            assertTrue(o.timedOut(), String.valueOf(o));
            assertEquals("no free sandbox before the deadline", o.error());
            gate.countDown();
            a.join(TimeUnit.SECONDS.toMillis(10));
            assertEquals(1, pool.created(), "the waiting job never got a worker");
        }
    }

    /**
     * A new sandbox is made in the job's slot: making it runs the function's code again (a
     * module's top level), which gets no more CPU than its calls. One that cannot be made fails
     * the job, and its slot is given back.
     */
    @Test
    void aSandboxIsMadeInTheJobsSlotAndOneThatCannotBeMadeGivesItBack() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start(); SlotClient slots = client(agent);
             FunctionPool pool = new FunctionPool(scripted(new CountDownLatch(0), false), 1, 60_000, slots, new Metrics())) {
            FunctionPool.Outcome o = pool.invoke(task("ok", 250, true), System.nanoTime() + MINUTE);
            assertEquals("could not create a sandbox: no room", o.error());
            assertNotNull(o.lease(), "the sandbox was being made in the job's slot");
            assertEquals(1, agent.count(Protocol.Acquire.class));
            long until = System.nanoTime() + MINUTE;
            while (agent.count(Protocol.Release.class) < 1 && System.nanoTime() - until < 0) Thread.sleep(5);
            assertEquals(1, agent.count(Protocol.Release.class), "the slot was given back");
        }
    }

    /**
     * A new sandbox's code past its call's deadline is stopped as a load's is: what the language
     * registers as the code begins ({@link Load#onCancel}) runs at the deadline. Here making the
     * sandbox spins, deaf to interrupts (as a guest loop is), until its registered cancel; the
     * worker then ends. Before, only the interrupt reached it, and it spun on.
     */
    @Test
    void aSandboxBeingMadeIsStoppedAtItsCallsDeadline() throws Exception {
        java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
        java.util.concurrent.atomic.AtomicReference<Thread> maker = new java.util.concurrent.atomic.AtomicReference<>();
        Function spins = new Function() {
            @Override public String name() { return "spins"; }
            @Override public String language() { return "python"; }
            @Override public Map<String, String> initEnv() { return Map.of(); }
            @Override public Sandbox newSandbox() {
                maker.set(Thread.currentThread());
                Load.onCancel(() -> stop.set(true)); // the code begins
                while (!stop.get()) Thread.onSpinWait(); // a top level that never ends, deaf to interrupts
                throw new IllegalArgumentException("cancelled");
            }
        };
        try (FunctionPool pool = new FunctionPool(spins, 1, 60_000, null, new Metrics())) {
            FunctionPool.Outcome o = pool.invoke(new FunctionPool.Task(new JsonPrimitive(1), Map.of(), 0, "spins", "a1"),
                    System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(300));
            assertTrue(o.timedOut(), String.valueOf(o));
            long until = System.nanoTime() + MINUTE; // a worker late to begin making it is stopped as it begins
            while (maker.get() == null && System.nanoTime() - until < 0) Thread.sleep(5);
            assertNotNull(maker.get(), "the worker began making its sandbox");
            maker.get().join(MINUTE / 1_000_000);
            assertTrue(stop.get() && !maker.get().isAlive(), "the sandbox's code was stopped and its worker ended: " + maker.get().getState());
        }
    }

    /** A function that records on which thread, and between which hop calls, it ran. */
    private static Function recording(List<String> events) {
        return new Function() {
            @Override public String name() { return "rec"; }
            @Override public String language() { return "java"; }
            @Override public Map<String, String> initEnv() { return Map.of(); }
            @Override public Sandbox newSandbox() {
                return new Sandbox() {
                    @Override public JsonElement invoke(JsonElement args, Map<String, String> env) {
                        synchronized (events) { events.add("run on " + Thread.currentThread().getName()); }
                        return new JsonPrimitive("ok");
                    }
                    @Override public void cancel(Thread worker) { worker.interrupt(); }
                    @Override public void close() {}
                };
            }
        };
    }

    @Test
    void aWorkerEntersTheHopOnItsThreadRunsTheFunctionThenExitsIt() throws Exception {
        List<String> events = new ArrayList<>();
        Hop hop = new Hop() {
            @Override public void enter(SlotLease lease) {
                synchronized (events) { events.add("enter on " + Thread.currentThread().getName() + " lease=" + lease); }
            }
            @Override public long exit(long allocatedBytes) {
                synchronized (events) { events.add("exit on " + Thread.currentThread().getName() + " measured=" + (allocatedBytes >= 0)); }
                return TimeUnit.MILLISECONDS.toNanos(250);
            }
        };
        Metrics metrics = new Metrics();
        try (FunctionPool pool = new FunctionPool(recording(events), 1, 60_000, null, metrics)) {
            FunctionPool.Outcome o = pool.invoke(new FunctionPool.Task(new JsonPrimitive(1), Map.of(), 0, "rec", "a1", hop),
                    System.nanoTime() + TimeUnit.SECONDS.toNanos(60));
            assertNull(o.error(), String.valueOf(o));
            assertEquals("ok", o.result().getAsString());
        }
        assertEquals(3, events.size(), events.toString());
        String worker = events.get(1).substring("run on ".length());
        assertTrue(worker.startsWith("fn-rec-"), events.toString());
        assertEquals("enter on " + worker + " lease=null", events.get(0));
        assertEquals("exit on " + worker + " measured=true", events.get(2));
        // what exit answered (the lease's sleep) is the function's slept time
        String scrape = metrics.scrape();
        assertTrue(scrape.contains("cpuslot_slot_slept_seconds_total{function=\"rec\"} 0.25"), scrape);
    }

    @Test
    void withoutAHopTheFunctionRunsAlone() throws Exception {
        List<String> events = new ArrayList<>();
        try (FunctionPool pool = new FunctionPool(recording(events), 1, 60_000, null, new Metrics())) {
            FunctionPool.Outcome o = pool.invoke(new FunctionPool.Task(new JsonPrimitive(1), Map.of(), 0, "rec", "a2"),
                    System.nanoTime() + TimeUnit.SECONDS.toNanos(60));
            assertNull(o.error(), String.valueOf(o));
            assertSame(null, o.lease());
        }
        assertEquals(1, events.size(), events.toString());
    }
}
