package dev.cpuslot.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static dev.cpuslot.conformance.ChainTest.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Local first, then global (docs/chaining.md): a callee not hosted in the runtime goes
 * through the platform's normal path (the OpenWhisk REST API with the activation's api_key, or a
 * Knative service URL), checked against a stand-in that records what it receives; and a chain
 * declared the platform's way (Hydra /register steps, an action's CPUSLOT_CHAIN_STEPS) runs as an
 * OpenWhisk sequence does.
 */
@DisplayName("Chaining beyond the runtime, and declared sequences")
class ChainPlatformTest {
    static final String KEY = "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4Vr";

    /** An OpenWhisk action that calls whatever it is told to and reports what it got (or the ChainError). */
    static final String CALLER = """
            function main(a) {
              try {
                if (a.mode === 'async') { cpuslot.callAsync(a.callee, a.args || {}); return { async: true, params: Object.keys(a) }; }
                return { got: cpuslot.call(a.callee, a.args || {}), params: Object.keys(a) };
              } catch (e) {
                return { kind: e.kind, message: e.message, params: Object.keys(a) };
              }
            }
            """;

    static JsonObject activation(String callee, String args, Map<String, String> extra) {
        JsonObject v = json("{\"args\":" + args + "}");
        v.addProperty("callee", callee);
        Map<String, String> act = new HashMap<>(Map.of("api_key", KEY, "namespace", "guest", "action_name", "/guest/caller",
                "activation_id", "0000000000000000000000000000000a",
                "deadline", Long.toString(System.currentTimeMillis() + 60_000)));
        act.putAll(extra);
        act.values().removeIf(String::isEmpty);
        return runPayload(v, act);
    }

    static JsonObject run(ActionContainer c, JsonObject payload) throws Exception {
        Reply r = c.run(payload);
        assertEquals(200, r.code(), String.valueOf(r.raw()));
        return r.body();
    }

    static JsonObject call(ActionContainer c, String callee, String args) throws Exception {
        return run(c, activation(callee, args, Map.of()));
    }

    static String basic(String key) { return "Basic " + Base64.getEncoder().encodeToString(key.getBytes(StandardCharsets.UTF_8)); }

    static void initCaller(ActionContainer c, Map<String, JsonElement> env) throws Exception {
        Reply r = c.init(initPayload(CALLER, "main", false, env));
        assertEquals(200, r.code(), String.valueOf(r.raw()));
    }

