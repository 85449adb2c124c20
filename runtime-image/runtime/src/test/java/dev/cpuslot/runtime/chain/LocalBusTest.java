package dev.cpuslot.runtime.chain;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.cpuslot.chain.ChainException;
import dev.cpuslot.chain.ChainException.Kind;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.exec.FunctionPool;
import dev.cpuslot.runtime.exec.Hosted;
import dev.cpuslot.slot.Usage;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The local bus without HTTP or workers, over a fake host: what it promises a chain (same owner,
 * bounded depth, bounded fan-out per activation, asynchronous calls pending bounded per owner so
 * one owner cannot fill another's, a callee deadline never past its caller's) and what a refused
 * call never does (run the callee).
 */
class LocalBusTest {
    static final long MINUTE = TimeUnit.SECONDS.toNanos(60);

    /** Functions by name (owner, time limit); runs record their hop and answer {"ok":true}, "slow" ones after {@code gate}. */
    static final class FakeHost implements LocalBus.Host {
        final Map<String, Hosted> functions;
        final List<LocalBus.Hop> ran = new CopyOnWriteArrayList<>();
        final CountDownLatch gate = new CountDownLatch(1);
        volatile FunctionPool.Outcome answer;

        FakeHost(Map<String, Hosted> functions) { this.functions = functions; }

        @Override public Hosted find(String function) { return functions.get(function); }

