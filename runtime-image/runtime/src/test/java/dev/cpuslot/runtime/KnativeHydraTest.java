package dev.cpuslot.runtime;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;
import dev.cpuslot.runtime.core.FunctionRuntime;

class KnativeHydraTest {
    @TempDir
    Path dir;

    @Test
    void knativeSingleEntrypointInitAndRunInOneRequestThenRunOnly() throws Exception {
        try (Harness h = new Harness()) {
            JsonObject both = new JsonObject();
            both.add("init", json(initJava("testfns.Env")).getAsJsonObject("value"));
            both.add("activation", json("{\"namespace\":\"kn\",\"action_name\":\"/kn/env\",\"activation_id\":\"k1\"}"));
            both.add("value", json("{\"x\":1}"));
            Resp r = h.post("/", both.toString());
            assertEquals(200, r.status(), r.raw());
            assertEquals("k1", r.obj().get("__OW_ACTIVATION_ID").getAsString());
            assertEquals("kn", r.obj().get("__OW_NAMESPACE").getAsString());
            Resp run = h.post("/", "{\"activation\":{\"activation_id\":\"k2\"},\"value\":{}}");
            assertEquals(200, run.status());
            assertEquals("k2", run.obj().get("__OW_ACTIVATION_ID").getAsString());
            JsonObject reinit = new JsonObject();
            reinit.add("init", json(initJava("testfns.Echo")).getAsJsonObject("value"));
            Resp again = h.post("/", reinit.toString());
            assertEquals(403, again.status());
            assertEquals(json("{\"error\":\"Cannot initialize the action more than once: this runtime already runs different code.\"}"),
                    again.json());
            assertTrue(h.stdout().strip().endsWith(FunctionRuntime.SENTINEL));
        }
    }

    static String bundled(String initJson, String activationId, String value) {
        JsonObject b = new JsonObject();
        b.add("init", json(initJson).getAsJsonObject("value"));
        b.add("activation", json("{\"activation_id\":\"" + activationId + "\",\"action_name\":\"/kn/env\"}"));
        b.add("value", json(value));
        return b.toString();
    }

    @Test
    void knativeRequestsThatAlwaysBundleTheSameInitRunEveryActivation() throws Exception {
        try (Harness h = new Harness()) {
            String init = initJava("testfns.Env");
            for (int i = 0; i < 5; i++) {
                Resp r = h.post("/", bundled(init, "b" + i, "{\"i\":" + i + "}"));
                assertEquals(200, r.status(), "request " + i + ": " + r.raw());
                assertEquals("b" + i, r.obj().get("__OW_ACTIVATION_ID").getAsString());
            }
            // an init-only request with the same code is not an error either
            JsonObject initOnly = new JsonObject();
            initOnly.add("init", json(init).getAsJsonObject("value"));
            assertEquals(json("{\"ok\":true}"), h.post("/", initOnly.toString()).json());
            assertTrue(h.metrics().contains("cpuslot_repeated_inits_total 5"), h.metrics());
            assertFalse(h.stderr().contains("Cannot initialize"), h.stderr());
            // OpenWhisk's /init twice is still refused exactly as its test suite expects
            Resp ow = h.post("/init", init);
            assertEquals(403, ow.status());
            assertEquals(json("{\"error\":\"Cannot initialize the action more than once.\"}"), ow.json());
        }
    }

