package dev.cpuslot.runtime;

import com.google.gson.JsonObject;
import dev.cpuslot.slot.FakeAgent;
import dev.cpuslot.slot.Protocol;
import dev.cpuslot.slot.SlotClient;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import com.sun.net.httpserver.HttpServer;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * The runtime's side of lending (docs/lending.md): which actions' leases sleep around their
 * synchronous chain calls (the per-action setting), and the per-function counters the idle
 * ratio is computed from. Against the fake agent, which announces LEND and answers every
 * RELEASE with a known CPU figure (1000 ns x the lease id).
 */
class LendingTest {
    @TempDir
    Path dir;

    static SlotClient client(FakeAgent a) {
        return SlotClient.builder().socket(a.socket.toString()).acquireBudget(Duration.ofMillis(500)).build();
    }

    /** Registers testfns.Calls as {@code name} with the extra /register parameters. */
    static void registerCaller(Harness h, String name, String extra) throws Exception {
        Resp r = h.postBytes("/register?name=" + name + "&language=java&entryPoint=testfns.Calls&quota=500m" + extra, testJar());
        assertEquals(200, r.status(), r.raw());
    }

    static Resp call(Harness h, String caller, String callee, long ms) throws Exception {
        JsonObject args = json("{\"callee\":\"" + callee + "\",\"args\":{\"ms\":" + ms + ",\"id\":1}}");
        JsonObject body = new JsonObject();
        body.addProperty("name", caller);
        body.addProperty("arguments", args.toString());
        return h.post("/", body.toString(), SlotsAndQuotaTest.USAGE);
    }

    /** The RELEASEs with the flag (SLEEP or WAKE) the agent received. */
    static long sleepWakes(FakeAgent a, int flag) {
        return a.received.stream().filter(m -> m instanceof Protocol.Release r && (r.flags() & flag) != 0).count();
    }

    static double value(String metrics, String series) {
        return metrics.lines().filter(l -> l.startsWith(series + " ")).mapToDouble(l -> Double.parseDouble(l.substring(series.length() + 1)))
                .findFirst().orElse(Double.NaN);
    }

