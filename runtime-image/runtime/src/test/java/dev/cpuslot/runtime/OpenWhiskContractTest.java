package dev.cpuslot.runtime;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;
import dev.cpuslot.runtime.core.FunctionRuntime;

/** Expectations ported from OpenWhisk's BasicActionRunnerTests and the action runtime contract. */
class OpenWhiskContractTest {
    static final String SENTINEL = FunctionRuntime.SENTINEL;

    static JsonObject obj(String k, String v) {
        JsonObject o = new JsonObject();
        o.addProperty(k, v);
        return o;
    }

    @Test
    void initIsAcceptedOnceAndASecondInitIsRefused() throws Exception {
        try (Harness h = new Harness()) {
            Resp r = h.post("/init", initJava("testfns.Echo"));
            assertEquals(200, r.status(), r.raw());
            Resp again = h.post("/init", initJava("testfns.Echo"));
            assertNotEquals(200, again.status());
            assertEquals(json("{\"error\":\"Cannot initialize the action more than once.\"}"), again.json());
            // and the action still runs
            assertEquals(200, h.post("/run", run(obj("a", "b"))).status());
        }
    }

    @Test
    void runBeforeInitAndInitWithoutCodeAreErrors() throws Exception {
        try (Harness h = new Harness()) {
            Resp r = h.post("/run", run(obj("a", "b")));
            assertNotEquals(200, r.status());
            assertTrue(r.obj().has("error"), r.raw());
            Resp noCode = h.post("/init", "{\"value\":{}}");
            assertNotEquals(200, noCode.status());
            assertTrue(noCode.obj().get("error").getAsString().contains("no code"), noCode.raw());
            Resp empty = h.post("/init", "{}");
            assertNotEquals(200, empty.status());
        }
    }