    @Test
    void aScaledOutPodThatGetsConcurrentBundledRequestsFirstInitialisesOnceAndRunsThemAll() throws Exception {
        try (Harness h = new Harness()) {
            String init = initJava("testfns.Env");
            List<CompletableFuture<Resp>> rs = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                String body = bundled(init, "c" + i, "{}");
                rs.add(CompletableFuture.supplyAsync(() -> {
                    try {
                        return h.post("/", body);
                    } catch (Exception e) {
                        throw new RuntimeException(e);
                    }
                }, r -> Thread.ofPlatform().start(r)));
            }
            for (int i = 0; i < 8; i++) {
                Resp r = rs.get(i).get(60, TimeUnit.SECONDS);
                assertEquals(200, r.status(), r.raw());
                assertEquals("c" + i, r.obj().get("__OW_ACTIVATION_ID").getAsString());
            }
            assertEquals(1, h.log().lines().filter(l -> l.contains("initialised")).count(), h.log());
        }
    }

    @Test
    void aBundledInitWithDifferentCodeOnAnInitialisedRuntimeIsAnErrorAndRunsNothing() throws Exception {
        try (Harness h = new Harness()) {
            assertEquals(200, h.post("/", bundled(initJava("testfns.Env"), "d1", "{}")).status());
            Resp r = h.post("/", bundled(initJava("testfns.Echo"), "d2", "{\"echo\":1}"));
            assertEquals(403, r.status());
            assertEquals(json("{\"error\":\"Cannot initialize the action more than once: this runtime already runs different code.\"}"), r.json());
            // same code, other env: a different function too
            JsonObject other = json(bundled(initJava("testfns.Env"), "d3", "{}"));
            other.getAsJsonObject("init").add("env", json("{\"X\":\"1\"}"));
            assertEquals(403, h.post("/", other.toString()).status());
            assertTrue(h.metrics().contains("cpuslot_bad_requests_total{reason=\"reinit_different\"} 2"), h.metrics());
            Resp ok = h.post("/", "{\"activation\":{\"activation_id\":\"d4\"},\"value\":{}}");
            assertEquals("d4", ok.obj().get("__OW_ACTIVATION_ID").getAsString(), "the first code still serves");
        }
    }

    @Test
    void knativeInitOnlyThenValueOnly() throws Exception {
        try (Harness h = new Harness()) {
            JsonObject init = new JsonObject();
            init.add("init", json(initJava("testfns.Echo")).getAsJsonObject("value"));
            Resp r = h.post("/", init.toString());
            assertEquals(200, r.status(), r.raw());
            Resp run = h.post("/", "{\"value\":{\"k\":\"v\"}}");
            assertEquals(json("{\"k\":\"v\"}"), run.json());
        }
    }

    static String q(String s) { return URLEncoder.encode(s, StandardCharsets.UTF_8); }

    @Test
    void hydraRegisterInvokeAndDeregisterWithIsolationBetweenFunctions() throws Exception {
        Path jar = dir.resolve("fns.jar");
        Files.write(jar, testJar());
        try (Harness h = new Harness()) {
            for (String name : new String[]{"a", "b"}) {
                Resp reg = h.post("/register?name=" + name + "&url=" + q(jar.toUri().toString())
                        + "&entryPoint=testfns.Counter&language=java&sandbox=isolate", "");
                assertEquals(200, reg.status(), reg.raw());
            }
            Resp r = null;
            for (int i = 0; i < 3; i++) r = h.post("/", "{\"name\":\"a\",\"arguments\":\"{\\\"name\\\":\\\"x\\\"}\"}");
            assertEquals(200, r.status(), r.raw());
            assertEquals(3, r.obj().getAsJsonObject("result").get("count").getAsInt());
            assertEquals("x", r.obj().getAsJsonObject("result").get("name").getAsString());
            assertTrue(r.obj().get("process time (us)").getAsLong() >= 0);
            Resp b = h.post("/", "{\"name\":\"b\",\"arguments\":\"{}\"}");
            assertEquals(1, b.obj().getAsJsonObject("result").get("count").getAsInt(), "b's statics are not a's");
            assertEquals(200, h.post("/deregister?name=a", "").status());
            assertEquals(404, h.post("/", "{\"name\":\"a\",\"arguments\":\"{}\"}").status());
            assertEquals(200, h.post("/", "{\"name\":\"b\",\"arguments\":\"{}\"}").status());
        }
    }

    @Test
    void hydraBadInputsGetErrors() throws Exception {
        try (Harness h = new Harness()) {
            assertEquals(400, h.post("/register?name=x&language=java&entryPoint=testfns.Nope", "").status(), "no url, no body");
            Resp missing = h.postBytes("/register?name=x&language=java&entryPoint=testfns.Nope", testJar());
            assertEquals(400, missing.status());
            assertTrue(missing.obj().get("error").getAsString().contains("testfns.Nope"));
            assertEquals(200, h.postBytes("/register?name=t&language=java&entryPoint=testfns.Throws", testJar()).status());
            Resp t = h.post("/", "{\"name\":\"t\",\"arguments\":\"{}\"}");
            assertEquals(502, t.status());
            assertTrue(t.obj().get("error").getAsString().contains("boom"));
            assertEquals(400, h.post("/", "{\"name\":\"t\",\"arguments\":\"{not json\"}").status());
            assertEquals(200, h.post("/warmup?name=t", "").status());
        }
    }

    @Test
    void hydraReportsSlotUsageInTheBodyWhenAsked() throws Exception {
        try (Harness h = new Harness(Map.of("CPUSLOT_DEFAULT_QUOTA", "250m"), null)) {
            h.postBytes("/register?name=c&language=java&entryPoint=testfns.Counter", testJar());
            Resp r = h.post("/", "{\"name\":\"c\",\"arguments\":\"{}\"}", Map.of("X-Cpuslot-Report", "body"));
            assertEquals(200, r.status());
            JsonObject rep = r.obj().getAsJsonObject("cpuslot");
            assertEquals(250, rep.get("quota_milli").getAsLong());
            assertEquals("default", rep.get("quota_source").getAsString());
            assertEquals("250", r.header("X-Cpuslot-Quota-Milli"));
        }
    }

    /**
     * Knative's queue-proxy forwards a request that carries a kubelet-probe mark (a
     * {@code K-Kubelet-Probe} header, a {@code kube-probe/} User-Agent) outside its
     * containerConcurrency breaker, from any peer, a function's own calls through it included: such
     * a request is served only as a probe (/ready, GET /, an empty POST /), never as an invocation
     * or a control request, so the breaker bounds every invocation.
     */
    @Test
    void aRequestMarkedAsAProbeInvokesNothing() throws Exception {
        try (Harness h = new Harness()) {
            String init = initJava("testfns.Env");
            assertEquals(200, h.post("/", bundled(init, "p0", "{}")).status());
            for (Map<String, String> mark : List.of(Map.of("K-Kubelet-Probe", "queue"), Map.of("User-Agent", "kube-probe/1.37"),
                    Map.of("K-Network-Probe", "queue"))) {
                Resp kn = h.post("/", bundled(init, "p1", "{}"), mark);
                assertEquals(403, kn.status(), mark + " POST /: " + kn.raw());
                assertTrue(kn.raw().contains("probe"), kn.raw());
                assertEquals(403, h.post("/run", "{\"value\":{}}", mark).status(), mark + " /run");
                assertEquals(403, h.post("/register?name=x&language=java&entryPoint=x", "", mark).status(), mark + " /register");
                assertEquals(200, h.send(java.net.http.HttpRequest.newBuilder(java.net.URI.create("http://127.0.0.1:" + h.front.port() + "/ready"))
                        .header(mark.keySet().iterator().next(), mark.values().iterator().next()).GET().build()).status(), mark + " /ready");
                assertEquals(200, h.post("/", "", mark).status(), mark + " an empty POST /, Knative's probe");
            }
            assertEquals(200, h.post("/", bundled(init, "p2", "{}")).status(), "the same invocation without the mark");
        }
    }
}