        @Override public FunctionPool.Outcome run(Hosted callee, JsonElement args, LocalBus.Hop hop, String mode) {
            ran.add(hop);
            if (hop.function.startsWith("slow")) {
                try {
                    gate.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            FunctionPool.Outcome a = answer;
            if (a != null) return a;
            JsonObject ok = new JsonObject();
            ok.addProperty("ok", true);
            return new FunctionPool.Outcome(ok, null, false, null, Usage.NONE, 0);
        }
    }

    static Hosted of(String owner, long timeoutMs) { return new Hosted(null, owner, timeoutMs); }

    static LocalBus bus(FakeHost host, int maxDepth, int maxAsync, int maxPending) {
        return new LocalBus(host, new PlatformPath(null, null), new Metrics(), maxDepth, maxAsync, maxPending);
    }

    static LocalBus.Hop root(LocalBus bus, String owner, String id, long deadlineNanos) {
        return bus.root("caller", owner, id, deadlineNanos, 0, null);
    }

    static Kind refused(Runnable call) {
        ChainException e = assertThrows(ChainException.class, call::run);
        return e.kind();
    }

    @Test
    void aSynchronousCallRunsTheCalleeOneDeeperWithItsCallerAndTheCallersOwner() {
        FakeHost host = new FakeHost(Map.of("f", of("a", 0)));
        LocalBus bus = bus(host, 4, 8, 8);
        long deadline = System.nanoTime() + MINUTE;
        LocalBus.Hop from = root(bus, "a", "caller-1", deadline);
        JsonElement r = from.call("f", new JsonObject());
        assertTrue(r.getAsJsonObject().get("ok").getAsBoolean(), String.valueOf(r));
        LocalBus.Hop callee = host.ran.getFirst();
        assertEquals(1, callee.depth);
        assertEquals("caller-1", callee.callerId);
        assertEquals("a", callee.owner);
        assertEquals(deadline, callee.deadlineNanos, "no time limit of its own: the caller's deadline");
        assertSame(from.trace, callee.trace, "a synchronous hop reports into its caller's trace");
    }

    @Test
    void aCalleesDeadlineIsNeverPastItsCallersAndACallerOutOfTimeCallsNothing() {
        FakeHost host = new FakeHost(Map.of("limited", of("a", 1_000), "f", of("a", 0)));
        LocalBus bus = bus(host, 4, 8, 8);
        long t0 = System.nanoTime();
        root(bus, "a", "c", t0 + MINUTE).call("limited", new JsonObject());
        assertTrue(host.ran.getFirst().deadlineNanos <= System.nanoTime() + TimeUnit.SECONDS.toNanos(1),
                "its own time limit (1 s) is nearer than the caller's");
        assertEquals(Kind.TIMEOUT, refused(() -> root(bus, "a", "late", System.nanoTime() - 1).call("f", new JsonObject())));
        assertEquals(1, host.ran.size(), "nothing ran for the caller out of time");
    }

    @Test
    void anotherOwnersFunctionAndAChainTooDeepAreRefusedWithoutRunningIt() {
        FakeHost host = new FakeHost(Map.of("theirs", of("b", 0), "f", of("a", 0)));
        LocalBus bus = bus(host, 2, 8, 8);
        LocalBus.Hop from = root(bus, "a", "c", System.nanoTime() + MINUTE);
        assertEquals(Kind.OTHER_OWNER, refused(() -> from.call("theirs", new JsonObject())));
        assertEquals(Kind.OTHER_OWNER, refused(() -> from.callAsync("theirs", new JsonObject())));
        LocalBus.Hop deep = bus.root("caller", "a", "d", System.nanoTime() + MINUTE, 2, null);
        assertEquals(Kind.DEPTH, refused(() -> deep.call("f", new JsonObject())));
        assertEquals(Kind.NOT_LOCAL, refused(() -> from.call(" ", new JsonObject())));
        assertTrue(host.ran.isEmpty(), "nothing ran: " + host.ran);
    }

    @Test
    void aCalleesErrorOrTimeoutReachesTheCallerAsItsKind() {
        FakeHost host = new FakeHost(Map.of("f", of("a", 0)));
        LocalBus bus = bus(host, 4, 8, 8);
        LocalBus.Hop from = root(bus, "a", "c", System.nanoTime() + MINUTE);
        host.answer = new FunctionPool.Outcome(null, "the action exceeded its time limit", true, null, Usage.NONE, 0);
        assertEquals(Kind.TIMEOUT, refused(() -> from.call("f", new JsonObject())));
        host.answer = new FunctionPool.Outcome(null, "boom", false, null, Usage.NONE, 0);
        assertEquals(Kind.FAILED, refused(() -> from.call("f", new JsonObject())));
        host.answer = new FunctionPool.Outcome(new com.google.gson.JsonPrimitive(3), null, false, null, Usage.NONE, 0);
        assertEquals(Kind.FAILED, refused(() -> from.call("f", new JsonObject())), "not a dictionary");
    }

    @Test
    void oneActivationsAsynchronousCallsAreBounded() throws Exception {
        FakeHost host = new FakeHost(Map.of("f", of("a", 0)));
        LocalBus bus = bus(host, 4, 2, 100);
        LocalBus.Hop from = root(bus, "a", "c", System.nanoTime() + MINUTE);
        from.callAsync("f", new JsonObject());
        from.callAsync("f", new JsonObject());
        assertEquals(Kind.FAN_OUT, refused(() -> from.callAsync("f", new JsonObject())));
        root(bus, "a", "other", System.nanoTime() + MINUTE).callAsync("f", new JsonObject()); // another activation: its own bound
    }

    @Test
    void pendingAsynchronousCallsAreBoundedPerOwnerAndFreedWhenTheyEnd() throws Exception {
        FakeHost host = new FakeHost(Map.of("slow", of("a", 0), "slowb", of("b", 0)));
        LocalBus bus = bus(host, 4, 100, 2);
        LocalBus.Hop a = root(bus, "a", "c", System.nanoTime() + MINUTE);
        a.callAsync("slow", new JsonObject());
        a.callAsync("slow", new JsonObject());
        assertEquals(Kind.FAN_OUT, refused(() -> root(bus, "a", "c2", System.nanoTime() + MINUTE).callAsync("slow", new JsonObject())),
                "owner a has 2 pending, its bound");
        // another owner's bound is its own: a's calls do not fill it
        LocalBus.Hop b = root(bus, "b", "d", System.nanoTime() + MINUTE);
        b.callAsync("slowb", new JsonObject());
        b.callAsync("slowb", new JsonObject());
        host.gate.countDown();
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        ChainException last = null;
        while (System.nanoTime() < until) {
            try {
                root(bus, "a", "again", System.nanoTime() + MINUTE).callAsync("slow", new JsonObject());
                last = null;
                break;
            } catch (ChainException e) {
                last = e; // the ended calls have not given their places back yet
                Thread.sleep(5);
            }
        }
        assertNull(last, "after its calls ended owner a may call again: " + last);
    }
}