    /**
     * Not hosted here: POST /api/v1/namespaces/{ns}/actions/{name}?blocking=true&result=true with
     * the activation's key, the caller's namespace and the chain's depth; its result is the call's.
     * A function hosted here is called locally even so (local first).
     */
    @Test
    void aCalleeNotHereGoesThroughTheOpenWhiskApi() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            ow.answers.put("resize", new OpenWhiskApiStandIn.Answer(200, "{\"y\":2}", 0));
            ow.answers.put("pkg/resize", new OpenWhiskApiStandIn.Answer(200, "{\"y\":3}", 0));
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                initCaller(c, null);
                registerJava(c, "double", "Double", "&owner=guest");
                Reply r = c.run(activation("resize", "{\"x\":1}", Map.of()));
                assertEquals(200, r.code(), String.valueOf(r.raw()));
                assertEquals(2, r.body().getAsJsonObject("got").get("y").getAsInt(), r.body().toString());
                assertEquals(1, ow.requests.size(), ow.requests.toString());
                OpenWhiskApiStandIn.Request q = ow.requests.get(0);
                assertEquals("POST", q.method());
                assertEquals("/api/v1/namespaces/guest/actions/resize?blocking=true&result=true", q.pathAndQuery());
                assertEquals(basic(KEY), q.authorization());
                JsonObject sent = json(q.body());
                assertEquals(1, sent.get("x").getAsInt(), q.body());
                assertEquals(1, sent.get("__cpuslot_chain_depth").getAsInt(), "the chain's depth travels with the call: " + q.body());
                assertEquals("1", r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
                assertEquals("resize=-", r.header("X-Cpuslot-Chain"));

                assertEquals(3, call(c, "pkg/resize", "{}").getAsJsonObject("got").get("y").getAsInt());
                assertEquals("/api/v1/namespaces/guest/actions/pkg/resize?blocking=true&result=true", ow.requests.get(1).pathAndQuery());
                assertEquals(3, call(c, "/guest/pkg/resize", "{}").getAsJsonObject("got").get("y").getAsInt());
                assertEquals("/api/v1/namespaces/guest/actions/pkg/resize?blocking=true&result=true", ow.requests.get(2).pathAndQuery());

                // local first: a function hosted here never goes to the API
                assertEquals(42, call(c, "double", "{\"x\":21}").getAsJsonObject("got").get("x").getAsInt());
                assertEquals(3, ow.requests.size(), ow.requests.toString());
            });
        }
    }

    /** A name that is not an OpenWhisk entity name (or names another namespace) never reaches a URL. */
    @Test
    void badNamesNeverReachTheApi() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                initCaller(c, null);
                for (String bad : List.of("../x", "a/../../b", "..", "x?blocking=false", "a#b", "a b", "%2e%2e", "a/b/c",
                        "a\nb", "a/", "/guest", "x".repeat(300), "caf\u00e9", "a;b", "a\\b")) {
                    JsonObject o = call(c, bad, "{}");
                    assertEquals("BAD_NAME", o.has("kind") ? o.get("kind").getAsString() : o.toString(), bad + ": " + o);
                }
                JsonObject o = call(c, "/whisk.system/utils/echo", "{}");
                assertEquals("OTHER_OWNER", o.get("kind").getAsString(), o.toString());
                assertEquals(List.of(), ow.requests, "nothing reached the API");
            });
        }
    }

    /**
     * The platform's answers become typed errors: the callee's own error FAILED (its message
     * passed on), the API refusing or unreachable PLATFORM (with its status), no answer before the
     * caller's deadline TIMEOUT; no api_key: nothing to call the platform with, NOT_LOCAL.
     */
    @Test
    void platformFailuresAreTypedErrors() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            ow.answers.put("boom", new OpenWhiskApiStandIn.Answer(502, "{\"error\":\"boom in the remote callee\"}", 0));
            ow.answers.put("gone", new OpenWhiskApiStandIn.Answer(404, "{\"error\":\"The requested resource does not exist.\",\"code\":\"c\"}", 0));
            ow.answers.put("busy", new OpenWhiskApiStandIn.Answer(429, "{\"error\":\"Too many requests in the last minute (count: 61, allowed: 60).\"}", 0));
            ow.answers.put("queued", new OpenWhiskApiStandIn.Answer(202, "{\"activationId\":\"0123\"}", 0));
            ow.answers.put("text", new OpenWhiskApiStandIn.Answer(200, "not json", 0));
            ow.answers.put("slow", new OpenWhiskApiStandIn.Answer(200, "{}", 30_000));
            // an answer no runtime should buffer whole (the service is the tenant's: hostile to the others here)
            ow.answers.put("huge", new OpenWhiskApiStandIn.Answer(200, "{\"x\":\"" + "a".repeat(64 << 20) + "\"}", 0));
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                initCaller(c, null);
                JsonObject o = call(c, "boom", "{}");
                assertEquals("FAILED", o.get("kind").getAsString(), o.toString());
                assertTrue(o.get("message").getAsString().contains("boom in the remote callee"), o.toString());
                o = call(c, "gone", "{}");
                assertEquals("PLATFORM", o.get("kind").getAsString(), o.toString());
                assertTrue(o.get("message").getAsString().contains("404"), o.toString());
                o = call(c, "busy", "{}");
                assertEquals("PLATFORM", o.get("kind").getAsString(), o.toString());
                assertTrue(o.get("message").getAsString().contains("429"), o.toString());
                o = call(c, "queued", "{}");
                assertEquals("TIMEOUT", o.get("kind").getAsString(), o.toString());
                o = call(c, "text", "{}");
                assertEquals("FAILED", o.get("kind").getAsString(), o.toString());
                o = call(c, "huge", "{}");
                assertEquals("PLATFORM", o.get("kind").getAsString(), o.toString());
                assertTrue(o.get("message").getAsString().contains("larger than"), o.toString());
                assertEquals(1, call(c, "text", "{}").size() > 0 ? 1 : 0, "the runtime serves on");
                o = run(c, activation("anything", "{}", Map.of("api_key", "other:key")));
                assertEquals("PLATFORM", o.get("kind").getAsString(), o.toString());
                assertTrue(o.get("message").getAsString().contains("401"), o.toString());
                assertFalse(o.toString().contains("other:key"), "the key is never in an error: " + o);
                o = run(c, activation("anything", "{}", Map.of("api_key", "")));
                assertEquals("NOT_LOCAL", o.get("kind").getAsString(), o.toString());
                // the caller's deadline bounds the wait for the API (the caller sees TIMEOUT, or its
                // own deadline, the same instant, ends it first: either way the chain ended)
                Reply s = c.run(activation("slow", "{}", Map.of("deadline", Long.toString(System.currentTimeMillis() + 3000))));
                boolean typed = s.code() == 200 && "TIMEOUT".equals(s.body().get("kind").getAsString());
                boolean ended = s.code() == 502 && s.body().get("error").getAsString().contains("deadline");
                assertTrue(typed || ended, String.valueOf(s.raw()));
                assertTrue(c.alive());
            });
        }
        // an API that is not there
        with("javascript", env("__OW_API_HOST", "http://127.0.0.1:1"), c -> {
            initCaller(c, null);
            JsonObject o = call(c, "resize", "{}");
            assertEquals("PLATFORM", o.get("kind").getAsString(), o.toString());
        });
    }

    /**
     * The depth travels: an activation that arrives at depth 16 (its caller's chain) cannot call
     * further, through the API or not; the parameter is the runtime's, not the function's.
     */
    @Test
    void theChainsDepthTravelsThroughThePlatform() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                initCaller(c, null);
                JsonObject p = activation("resize", "{}", Map.of());
                p.getAsJsonObject("value").addProperty("__cpuslot_chain_depth", 16);
                JsonObject o = run(c, p);
                assertEquals("DEPTH", o.get("kind").getAsString(), o.toString());
                assertFalse(o.get("params").toString().contains("__cpuslot_chain_depth"), o.toString());
                assertEquals(List.of(), ow.requests);
                p.getAsJsonObject("value").addProperty("__cpuslot_chain_depth", 3);
                o = run(c, p);
                assertEquals(4, json(ow.requests.get(0).body()).get("__cpuslot_chain_depth").getAsInt(), ow.requests.toString());
                p.getAsJsonObject("value").addProperty("__cpuslot_chain_depth", "deep");
                Reply bad = c.run(p);
                assertEquals(400, bad.code(), String.valueOf(bad.raw()));
            });
        }
    }

    /** An asynchronous call not hosted here is a non-blocking invoke (blocking=false). */
    @Test
    void anAsyncCallNotHereIsANonBlockingInvoke() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                initCaller(c, null);
                JsonObject p = activation("audit", "{\"k\":1}", Map.of());
                p.getAsJsonObject("value").addProperty("mode", "async");
                assertTrue(run(c, p).get("async").getAsBoolean());
                for (int i = 0; i < 3000 && ow.requests.isEmpty(); i++) Thread.sleep(10);
                assertEquals(1, ow.requests.size(), "the async invoke reached the API");
                assertEquals("/api/v1/namespaces/guest/actions/audit?blocking=false", ow.requests.get(0).pathAndQuery());
            });
        }
    }

    /**
     * Knative: a callee not here goes to its service URL, from CPUSLOT_CHAIN_URLS (name=url) or the
     * CPUSLOT_CHAIN_URL pattern ({name}, {namespace}), as {"value": args}; names must be DNS labels.
     */
    @Test
    void knativeCalleesGoToTheirServiceUrl() throws Exception {
        try (OpenWhiskApiStandIn svc = new OpenWhiskApiStandIn(KEY)) {
            svc.answers.put("resize", new OpenWhiskApiStandIn.Answer(200, "{\"y\":5}", 0));
            svc.answers.put("thumbs", new OpenWhiskApiStandIn.Answer(200, "{\"y\":6}", 0));
            with("javascript", env("CPUSLOT_CHAIN_URL", svc.url() + "/{namespace}/{name}",
                    "CPUSLOT_CHAIN_URLS", "thumb=" + svc.url() + "/other/thumbs"), c -> {
                JsonObject init = new JsonObject();
                init.add("init", initPayload(CALLER, "main").getAsJsonObject("value"));
                assertEquals(200, c.post("/", init.toString()).code());
                JsonObject req = json("{\"activation\":{\"namespace\":\"team-a\"},\"value\":{\"callee\":\"resize\",\"args\":{\"x\":1}}}");
                Reply r = c.post("/", req.toString());
                assertEquals(5, r.body().getAsJsonObject("got").get("y").getAsInt(), String.valueOf(r.raw()));
                OpenWhiskApiStandIn.Request q = svc.requests.get(0);
                assertEquals("/team-a/resize", q.pathAndQuery());
                assertNull(q.authorization(), "no key goes to a service");
                assertEquals(1, json(q.body()).getAsJsonObject("value").get("x").getAsInt(), q.body());
                assertEquals(1, json(q.body()).getAsJsonObject("value").get("__cpuslot_chain_depth").getAsInt(), q.body());
                req.getAsJsonObject("value").addProperty("callee", "thumb");
                r = c.post("/", req.toString());
                assertEquals(6, r.body().getAsJsonObject("got").get("y").getAsInt(), String.valueOf(r.raw()));
                assertEquals("/other/thumbs", svc.requests.get(1).pathAndQuery());
                for (String bad : List.of("Resize", "a.b", "a/b", "-a", "a_b", "../x")) {
                    req.getAsJsonObject("value").add("callee", new JsonPrimitive(bad));
                    JsonObject o = c.post("/", req.toString()).body();
                    assertEquals("BAD_NAME", o.has("kind") ? o.get("kind").getAsString() : o.toString(), bad + ": " + o);
                }
                assertEquals(2, svc.requests.size(), svc.requests.toString());
            });
        }
    }

    /**
     * The platform path's threads (its HTTP client's, the log writer's) are the runtime's: a Java
     * caller held to one thread of its own (CPUSLOT_JAVA_MAX_THREADS=1) calls through it, again
     * and again, synchronously and not.
     */
    @Test
    void thePlatformPathsThreadsAreNotTheCallersThreads() throws Exception {
        try (OpenWhiskApiStandIn svc = new OpenWhiskApiStandIn(KEY)) {
            svc.answers.put("resize", new OpenWhiskApiStandIn.Answer(200, "{\"y\":7}", 0));
            with("java", env("CPUSLOT_JAVA_MAX_THREADS", "1", "CPUSLOT_CHAIN_URLS", "resize=" + svc.url() + "/resize"), c -> {
                registerJava(c, "caller", "Caller", "");
                for (int i = 0; i < 3; i++) {
                    JsonObject r = result(invoke(c, "caller", "{\"mode\":\"catch\",\"callee\":\"resize\",\"args\":{}}"));
                    assertEquals(7, r.getAsJsonObject("got").get("y").getAsInt(), r.toString());
                }
                JsonObject r = result(invoke(c, "caller", "{\"mode\":\"async\",\"callee\":\"resize\",\"n\":3,\"args\":{}}"));
                assertFalse(r.has("kind"), r.toString());
                for (int i = 0; i < 3000 && svc.requests.size() < 6; i++) Thread.sleep(10);
                assertEquals(6, svc.requests.size(), svc.requests + "\n--- runtime log:\n" + Files.readString(c.runtimeLog));
            });
        }
    }

    /**
     * The runtime's own threads made while a function's activation runs (the platform path's HTTP
     * client, the log writer, the virtual threads' carriers) are not that activation's: a
     * function that starts a thread of its own on the same worker, whose threads all end with its
     * activation, ends none of them, and the next call through the platform path is answered.
     */
    @Test
    void theRuntimesThreadsOutliveAFunctionsThreads() throws Exception {
        try (OpenWhiskApiStandIn svc = new OpenWhiskApiStandIn(KEY)) {
            svc.answers.put("resize", new OpenWhiskApiStandIn.Answer(200, "{\"y\":7}", 0));
            with("java", env("CPUSLOT_CHAIN_URLS", "resize=" + svc.url() + "/resize"), c -> {
                registerJava(c, "caller", "Caller", "&timeout=20000");
                String call = "{\"mode\":\"catch\",\"callee\":\"resize\",\"args\":{}}";
                for (int round = 0; round < 3; round++) {
                    JsonObject r = result(invoke(c, "caller", call));
                    assertTrue(r.has("got"), "round " + round + ": " + r);
                    assertEquals(7, r.getAsJsonObject("got").get("y").getAsInt(), "round " + round + ": " + r);
                    r = result(invoke(c, "caller", "{\"mode\":\"async\",\"callee\":\"resize\",\"n\":1,\"args\":{}}"));
                    assertFalse(r.has("kind"), r.toString());
                    r = result(invoke(c, "caller", "{\"mode\":\"thread\",\"callee\":\"\"}"));
                    assertTrue(r.has("thread"), r.toString());
                }
                int want = 6;
                for (int i = 0; i < 3000 && svc.requests.size() < want; i++) Thread.sleep(10);
                assertEquals(want, svc.requests.size(), svc.requests + "\n--- runtime log:\n" + Files.readString(c.runtimeLog));
                // the log writer still writes: every hop has its line
                String log = "";
                for (int i = 0; i < 3000 && count(log, "action=resize status=ok") < want; i++) {
                    Thread.sleep(10);
                    log = Files.readString(c.runtimeLog);
                }
                assertEquals(want, count(log, "action=resize status=ok"), log);
            });
        }
    }

    // ---- declared sequences --------------------------------------------------------------------

    static final String INC = "function main(a) { return { x: a.x + 1 }; }";
    static final String FAILS = "function main(a) { return { error: 'step failed at ' + a.x }; }";
    static final String THROWS = "function main(a) { throw new Error('thrown at ' + a.x); }";

    /**
     * Hydra /register?steps=a,b,c declares a sequence: the output of step i is the input of step
     * i+1, each step its own hop (own worker, slot, log line); a step whose result has an "error"
     * ends the sequence with that result (OpenWhisk's sequences); a step that throws fails it.
     */
    @Test
    void aRegisteredSequenceRunsItsStepsLocally() throws Exception {
        with("javascript", c -> {
            registerJava(c, "double", "Double", "");
            registerText(c, "inc", "javascript", INC, "");
            registerText(c, "fails", "javascript", FAILS, "");
            registerText(c, "throws", "javascript", THROWS, "");
            assertEquals(200, c.post("/register?name=pipe&steps=double,inc,double", "").code());
            Reply r = invoke(c, "pipe", "{\"x\":1}");
            assertEquals(6, result(r).get("x").getAsInt(), String.valueOf(r.raw()));
            assertEquals("3", r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
            assertTrue(r.header("X-Cpuslot-Chain").matches("double=[-0-9]+,inc=[-0-9]+,double=[-0-9]+"), r.header("X-Cpuslot-Chain"));

            assertEquals(200, c.post("/register?name=stops&steps=double,fails,inc", "").code());
            r = invoke(c, "stops", "{\"x\":1}");
            assertEquals("step failed at 2", result(r).get("error").getAsString(), String.valueOf(r.raw()));
            assertEquals("2", r.header("X-Cpuslot-Chain-Hops"), "the step after the error did not run");

            assertEquals(200, c.post("/register?name=broken&steps=inc,throws,inc", "").code());
            r = invoke(c, "broken", "{\"x\":1}");
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            String err = r.body().get("error").getAsString();
            assertTrue(err.contains("throws") && err.contains("thrown at 2"), err);

            assertEquals(200, c.post("/register?name=missing&steps=inc,nowhere", "").code());
            r = invoke(c, "missing", "{\"x\":1}");
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            assertTrue(r.body().get("error").getAsString().contains("NOT_LOCAL"), String.valueOf(r.raw()));

            // one log line per step, written off the critical path
            String log = "";
            for (int i = 0; i < 3000 && count(log, "chain=sequence") < 3; i++) {
                Thread.sleep(10);
                log = Files.readString(c.runtimeLog);
            }
            assertTrue(count(log, "chain=sequence") >= 3, log);
            assertTrue(log.contains("action=inc status=ok chain=sequence"), log);

            // declared badly: refused at registration
            assertEquals(400, c.post("/register?name=bad&steps=inc,../x", "").code());
            assertEquals(400, c.post("/register?name=bad&steps=" + "inc,".repeat(51) + "inc", "").code());
            assertEquals(400, c.post("/register?name=bad&steps=", "").code());
        });
    }

    /** A sequence's steps belong to its owner: another owner's function is refused. */
    @Test
    void aSequenceStaysWithItsOwner() throws Exception {
        with("javascript", env("CPUSLOT_OWNER", "*"), c -> {
            registerText(c, "bobs", "javascript", INC, "&owner=bob");
            registerText(c, "inc", "javascript", INC, "&owner=alice");
            assertEquals(200, c.post("/register?name=pipe&owner=alice&steps=inc,bobs", "").code());
            Reply r = invoke(c, "pipe", "{\"x\":1}");
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            assertTrue(r.body().get("error").getAsString().contains("OTHER_OWNER"), String.valueOf(r.raw()));
        });
    }

    /**
     * An OpenWhisk action that names its next steps (init parameter CPUSLOT_CHAIN_STEPS): its own
     * result goes to the first, local first (a function registered beside it), then global (the
     * OpenWhisk API); the last step's result is the activation's.
     */
    @Test
    void anActionsDeclaredStepsRunLocalFirstThenGlobal() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(KEY)) {
            ow.answers.put("store", new OpenWhiskApiStandIn.Answer(200, "{\"stored\":true}", 0));
            with("javascript", env("__OW_API_HOST", ow.url()), c -> {
                Reply i = c.init(initPayload("function main(a) { return { x: a.x * 10 }; }", "main", false,
                        Map.of("CPUSLOT_CHAIN_STEPS", new JsonPrimitive("double,store"))));
                assertEquals(200, i.code(), String.valueOf(i.raw()));
                registerJava(c, "double", "Double", "&owner=guest");
                Reply r = c.run(runPayload(json("{\"x\":2}"), Map.of("api_key", KEY, "namespace", "guest",
                        "action_name", "/guest/pipe", "deadline", Long.toString(System.currentTimeMillis() + 60_000))));
                assertEquals(200, r.code(), String.valueOf(r.raw()));
                assertTrue(r.body().get("stored").getAsBoolean(), r.body().toString());
                assertEquals(1, ow.requests.size(), ow.requests.toString());
                assertEquals("/api/v1/namespaces/guest/actions/store?blocking=true&result=true", ow.requests.get(0).pathAndQuery());
                assertEquals(40, json(ow.requests.get(0).body()).get("x").getAsInt(), ow.requests.get(0).body());
                assertEquals("2", r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
            });
        }
    }

    static JsonElement parse(String s) { return JsonParser.parseString(s); }
}