    @Test
    void echoReturnsItsInputAndLogsEndWithTheSentinelOnStdoutAndStderr() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Echo"));
            JsonObject in = json("{\"string\":\"hello\",\"n\":7,\"nested\":{\"list\":[1,2,3]}}");
            Resp r = h.post("/run", run(in));
            assertEquals(200, r.status());
            assertEquals(in, r.json());
            String out = h.stdout(), err = h.stderr();
            assertTrue(out.contains("hello stdout\n"), out);
            assertTrue(err.contains("hello stderr\n"), err);
            assertTrue(out.indexOf("hello stdout") < out.lastIndexOf(SENTINEL));
            assertTrue(out.strip().endsWith(SENTINEL), "stdout's last line is the sentinel: " + out);
            assertTrue(err.strip().endsWith(SENTINEL), "stderr's last line is the sentinel: " + err);
        }
    }

    @Test
    void activationFieldsReachTheFunctionAsOwEnvironment() throws Exception {
        try (Harness h = new Harness(Map.of("__OW_API_HOST", "https://whisk.example:443", "CPUSLOT_ANNOTATION_LOOKUP", "false"), null)) {
            String init = initJava("testfns.Env");
            JsonObject ib = json(init);
            ib.getAsJsonObject("value").add("env", json("{\"SOME_VAR\":\"xyz\"}"));
            assertEquals(200, h.post("/init", ib.toString()).status());
            long deadline = System.currentTimeMillis() + 60_000;
            Resp r = h.post("/run", run(new JsonObject(), Map.of(
                    "api_key", "abc:def", "namespace", "guest", "action_name", "/guest/env", "action_version", "0.0.1",
                    "activation_id", "a1b2c3", "transaction_id", "t-1", "deadline", Long.toString(deadline))));
            assertEquals(200, r.status(), r.raw());
            JsonObject env = r.obj();
            assertEquals("abc:def", env.get("__OW_API_KEY").getAsString());
            assertEquals("guest", env.get("__OW_NAMESPACE").getAsString());
            assertEquals("/guest/env", env.get("__OW_ACTION_NAME").getAsString());
            assertEquals("0.0.1", env.get("__OW_ACTION_VERSION").getAsString());
            assertEquals("a1b2c3", env.get("__OW_ACTIVATION_ID").getAsString());
            assertEquals("t-1", env.get("__OW_TRANSACTION_ID").getAsString());
            assertEquals(Long.toString(deadline), env.get("__OW_DEADLINE").getAsString());
            assertEquals("https://whisk.example:443", env.get("__OW_API_HOST").getAsString());
            assertEquals("xyz", env.get("SOME_VAR").getAsString(), "init env reaches the function");
            assertFalse(env.has("__OW_VALUE"));
        }
    }

    /**
     * The real invoker's /init (ContainerProxy, apache/openwhisk): the action's short name, and in
     * {@code env} its init parameters plus the {@code __OW_*} fields of the activation that caused
     * the cold start (its api_key only with provide-api-key). Each /run carries its own fields:
     * those win, so the first activation's key, ids and deadline never reach a later one.
     */
    @Test
    void theInitEnvOfTheRealInvokerCarriesTheFirstActivationAndEachRunWins() throws Exception {
        try (Harness h = new Harness(Map.of("__OW_API_HOST", "http://whisk.example:3233", "CPUSLOT_ANNOTATION_LOOKUP", "false"), null)) {
            JsonObject ib = json(initJava("testfns.Env"));
            ib.getAsJsonObject("value").addProperty("name", "env");
            ib.getAsJsonObject("value").add("env", json("{\"SOME_INIT_PARAM\":\"v\",\"__OW_API_KEY\":\"first:key\","
                    + "\"__OW_NAMESPACE\":\"guest\",\"__OW_ACTION_NAME\":\"/guest/env\",\"__OW_ACTION_VERSION\":\"0.0.1\","
                    + "\"__OW_ACTIVATION_ID\":\"first\",\"__OW_TRANSACTION_ID\":\"t-first\",\"__OW_DEADLINE\":\"1\"}"));
            assertEquals(200, h.post("/init", ib.toString()).status());
            long deadline = System.currentTimeMillis() + 60_000;
            Resp r = h.post("/run", run(new JsonObject(), Map.of(
                    "api_key", "second:key", "namespace", "guest", "action_name", "/guest/env", "action_version", "0.0.1",
                    "activation_id", "second", "transaction_id", "t-second", "deadline", Long.toString(deadline))));
            assertEquals(200, r.status(), r.raw());
            JsonObject env = r.obj();
            assertEquals("second:key", env.get("__OW_API_KEY").getAsString());
            assertEquals("second", env.get("__OW_ACTIVATION_ID").getAsString());
            assertEquals("t-second", env.get("__OW_TRANSACTION_ID").getAsString());
            assertEquals(Long.toString(deadline), env.get("__OW_DEADLINE").getAsString(), "the init's deadline has passed; the run's applies");
            assertEquals("v", env.get("SOME_INIT_PARAM").getAsString());
        }
    }

    @Test
    void unicodeInAndOut() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Unicode"));
            Resp r = h.post("/run", run(obj("delimiter", "❄")));
            assertEquals(200, r.status());
            assertEquals("❄ ☃ ❄", r.obj().get("winter").getAsString());
            assertTrue(h.stdout().contains("❄ ☃ ❄"), h.stdout());
        }
    }

    @Test
    void largePayloadRoundTrips() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Echo"));
            String big = "a".repeat(4 << 20);
            Resp r = h.post("/run", run(obj("big", big)));
            assertEquals(200, r.status());
            assertEquals(big.length(), r.obj().get("big").getAsString().length());
        }
    }

    @Test
    void manyConcurrentRunsOnOneInitialisedAction() throws Exception {
        try (Harness h = new Harness(Map.of("CPUSLOT_SANDBOXES_PER_FUNCTION", "32"), null);
             ExecutorService pool = Executors.newFixedThreadPool(32)) {
            h.post("/init", initJava("testfns.Sleep"));
            int n = 32;
            long t0 = System.nanoTime();
            List<Future<Resp>> fs = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                JsonObject v = json("{\"ms\":400,\"id\":" + i + "}");
                fs.add(pool.submit(() -> h.post("/run", run(v))));
            }
            java.util.Set<Integer> ids = new java.util.HashSet<>();
            for (Future<Resp> f : fs) {
                Resp r = f.get();
                assertEquals(200, r.status(), r.raw());
                ids.add(r.obj().get("id").getAsInt());
            }
            long ms = (System.nanoTime() - t0) / 1_000_000;
            assertEquals(n, ids.size(), "each caller got its own answer");
            assertTrue(ms < 4000, n + " runs of 400 ms took " + ms + " ms: not concurrent");
            assertEquals(n, h.stdout().split(SENTINEL, -1).length - 1, "one stdout sentinel per activation");
        }
    }

    @Test
    void aThrowingFunctionGivesAnErrorAndTheRuntimeKeepsServing() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Throws"));
            Resp r = h.post("/run", run(new JsonObject()));
            assertEquals(502, r.status());
            assertTrue(r.obj().get("error").getAsString().contains("boom"), r.raw());
            assertTrue(h.stderr().contains("IllegalStateException: boom"), "stack trace logged");
            assertEquals(502, h.post("/run", run(new JsonObject())).status());
        }
    }

    @Test
    void theDeadlineIsHonouredAndTheRuntimeKeepsServing() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Forever"));
            long t0 = System.nanoTime();
            Resp r = h.post("/run", run(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 300))));
            long ms = (System.nanoTime() - t0) / 1_000_000;
            assertEquals(502, r.status());
            assertTrue(r.obj().get("error").getAsString().contains("deadline"), r.raw());
            assertTrue(ms >= 250 && ms < 2000, "answered after " + ms + " ms");
            assertTrue(h.stdout().strip().endsWith(SENTINEL));
            // the next invocation gets a fresh worker
            Resp again = h.post("/run", run(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 200))));
            assertEquals(502, again.status());
            assertTrue(h.metrics().contains("cpuslot_sandboxes_abandoned_total{function=\"__ow_action\"} 2"), h.metrics());
        }
    }

    @Test
    void nullAndNonObjectResultsAreNotDictionaries() throws Exception {
        for (String main : List.of("testfns.ReturnsNull", "testfns.ReturnsString")) {
            try (Harness h = new Harness()) {
                assertEquals(200, h.post("/init", initJava(main)).status());
                Resp r = h.post("/run", run(new JsonObject()));
                assertEquals(502, r.status());
                if (main.endsWith("ReturnsNull")) {
                    // the OpenWhisk Java runtime's answer, and its line in the action's logs
                    assertTrue(r.obj().get("error").getAsString().endsWith("The action returned null"), r.raw());
                    assertTrue(h.stderr().contains("The action returned null"), h.stderr());
                } else {
                    assertEquals("The action did not return a dictionary.", r.obj().get("error").getAsString());
                }
            }
        }
    }

    @Test
    void aJarWithoutTheNamedClassFailsInitAndALaterInitWorks() throws Exception {
        try (Harness h = new Harness()) {
            Resp r = h.post("/init", initJava("testfns.DoesNotExist"));
            assertNotEquals(200, r.status());
            assertTrue(r.obj().get("error").getAsString().contains("testfns.DoesNotExist"), r.raw());
            Resp m = h.post("/init", initJava("testfns.Echo#nope"));
            assertNotEquals(200, m.status());
            assertEquals(200, h.post("/init", initJava("testfns.Echo")).status());
        }
    }

    @Test
    void malformedRequestsAreRefusedAndTheRuntimeKeepsServing() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Echo"));
            Resp bad = h.post("/run", "{\"value\": {");
            assertEquals(400, bad.status());
            assertTrue(bad.obj().has("error"));
            assertEquals(400, h.post("/run", "[1,2]").status());
            try (Harness h2 = new Harness()) {
                Resp badB64 = h2.post("/init", "{\"value\":{\"main\":\"X\",\"binary\":true,\"code\":\"%%%\"}}");
                assertNotEquals(200, badB64.status());
                assertTrue(badB64.obj().has("error"));
            }
            assertEquals(200, h.post("/run", run(obj("still", "ok"))).status());
            assertTrue(h.metrics().contains("cpuslot_bad_requests_total{reason=\"malformed_json\"} 1"), h.metrics());
        }
    }

    @Test
    void threadsThatOutliveTheInvocationDoNotBreakIt() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Spawns"));
            for (int i = 0; i < 3; i++) {
                Resp r = h.post("/run", run(new JsonObject()));
                assertEquals(200, r.status());
                assertTrue(r.obj().get("spawned").getAsBoolean());
            }
        }
    }

    @Test
    void metricsAreExposedInPrometheusTextFormat() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initJava("testfns.Echo"));
            h.post("/run", run(new JsonObject()));
            String m = h.metrics();
            assertTrue(m.contains("# TYPE cpuslot_invocations_total counter"), m);
            assertTrue(m.contains("cpuslot_invocations_total{function=\"__ow_action\",platform=\"openwhisk\",status=\"ok\"} 1.0\n"), m);
            assertTrue(m.contains("cpuslot_invocation_duration_seconds_count{function=\"__ow_action\"} 1"), m);
            assertTrue(m.contains("cpuslot_invocation_duration_seconds_bucket{function=\"__ow_action\",le=\"+Inf\"} 1"), m);
            assertTrue(m.contains("cpuslot_sandboxes{function=\"__ow_action\",state=\"idle\"} 1"), m);
            assertTrue(m.contains("cpuslot_invocations_in_flight 0"), m);
            assertTrue(m.contains("cpuslot_slot_outcomes_total{outcome=\"no_quota\"} 1"), m);
            // every family of the runtime's is typed and described (its help given before it was made)
            for (String l : m.lines().filter(l -> l.startsWith("# TYPE cpuslot_")).toList()) {
                String family = l.split(" ")[2];
                assertTrue(m.lines().anyMatch(x -> x.startsWith("# HELP " + family + " ")), "no help for " + family + ":\n" + m);
            }
        }
    }
}