    @Test
    void anActionWithLendingOffSendsNoSleepAroundItsChainCallsAndOneWithItOnDoes() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.lends = true;
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), client(agent))) {
                assertEquals(200, h.postBytes("/register?name=sleep&language=java&entryPoint=testfns.Sleep&quota=200m", testJar()).status());
                registerCaller(h, "follows", "");
                registerCaller(h, "off", "&lend=false");

                Resp r = call(h, "off", "sleep", 1);
                assertEquals(200, r.status(), r.raw());
                assertEquals(0, sleepWakes(agent, Protocol.RELEASE_SLEEP), "lending off: no SLEEP: " + agent.received);

                r = call(h, "follows", "sleep", 1);
                assertEquals(200, r.status(), r.raw());
                assertEquals(1, sleepWakes(agent, Protocol.RELEASE_SLEEP), "the pod's setting (LEND): the call sleeps: " + agent.received);
                assertEquals(1, sleepWakes(agent, Protocol.RELEASE_WAKE), agent.received.toString());
            }
        }
    }

    @Test
    void withThePodsDefaultOffOnlyAnActionThatOptsInSleeps() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.lends = true;
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false", "CPUSLOT_DEFAULT_LEND", "false"), client(agent))) {
                assertEquals(200, h.postBytes("/register?name=sleep&language=java&entryPoint=testfns.Sleep&quota=200m", testJar()).status());
                registerCaller(h, "follows", "");
                registerCaller(h, "on", "&lend=true");

                assertEquals(200, call(h, "follows", "sleep", 1).status());
                assertEquals(0, sleepWakes(agent, Protocol.RELEASE_SLEEP), "the runtime's default is off: " + agent.received);
                assertEquals(200, call(h, "on", "sleep", 1).status());
                assertEquals(1, sleepWakes(agent, Protocol.RELEASE_SLEEP), "the action opted in: " + agent.received);
            }
        }
    }

    @Test
    void anOpenWhiskActionsCpuLendAnnotationIsReadAsItsCpuQuotaIs() throws Exception {
        AtomicReference<String> lend = new AtomicReference<>("false");
        HttpServer ow = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 16);
        ow.createContext("/api/v1/namespaces/", ex -> {
            byte[] b = ("{\"name\":\"caller\",\"annotations\":[{\"key\":\"cpu-lend\",\"value\":" + lend.get() + "}]}")
                    .getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(200, b.length);
            ex.getResponseBody().write(b);
            ex.close();
        });
        ow.start();
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.lends = true;
            try (Harness h = new Harness(Map.of("__OW_API_HOST", "http://127.0.0.1:" + ow.getAddress().getPort()), client(agent))) {
                assertEquals(200, h.postBytes("/register?name=sleep&language=java&entryPoint=testfns.Sleep&quota=200m", testJar()).status());
                JsonObject init = json(initJava("testfns.Calls"));
                init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"500m\"}"));
                assertEquals(200, h.post("/init", init.toString()).status());
                String value = "{\"callee\":\"sleep\",\"args\":{\"ms\":1,\"id\":1}}";
                Map<String, String> v1 = Map.of("api_key", "user:secret", "action_name", "/guest/caller", "action_version", "0.0.1");
                // until the background read has answered, the action follows the pod (it sleeps);
                // then its annotation says false: a call sends no SLEEP
                boolean off = false;
                for (int i = 0; i < 500 && !off; i++) {
                    long before = sleepWakes(agent, Protocol.RELEASE_SLEEP);
                    Resp r = h.post("/run", run(json(value), v1));
                    assertEquals(200, r.status(), r.raw());
                    off = sleepWakes(agent, Protocol.RELEASE_SLEEP) == before;
                    if (!off) Thread.sleep(20);
                }
                assertTrue(off, "the annotation cpu-lend=false was never applied: " + agent.received);
                // a value that is no boolean refuses the activation, as a bad cpu-quota does
                lend.set("\"sometimes\"");
                Map<String, String> v2 = Map.of("api_key", "user:secret", "action_name", "/guest/caller", "action_version", "0.0.2");
                Resp bad = null;
                for (int i = 0; i < 500 && (bad == null || bad.status() != 400); i++) {
                    bad = h.post("/run", run(json(value), v2));
                    if (bad.status() != 400) Thread.sleep(20);
                }
                assertEquals(400, bad.status(), bad.raw());
                assertTrue(bad.obj().get("error").getAsString().contains("cpu-lend"), bad.raw());
                assertEquals(1, value(h.metrics(), "cpuslot_lend_invalid_total{source=\"annotation\"}"));
            }
        } finally {
            ow.stop(0);
        }
    }

    @Test
    void aBadLendingValueIsATypedErrorAndCounted() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start();
             Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), client(agent))) {
            Resp reg = h.postBytes("/register?name=x&language=java&entryPoint=testfns.Calls&lend=sometimes", testJar());
            assertEquals(400, reg.status(), reg.raw());
            assertTrue(reg.raw().contains("lend"), reg.raw());
            // OpenWhisk and Knative: the /init env, read at each activation as CPUSLOT_QUOTA is
            JsonObject init = json(initJava("testfns.Echo"));
            init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\",\"CPUSLOT_LEND\":\"sometimes\"}"));
            assertEquals(200, h.post("/init", init.toString()).status());
            Resp r = h.post("/run", run(json("{}")));
            assertEquals(400, r.status(), r.raw());
            assertTrue(r.obj().get("error").getAsString().contains("CPUSLOT_LEND"), r.raw());
            String m = h.metrics();
            assertEquals(1, value(m, "cpuslot_lend_invalid_total{source=\"init\"}"), m);
            assertEquals(1, value(m, "cpuslot_bad_requests_total{reason=\"register_failed\"}"), m);
            assertEquals(0, callAcquires(agent), "no call ran (the load took its slot)");
        }
    }

    @Test
    void metricsHaveEachFunctionsReservedAndSleptTimeBesideItsCpu() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.lends = true;
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), client(agent))) {
                assertEquals(200, h.postBytes("/register?name=sleep&language=java&entryPoint=testfns.Sleep&quota=200m", testJar()).status());
                registerCaller(h, "caller", "");
                long t0 = System.nanoTime();
                Resp r = call(h, "caller", "sleep", 300);
                double wall = (System.nanoTime() - t0) / 1e9;
                assertEquals(200, r.status(), r.raw());
                h.awaitLog(" action=caller "); // written after the reply, after the usage metrics
                String m = h.metrics();
                // the caller held 500m for at least the callee's 300 ms, and slept through it
                double callerReserved = value(m, "cpuslot_slot_reserved_seconds_total{function=\"caller\"}");
                double callerSlept = value(m, "cpuslot_slot_slept_seconds_total{function=\"caller\"}");
                double calleeReserved = value(m, "cpuslot_slot_reserved_seconds_total{function=\"sleep\"}");
                assertTrue(callerReserved >= 0.5 * 0.3 && callerReserved <= 0.5 * wall, callerReserved + " of " + wall + " s: " + m);
                assertTrue(callerSlept >= 0.3 && callerSlept <= wall, callerSlept + " of " + wall + " s: " + m);
                assertTrue(calleeReserved >= 0.2 * 0.3 && calleeReserved <= 0.2 * wall, calleeReserved + ": " + m);
                assertEquals(0, value(m, "cpuslot_slot_slept_seconds_total{function=\"sleep\"}"), "the callee made no call: " + m);
                // the fake slot's CPU (RELEASE_OK: 1000 ns x lease id) is beside it, so the idle
                // ratio 1 - cpu / reserved is a PromQL expression over the two families
                double cpu = value(m, "cpuslot_slot_cpu_seconds_total{function=\"caller\"}");
                assertTrue(cpu > 0 && cpu < 1e-3, cpu + ": " + m);
                assertTrue(m.contains("# TYPE cpuslot_slot_reserved_seconds_total counter"), m);
                assertTrue(m.contains("# TYPE cpuslot_slot_slept_seconds_total counter"), m);
            }
        }
    }
}
