package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static dev.cpuslot.conformance.ActionContainer.*;
import static dev.cpuslot.conformance.ChainPlatformTest.*;
import static dev.cpuslot.conformance.ChainTest.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * What the platform sees of a local hop (a record per hop in the caller's activation log), and
 * OpenWhisk's conductor actions run locally (docs/chaining.md): a conductor returns
 * {@code {action, params, state}} and the runtime runs the named action (local first, then the
 * platform's path) and the conductor again, with OpenWhisk's limits and the chain's containment.
 */
@DisplayName("Per-hop records and conductor actions")
class ChainConductorTest {
    static final String TRIPLE = "function main({ value }) { return { value: value * 3 }; }";
    static final String INCREMENT = "function main({ value }) { return { value: value + 1 }; }";
    /** The example of OpenWhisk's conductors.md, written again. */
    static final String TRIPLE_AND_INCREMENT = """
            function main(params) {
              const step = params.$step || 0;
              delete params.$step;
              if (step === 0) return { action: 'triple', params, state: { $step: 1 } };
              if (step === 1) return { action: 'increment', params, state: { $step: 2 } };
              return { params };
            }
            """;

    /** Every hop's record line in {@code s} ("cpuslot: activation=... chain=..."). */
    static int hopLines(String s, String mode) { return count(s, " chain=" + mode + " "); }

    /**
     * A local hop has a record in its caller's activation log (what OpenWhisk stores as the
     * activation's logs: the container's output up to the caller's sentinel): the hop's activation
     * id, its action, caller, depth, quota, slot, CPU, duration and outcome; a hop through the
     * platform has one too (with the platform's activation id), and an asynchronous hop a
     * "started" record (its end is after the caller's, in the runtime's log).
     */
    @Test
    void everyHopHasARecordInItsCallersActivationLog() throws Exception {
        String[] outErr;
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            ow.answers.put("resize", new OpenWhiskApiStandIn.Answer(200, "{\"y\":2}", 0));
            outErr = with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                initCaller(c, null);
                registerJava(c, "double", "Double", "&owner=guest&quota=250m");
                assertEquals(42, call(c, "double", "{\"x\":21}").getAsJsonObject("got").get("x").getAsInt());
                assertEquals(2, call(c, "resize", "{}").getAsJsonObject("got").get("y").getAsInt());
                JsonObject a = activation("double", "{\"x\":1}", Map.of());
                a.getAsJsonObject("value").addProperty("mode", "async");
                assertTrue(run(c, a).get("async").getAsBoolean());
            });
        }
        String out = outErr[0];
        // the three activations' logs, each ended by its sentinel
        String[] logs = out.split(Pattern.quote(SENTINEL), -1);
        assertEquals(4, logs.length, out);
        Matcher m = Pattern.compile("cpuslot: activation=([0-9a-f]{32}) action=double status=ok chain=sync depth=1 path=local"
                + " caller=0000000000000000000000000000000a quota=250m source=init slot=none cpu_ns=- duration_ms=[0-9.]+").matcher(logs[0]);
        assertTrue(m.find(), "the local hop's record in its caller's log:\n" + logs[0]);
        assertTrue(Pattern.compile("cpuslot: activation=fedcba9876543210fedcba9876543210 action=resize status=ok chain=sync depth=1"
                + " path=openwhisk caller=0000000000000000000000000000000a duration_ms=[0-9.]+").matcher(logs[1]).find(),
                "the platform hop's record (the platform's activation id):\n" + logs[1]);
        assertTrue(Pattern.compile("cpuslot: activation=[0-9a-f]{32} action=double status=started chain=async depth=1 path=local"
                + " caller=0000000000000000000000000000000a").matcher(logs[2]).find(), "the asynchronous hop's start:\n" + logs[2]);
    }

    /**
     * A hop's record stands where the call was among the caller's own lines; a function calling in
     * a loop fills only its own log: each record is charged against the activation's log limit,
     * then dropped, and the log says it was truncated (OpenWhisk's words).
     */
    @Test
    void hopRecordsKeepTheirPlaceAndTheLogLimit() throws Exception {
        String[] outErr = with("javascript", env("CPUSLOT_ACTIVATION_LOG_BYTES", "4096"), c -> {
            assertEquals(200, c.init(initPayload("""
                    function main(a) {
                      console.log('before');
                      cpuslot.call('inc', {});
                      console.log('after');
                      for (let i = 0; i < 100; i++) cpuslot.call('inc', {});
                      return { calls: 101 };
                    }
                    """, "main", false, null)).code());
            registerText(c, "inc", "javascript", "function main(a) { return { x: 1 }; }", "&owner=guest");
            assertEquals(101, run(c, activation("inc", "{}", Map.of())).get("calls").getAsInt());
        });
        String log = outErr[0].split(Pattern.quote(SENTINEL), -1)[0];
        assertTrue(Pattern.compile("before\ncpuslot: activation=[0-9a-f]{32} action=inc status=ok chain=sync [^\n]*\nafter\n")
                .matcher(log).find(), log);
        int records = hopLines(log, "sync");
        assertTrue(records >= 2 && records <= 4096 / 256, records + " records in a 4096-byte log:\n" + log);
        assertTrue(outErr[1].contains("Logs were truncated"), outErr[1]);
    }

    /** OpenWhisk's example: a Hydra function registered as a conductor runs its components locally, each a hop of its own. */
    @Test
    void aConductorRunsItsComponentsLocally() throws Exception {
        with("javascript", c -> {
            registerText(c, "triple", "javascript", TRIPLE, "");
            registerText(c, "increment", "javascript", INCREMENT, "");
            registerText(c, "tripleAndIncrement", "javascript", TRIPLE_AND_INCREMENT, "&conductor=true");
            Reply r = invoke(c, "tripleAndIncrement", "{\"value\":3}");
            assertEquals("{\"value\":10}", result(r).toString(), String.valueOf(r.raw()));
            assertEquals("2", r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
            assertTrue(r.header("X-Cpuslot-Chain").matches("triple=[-0-9]+,increment=[-0-9]+"), r.header("X-Cpuslot-Chain"));
            String log = "";
            for (int i = 0; i < 3000 && hopLines(log, "conductor") < 2; i++) {
                Thread.sleep(10);
                log = Files.readString(c.runtimeLog);
            }
            assertTrue(log.contains("action=triple status=ok chain=conductor depth=1"), log);
            assertTrue(log.contains("action=increment status=ok chain=conductor depth=1"), log);

            // a falsy annotation is no conductor (OpenWhisk: 0, null, false, ""): the continuation is the result
            registerText(c, "plain", "javascript", TRIPLE_AND_INCREMENT, "&conductor=false");
            r = invoke(c, "plain", "{\"value\":3}");
            assertEquals("triple", result(r).get("action").getAsString(), String.valueOf(r.raw()));
            assertNull(r.header("X-Cpuslot-Chain-Hops"));
        });
    }

    /**
     * OpenWhisk's continuation rules: params and state boxed when not objects, the state's fields
     * over the component's result, a component's error result goes back to the conductor, an
     * error from the conductor ends the composition with it.
     */
    @Test
    void aConductorFollowsOpenWhisksContinuationRules() throws Exception {
        with("javascript", c -> {
            registerText(c, "echo", "javascript", "function main(a) { return a; }", "");
            registerText(c, "fails", "javascript", "function main(a) { return { error: 'component failed' }; }", "");
            registerText(c, "boxing", "javascript", """
                    function main(p) {
                      if (p.state === undefined) return { action: 'echo', params: 7, state: 'kept' };
                      return { params: p };
                    }
                    """, "&conductor=1");
            Reply r = invoke(c, "boxing", "{}");
            assertEquals("{\"value\":7,\"state\":\"kept\"}", result(r).toString(), String.valueOf(r.raw()));

            registerText(c, "sees", "javascript", """
                    function main(p) {
                      if (!p.$seen) return { action: 'fails', params: {}, state: { $seen: true } };
                      return { params: { got: p.error } };
                    }
                    """, "&conductor=true");
            assertEquals("component failed", result(invoke(c, "sees", "{}")).get("got").getAsString());

            registerText(c, "stops", "javascript", "function main(p) { return { error: 'conductor says no', action: 'echo' }; }",
                    "&conductor=true");
            r = invoke(c, "stops", "{}");
            assertEquals("conductor says no", result(r).get("error").getAsString(), String.valueOf(r.raw()));
            assertNull(r.header("X-Cpuslot-Chain-Hops"), "nothing ran after the error");
        });
    }

    /** Hostile: a conductor naming another owner's action gets OTHER_OWNER back, and that action never runs. */
    @Test
    void aConductorCannotRunAnotherOwnersAction() throws Exception {
        with("javascript", env("CPUSLOT_OWNER", "*"), c -> {
            registerJava(c, "bobs", "Count", "&owner=bob");
            registerText(c, "sneaky", "javascript", """
                    function main(p) {
                      if (p.$step) return p.error ? { error: p.error } : { params: p };
                      return { action: 'bobs', params: {}, state: { $step: 1 } };
                    }
                    """, "&owner=alice&conductor=true");
            Reply r = invoke(c, "sneaky", "{}");
            String err = result(r).get("error").getAsString();
            assertTrue(err.contains("OTHER_OWNER") && err.contains("bobs"), err);
            assertNull(r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
            // bob's counter was never touched
            JsonObject read = new JsonObject();
            read.addProperty("read", true);
            assertEquals(0, result(invoke(c, "bobs", read.toString())).get("count").getAsInt());
        });
    }

    /**
     * Hostile: a conductor that never stops (it ignores every error) ends after OpenWhisk's limits,
     * 50 components and 2*50+1 conductor runs, with an error; the runtime goes on. A conductor
     * naming itself nests compositions: they share the limits and the chain's depth bound.
     */
    @Test
    void anEndlessConductorStopsAtTheLimits() throws Exception {
        with("javascript", env("CPUSLOT_CHAIN_MAX_DEPTH", "4"), c -> {
            registerText(c, "inc", "javascript", "function main(a) { return { x: (a.x || 0) + 1 }; }", "");
            registerText(c, "forever", "javascript", "function main(p) { return { action: 'inc', params: { x: p.x || 0 } }; }",
                    "&conductor=true");
            Reply r = invoke(c, "forever", "{}");
            String err = result(r).get("error").getAsString();
            assertTrue(err.contains("Too many actions in the composition"), err);
            assertEquals("50", r.header("X-Cpuslot-Chain-Hops"), "OpenWhisk's actionSequenceLimit components ran");

            registerText(c, "selfish", "javascript", "function main(p) { return { action: 'selfish', params: {} }; }",
                    "&conductor=true");
            r = invoke(c, "selfish", "{}");
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertTrue(r.body().toString().contains("Too many actions in the composition") || r.body().toString().contains("DEPTH"),
                    String.valueOf(r.raw()));
            assertTrue(Integer.parseInt(r.header("X-Cpuslot-Chain-Hops")) <= 50, r.headers().map().toString());
            assertAlive(c);
        });
    }

    /**
     * OpenWhisk: an action annotated {@code conductor: true} (read with the activation's key, as the
     * cpu-quota annotation is) runs its co-located components locally and answers the controller
     * with the last continuation (which ends the composition there: the controller takes its
     * params); a component not here goes through the OpenWhisk API. Until the annotation is read,
     * the continuation goes to the controller unchanged (it runs the composition itself).
     */
    @Test
    void anAnnotatedOpenWhiskConductorRunsLocally() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            ow.annotations = "[{\"key\":\"conductor\",\"value\":true}]";
            ow.answers.put("increment", new OpenWhiskApiStandIn.Answer(200, "{\"value\":100}", 0));
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                assertEquals(200, c.init(initPayload(TRIPLE_AND_INCREMENT, "main", false, null)).code());
                registerText(c, "triple", "javascript", TRIPLE, "&owner=guest");
                JsonObject payload = runPayload(json("{\"value\":3}"), Map.of("api_key", KEY, "namespace", "guest",
                        "action_name", "/guest/tripleAndIncrement", "deadline", Long.toString(System.currentTimeMillis() + 60_000)));
                JsonObject body = run(c, payload);
                for (int i = 0; i < 3000 && body.has("action"); i++) { // the annotation is read in the background
                    assertEquals("triple", body.get("action").getAsString(), body.toString());
                    Thread.sleep(10);
                    body = run(c, payload);
                }
                assertEquals("{\"params\":{\"value\":100}}", body.toString(), "the last continuation, for the controller");
                assertEquals(1, ow.requests.size(), "triple ran here, increment through the API: " + ow.requests);
                assertEquals("/api/v1/namespaces/guest/actions/increment?blocking=true&result=true", ow.requests.get(0).pathAndQuery());
                assertEquals(9, json(ow.requests.get(0).body()).get("value").getAsInt(), ow.requests.get(0).body());
            });
        }
    }

    /** Knative (no controller): the container's CPUSLOT_CHAIN_CONDUCTOR makes its action a conductor; the result is unboxed. */
    @Test
    void aKnativeConductorIsDeclaredInItsEnvironment() throws Exception {
        with("javascript", c -> {
            registerText(c, "triple", "javascript", TRIPLE, "");
            registerText(c, "increment", "javascript", INCREMENT, "");
            JsonObject init = initPayload(TRIPLE_AND_INCREMENT, "main", false, Map.of("CPUSLOT_CHAIN_CONDUCTOR", new JsonPrimitive("true")));
            JsonObject k = new JsonObject();
            k.add("init", init.get("value"));
            k.add("value", json("{\"value\":3}"));
            Reply r = c.post("/", k.toString());
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals("{\"value\":10}", r.body().toString(), String.valueOf(r.raw()));
        });
    }
}
