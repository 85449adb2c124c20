package dev.cpuslot.runtime.exec;

import com.google.gson.JsonElement;
import com.google.gson.JsonPrimitive;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.slot.SlotLease;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The worker pool without HTTP, slots or chains: what a worker tells an invocation's hop, and when. */
class FunctionPoolTest {
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
