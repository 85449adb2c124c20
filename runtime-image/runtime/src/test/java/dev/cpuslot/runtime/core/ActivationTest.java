package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.chain.LocalBus;
import dev.cpuslot.runtime.chain.PlatformPath;
import dev.cpuslot.runtime.exec.Function;
import dev.cpuslot.runtime.exec.FunctionPool;
import dev.cpuslot.runtime.exec.Hosted;
import org.junit.jupiter.api.Test;

import java.io.PrintStream;
import java.io.ByteArrayOutputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The activation pipeline without HTTP or slots: a platform's call and a chain hop take the same
 * steps in the same order (resolve -> invoke -> record), the function and the bus faked.
 */
class ActivationTest {
    private final Metrics metrics = new Metrics();
    /** What the function saw as it ran: its arguments, and the runtime's metrics at that moment. */
    private final List<String> seen = new ArrayList<>();
    private final Activation activation;
    private final LocalBus bus;
    private final FunctionPool pool;
    private final Hosted hosted;

    ActivationTest() {
        Config cfg = Config.from(Map.of("CPUSLOT_ALLOW_INVOCATION_QUOTA", "true"));
        bus = new LocalBus(new LocalBus.Host() {
            @Override public Hosted find(String function) { return null; }
            @Override public FunctionPool.Outcome run(Hosted callee, JsonElement args, LocalBus.Hop hop, String mode) {
                throw new AssertionError("no chain calls here");
            }
        }, new PlatformPath(null, null), metrics, 4, 4, 4);
        PrintStream none = new PrintStream(new ByteArrayOutputStream());
        activation = new Activation(cfg, metrics, new Quota(cfg, metrics), bus, false, (who, what) -> null, none, none);
        pool = new FunctionPool(recording(), 1, 60_000, null, metrics);
        hosted = new Hosted(pool, "alice", 0);
    }

    /** A function that notes its arguments and, while it runs, what the metrics say: what has been recorded yet. */
    private Function recording() {
        return new Function() {
            @Override public String name() { return "f"; }
            @Override public String language() { return "java"; }
            @Override public Map<String, String> initEnv() { return Map.of(); }
            @Override public Sandbox newSandbox() {
                return new Sandbox() {
                    @Override public JsonElement invoke(JsonElement args, Map<String, String> env) {
                        String s = metrics.scrape();
                        seen.add("args=" + args + " in_flight=" + value(s, "cpuslot_invocations_in_flight")
                                + " invocations=" + value(s, "cpuslot_invocations_total{", "function=\"f\"")
                                + " outcomes=" + value(s, "cpuslot_slot_outcomes_total{"));
                        return JsonParser.parseString("{\"ok\":true}");
                    }
                    @Override public void cancel(Thread worker) { worker.interrupt(); }
                    @Override public void close() {}
                };
            }
        };
    }

    /** The value of the first scraped sample whose line starts with {@code name} and holds every label; null when none. */
    private static String value(String scrape, String name, String... labels) {
        for (String line : scrape.split("\n")) {
            if (!line.startsWith(name)) continue;
            boolean all = true;
            for (String l : labels) all &= line.contains(l);
            if (all) return line.substring(line.lastIndexOf(' ') + 1);
        }
        return null;
    }

    private static final Platform TEST = new Platform() {
        @Override public String name() { return "test"; }
        @Override public boolean sentinels() { return false; }
        @Override public JsonElement body(Result r) { return r.value(); }
    };

    private Reply platformCall(String value) {
        JsonObject act = new JsonObject();
        act.addProperty("action_name", "f");
        return activation.platform(new Invocation(TEST, "rec", act, JsonParser.parseString(value), null, true), pool, hosted);
    }

    private FunctionPool.Outcome hop(String value) {
        LocalBus.Hop hop = bus.root("f", "alice", "h1", System.nanoTime() + TimeUnit.SECONDS.toNanos(60), 0, null);
        return activation.hop(hosted, JsonParser.parseString(value), hop, "sync");
    }

    /** Resolve, then invoke (the quota parameter is gone, the activation in flight, nothing recorded yet), then record. */
    private void assertSteps(String platform) {
        assertEquals(1, seen.size(), seen.toString());
        assertEquals("args={\"x\":1} in_flight=1.0 invocations=null outcomes=null", seen.get(0));
        String s = metrics.scrape();
        assertEquals("0.0", value(s, "cpuslot_invocations_in_flight"), s);
        assertEquals("1.0", value(s, "cpuslot_invocations_total{", "platform=\"" + platform + "\"", "status=\"ok\""), s);
        // the quota resolved (250m, no slot in this test) reached the record
        assertEquals("1.0", value(s, "cpuslot_slot_outcomes_total{", "outcome=\"none\""), s);
        assertNotNull(value(s, "cpuslot_invocation_duration_seconds_count{", "function=\"f\""), s);
    }

    @Test
    void aPlatformCallResolvesInvokesThenRecords() {
        Reply r = platformCall("{\"x\":1,\"" + Config.QUOTA_PARAM + "\":\"250m\"}");
        assertEquals(200, r.status(), String.valueOf(r.body()));
        assertEquals("250", r.headers().get("X-Cpuslot-Quota-Milli"), r.headers().toString());
        assertSteps("test");
    }

    @Test
    void aChainHopTakesTheSameSteps() {
        FunctionPool.Outcome o = hop("{\"x\":1,\"" + Config.QUOTA_PARAM + "\":\"250m\"}");
        assertNull(o.error(), String.valueOf(o));
        assertSteps("chain");
        assertEquals("1.0", value(metrics.scrape(), "cpuslot_chain_calls_total{", "mode=\"sync\"", "status=\"ok\""));
    }

    /** A quota that cannot be read refuses both alike, before the function runs, with the same message. */
    @Test
    void aBadQuotaIsRefusedBeforeTheFunctionRunsOnBothPaths() {
        String bad = "{\"" + Config.QUOTA_PARAM + "\":\"lots\"}";
        Reply r = platformCall(bad);
        FunctionPool.Outcome o = hop(bad);
        assertTrue(seen.isEmpty(), seen.toString());
        assertEquals(400, r.status());
        assertEquals(r.body().getAsJsonObject().get("error").getAsString(), o.error());
        String s = metrics.scrape();
        assertEquals("1.0", value(s, "cpuslot_invocations_total{", "platform=\"test\"", "status=\"bad_quota\""), s);
        assertEquals("1.0", value(s, "cpuslot_invocations_total{", "platform=\"chain\"", "status=\"error\""), s);
    }
}
