package dev.cpuslot.runtime;

import com.google.gson.JsonObject;
import com.sun.net.httpserver.HttpServer;
import dev.cpuslot.slot.FakeAgent;
import dev.cpuslot.slot.Protocol;
import dev.cpuslot.slot.SlotClient;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicReference;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.core.Quota;

class SlotsAndQuotaTest {
    @TempDir
    Path dir;

    SlotClient client(FakeAgent a) {
        return SlotClient.builder().socket(a.socket.toString()).acquireBudget(Duration.ofMillis(500)).build();
    }

    @Test
    void eachInvocationTakesASlotWithItsQuotaOnItsWorkerThreadAndReportsUsage() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start();
             Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), client(agent))) {
            JsonObject init = json(initJava("testfns.Echo"));
            init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\"}"));
            assertEquals(200, h.post("/init", init.toString()).status());
            // the function's load (its static initialisers) ran in a slot at its quota, given back
            Protocol.Acquire load = loadReleased(agent);
            assertEquals(300, load.quotaMilli());
            Resp r = h.post("/run", run(json("{\"x\":1}"), Map.of("activation_id", "act-42", "action_name", "/guest/echo")), USAGE);
            assertEquals(200, r.status(), r.raw());
            assertEquals(json("{\"x\":1}"), r.json(), "the result is untouched");
            assertEquals("300", r.header("X-Cpuslot-Quota-Milli"));
            assertEquals("init", r.header("X-Cpuslot-Quota-Source"));
            long slot = Long.parseLong(r.header("X-Cpuslot-Slot"));
            assertEquals("cache_hit", r.header("X-Cpuslot-Outcome"), "the load's slot");
            assertNotNull(r.header("X-Cpuslot-Cpu-Ns"));
            assertEquals("00", agent.slotContent(slot), "the load's thread placed itself, then the worker's");
            Protocol.Acquire a = (Protocol.Acquire) agent.received.stream().filter(m -> m instanceof Protocol.Acquire x && x != load).findFirst().orElseThrow();
            assertEquals(300, a.quotaMilli());
            assertEquals("/guest/echo", a.action());
            assertEquals("act-42", a.invocation());
            assertEquals(2, agent.count(Protocol.Release.class), "the load's and the call's");
            String line = "cpuslot: activation=act-42 action=/guest/echo status=ok quota=300m source=init slot=" + slot
                    + " outcome=cache_hit place=self cpu_ms=";
            assertTrue(h.awaitLog(line).contains(line), h.log());
            assertFalse(h.stdout().contains("cpuslot:"), "the runtime's line is not in the tenant's stdout: " + h.stdout());
            // same worker, same quota: affinity, no second write
            Resp r2 = h.post("/run", run(json("{}"), Map.of("activation_id", "act-43")), USAGE);
            assertEquals("affinity_hit", r2.header("X-Cpuslot-Outcome"));
            assertEquals("00", agent.slotContent(slot), "no second write by the worker");
            h.awaitLog("activation=act-43 "); // written after the reply, after the usage metrics
            String m = h.metrics();
            assertTrue(m.contains("cpuslot_slot_outcomes_total{outcome=\"affinity_hit\"} 1"), m);
            assertTrue(m.contains("cpuslot_slot_client_events_total{event=\"release.ok\"} 3"), m); // the load's too
            assertTrue(m.contains("cpuslot_slot_cpu_seconds_total{function=\"__ow_action\"}"), m);
            // both acquisitions in the acquire latency's histogram, every one at most the budget + the first one's
            assertTrue(m.contains("\ncpuslot_slot_acquire_seconds_count 2\n"), m);
            assertTrue(m.contains("\ncpuslot_slot_acquire_seconds_bucket{le=\"1.0\"} 2\n"), m);
            assertTrue(m.contains("\n# TYPE cpuslot_slot_acquire_seconds histogram\n"), m);
            assertTrue(m.contains("\njvm_memory_used_bytes{area=\"heap\"} "), "the JVM's metrics on the runtime's page");
        }
    }

    /** Asks for the invocation's usage in the answer (read before the reply). */
    static final Map<String, String> USAGE = Map.of("X-Cpuslot-Usage", "reply");

    @Test
    void withLocalLeasingTheAnswerCarriesNoUsageUnlessAskedAndTheLogAndTheAgentStillGetIt() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.statFds = 2; // v1: cpu.stat and cpuacct.usage
            agent.grantsLocal = true;
            SlotClient c = SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofMillis(500)).build();
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), c)) {
                JsonObject init = json(initJava("testfns.Echo"));
                init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\"}"));
                assertEquals(200, h.post("/init", init.toString()).status());
                Resp first = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "u0")));
                assertEquals(200, first.status(), first.raw());
                long slot = Long.parseLong(first.header("X-Cpuslot-Slot"));
                // what the slot used from here on, as the kernel shows it: set before the warm
                // invocations, so that whichever read closes their batch sees it (the next
                // invocation's, or the upkeep's of an entry idle a second, as on a loaded machine;
                // CPU a slot counts after that read and before the next invocation is no one's)
                agent.setCounters(slot, 5_000_000, 0, 1, 0);
                for (int i = 1; i <= 5; i++) {
                    Resp r = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "u" + i)));
                    assertEquals(200, r.status(), r.raw());
                    assertEquals("true", r.header("X-Cpuslot-Local"), r.raw());
                    assertNull(r.header("X-Cpuslot-Cpu-Ns"), "the reply went out before the counters were read: " + r.http().headers());
                    assertNull(r.header("X-Cpuslot-Throttled-Ns"), r.http().headers().toString());
                }
                // asked for: the answer carries the invocation's own usage, not that of the warm
                // invocations before it whose counters were not read yet (batched)
                Resp asked = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "u6")), USAGE);
                assertEquals(200, asked.status(), asked.raw());
                assertEquals("0", asked.header("X-Cpuslot-Cpu-Ns"), "its own usage: " + asked.http().headers());
                assertEquals("0", asked.header("X-Cpuslot-Throttled-Ns"), asked.http().headers().toString());
                String log = h.awaitLog("activation=u6 ");
                assertTrue(log.lines().anyMatch(l -> l.contains("activation=u6 ") && l.contains(" cpu_ms=0.000 ")), log);
                // the runtime's CPU metric gets every batch once (5 ms in all)
                long end = System.nanoTime() + 30_000_000_000L;
                while (!h.metrics().contains("cpuslot_slot_cpu_seconds_total{function=\"__ow_action\"} 0.005") && System.nanoTime() < end)
                    Thread.sleep(10);
                assertTrue(h.metrics().contains("cpuslot_slot_cpu_seconds_total{function=\"__ow_action\"} 0.005"), h.metrics());
                // the agent's USAGE sums every invocation (the slot's 5 ms once)
                long until = System.nanoTime() + 30_000_000_000L;
                long[] sum = new long[2];
                while (System.nanoTime() < until) {
                    sum = agent.received.stream().filter(m -> m instanceof Protocol.UsageReport)
                            .flatMap(m -> ((Protocol.UsageReport) m).records().stream()).filter(u -> u.action().equals("/guest/echo"))
                            .map(u -> new long[]{u.invocations(), u.cpuNanos()}).reduce(new long[2], (a, b) -> new long[]{a[0] + b[0], a[1] + b[1]});
                    if (sum[0] >= 7) break;
                    Thread.sleep(10);
                }
                assertEquals(7, sum[0], "every invocation in USAGE: " + agent.received);
                assertEquals(5_000_000, sum[1], "the slot's CPU, counted once: " + agent.received);
            }
        }
    }

    @Test
    void warmInvocationsWhoseUsageIsBatchedCountTheirReservedTimeBesideTheirCpu() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.statFds = 2;
            agent.grantsLocal = true;
            SlotClient c = SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofMillis(500)).build();
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), c)) {
                JsonObject init = json(initJava("testfns.Echo"));
                init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\"}"));
                assertEquals(200, h.post("/init", init.toString()).status());
                for (int i = 0; i < 5; i++) {
                    Resp r = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "w" + i)));
                    assertEquals(200, r.status(), r.raw());
                    assertEquals("true", r.header("X-Cpuslot-Local"), r.raw());
                }
                h.awaitLog("activation=w4 ");
                // their CPU reaches cpuslot_slot_cpu_seconds_total in batches; the time their
                // leases were held is counted for each (the idle ratio's denominator)
                String m = h.metrics();
                java.util.regex.Matcher x = java.util.regex.Pattern
                        .compile("cpuslot_slot_reserved_seconds_total\\{function=\"__ow_action\"\\} ([0-9.eE-]+)").matcher(m);
                assertTrue(x.find() && Double.parseDouble(x.group(1)) > 0, "reserved time of batched invocations: " + m);
            }
        }
    }

    @Test
    void usageInReplyMakesEveryAnswerCarryItsUsage() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.statFds = 2;
            agent.grantsLocal = true;
            SlotClient c = SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofMillis(500)).build();
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false", "CPUSLOT_USAGE_IN_REPLY", "true"), c)) {
                JsonObject init = json(initJava("testfns.Echo"));
                init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\"}"));
                assertEquals(200, h.post("/init", init.toString()).status());
                for (int i = 0; i < 3; i++) {
                    Resp r = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "v" + i)));
                    assertEquals(200, r.status(), r.raw());
                    assertNotNull(r.header("X-Cpuslot-Cpu-Ns"), r.http().headers().toString());
                }
            }
        }
    }

    @Test
    void millisecondsInTheActivationLineHaveThreeDecimalsAsBefore() {
        assertEquals("1.436", Log.ms(1_436_000));
        assertEquals("0.000", Log.ms(0));
        assertEquals("0.050", Log.ms(49_999));
        assertEquals("12.001", Log.ms(12_000_600));
        assertEquals("60000.000", Log.ms(60_000_000_000L));
        for (long ns : new long[]{1, 999, 1_000_500, 123_456_789, 7_000_000_001L})
            assertEquals(String.format(java.util.Locale.ROOT, "%.3f", Math.round(ns / 1e3) / 1e3), Log.ms(ns), "ns " + ns);
    }

    @Test
    void withLocalLeasingTheWorkerClaimsItsHeldSlotWithNoMessageAndTheAgentGetsTheUsage() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.statFds = 1;
            agent.grantsLocal = true;
            SlotClient c = SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofMillis(500)).build();
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), c)) {
                JsonObject init = json(initJava("testfns.Echo"));
                init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\"}"));
                assertEquals(200, h.post("/init", init.toString()).status());
                Resp first = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "a")));
                assertEquals("true", first.header("X-Cpuslot-Local"), first.raw());
                long slot = Long.parseLong(first.header("X-Cpuslot-Slot"));
                for (int i = 0; i < 10; i++) {
                    Resp r = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "a" + i)), USAGE);
                    assertEquals(200, r.status(), r.raw());
                    assertEquals("true", r.header("X-Cpuslot-Local"), r.raw());
                    assertEquals(slot, Long.parseLong(r.header("X-Cpuslot-Slot")));
                    assertNotNull(r.header("X-Cpuslot-Cpu-Ns"), "usage per invocation: " + r.raw());
                }
                assertEquals(1, agent.count(Protocol.Acquire.class), "one HOLD lease for the load and eleven invocations");
                assertEquals(0, agent.count(Protocol.Release.class));
                assertEquals("00", agent.slotContent(slot), "one placement write by the load's thread, one by the worker's");
                assertTrue(h.awaitLog("outcome=affinity_hit place=none local cpu_ms=").contains("outcome=affinity_hit place=none local cpu_ms="), h.log());
                // the load's own usage goes in a USAGE of its own; the calls' follow
                java.util.function.LongSupplier calls = () -> agent.received.stream().filter(m -> m instanceof Protocol.UsageReport)
                        .flatMap(m -> ((Protocol.UsageReport) m).records().stream()).filter(u -> u.action().equals("/guest/echo"))
                        .mapToLong(Protocol.UsageRecord::invocations).sum();
                long until = System.nanoTime() + 10_000_000_000L;
                while (calls.getAsLong() == 0 && System.nanoTime() < until) Thread.sleep(10);
                long invocations = calls.getAsLong();
                assertTrue(invocations >= 1 && invocations <= 11, "USAGE reached the agent: " + agent.received);
            }
        }
    }

    @Test
    void withLingeringTheWorkersNextInvocationReusesItsLeaseWithNoMessageAndStillReportsUsage() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start()) {
            agent.statFds = 1;
            SlotClient c = SlotClient.builder().socket(agent.socket.toString()).acquireBudget(Duration.ofMillis(500))
                    .linger(Duration.ofSeconds(30)).build();
            try (Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), c)) {
                JsonObject init = json(initJava("testfns.Echo"));
                init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"300m\"}"));
                assertEquals(200, h.post("/init", init.toString()).status());
                loadReleased(agent); // the load's lease ends with its thread: it never lingers
                Resp first = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo")));
                assertNull(first.header("X-Cpuslot-Reused"));
                for (int i = 0; i < 10; i++) {
                    Resp r = h.post("/run", run(json("{}"), Map.of("action_name", "/guest/echo", "activation_id", "a" + i)), USAGE);
                    assertEquals(200, r.status(), r.raw());
                    assertEquals("true", r.header("X-Cpuslot-Reused"), "invocation " + i);
                    assertEquals("affinity_hit", r.header("X-Cpuslot-Outcome"));
                    assertEquals(first.header("X-Cpuslot-Slot"), r.header("X-Cpuslot-Slot"));
                    assertNotNull(r.header("X-Cpuslot-Cpu-Ns"), "per-invocation usage still reported");
                }
                assertEquals(1, callAcquires(agent));
                assertEquals(1, agent.count(Protocol.Release.class), "the load's only");
                assertTrue(h.awaitLog("outcome=affinity_hit place=none reused cpu_ms=").contains("outcome=affinity_hit place=none reused cpu_ms="), h.log());
                assertTrue(h.metrics().contains("cpuslot_slot_client_events_total{event=\"linger.reused\"} 10"), h.metrics());
            }
            long until = System.nanoTime() + 3_000_000_000L;
            while (agent.count(Protocol.Release.class) < 2 && System.nanoTime() < until) Thread.sleep(5);
            assertEquals(2, agent.count(Protocol.Release.class), "closing the runtime released the lingering lease");
        }
    }

    @Test
    void anOpenWhiskActionWithoutApiKeyAndNoOtherQuotaIsWarnedAboutOnceAndCounted() throws Exception {
        try (Harness h = new Harness(Map.of("__OW_API_HOST", "http://127.0.0.1:9"), null)) {
            assertEquals(200, h.post("/init", initJava("testfns.Echo")).status());
            for (int i = 0; i < 3; i++)
                assertEquals(200, h.post("/run", run(json("{}"), Map.of("action_name", "/guest/nokey", "namespace", "guest"))).status());
            assertEquals(1, h.log().lines().filter(l -> l.contains("WARN action /guest/nokey gets no api_key")).count(), h.log());
            assertTrue(h.log().contains("provide-api-key true"), h.log());
            assertFalse(h.stderr().contains("api_key"), "not in the tenant's stderr: " + h.stderr());
            assertTrue(h.metrics().contains("cpuslot_quota_no_api_key_total{function=\"/guest/nokey\"} 3"), h.metrics());
        }
        // another quota source: nothing to warn about
        try (Harness h = new Harness(Map.of("CPUSLOT_DEFAULT_QUOTA", "250m"), null)) {
            assertEquals(200, h.post("/init", initJava("testfns.Echo")).status());
            assertEquals(200, h.post("/run", run(json("{}"), Map.of("action_name", "/guest/nokey"))).status());
            assertFalse(h.log().contains("api_key"), h.log());
            assertFalse(h.metrics().contains("cpuslot_quota_no_api_key_total{"), h.metrics());
        }
    }

    @Test
    void lingerSettingParsesDurations() {
        assertEquals(100, Config.from(Map.of()).lingerMs(), "on by default");
        assertEquals(0, Config.from(Map.of("CPUSLOT_LINGER", "0")).lingerMs());
        assertEquals(250, Config.from(Map.of("CPUSLOT_LINGER", "250ms")).lingerMs());
        assertEquals(1500, Config.from(Map.of("CPUSLOT_LINGER", "1.5s")).lingerMs());
        assertEquals(40, Config.from(Map.of("CPUSLOT_LINGER", "40")).lingerMs());
        assertThrows(IllegalArgumentException.class, () -> Config.from(Map.of("CPUSLOT_LINGER", "soon")));
    }

    @Test
    void aBadCompilerQuotaIsATypedErrorNamingTheSetting() {
        assertEquals("0", Config.from(Map.of()).compilerQuota(), "off by default: its quota counts against the admission budget");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new dev.cpuslot.runtime.core.FunctionRuntime(
                Config.from(Map.of("CPUSLOT_COMPILER_QUOTA", "lots")), new dev.cpuslot.runtime.base.Metrics(), null, System.out, System.err));
        assertTrue(e.getMessage().startsWith("CPUSLOT_COMPILER_QUOTA: "), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> new dev.cpuslot.runtime.core.FunctionRuntime(
                Config.from(Map.of("CPUSLOT_COMPILER_QUOTA", "-1")), new dev.cpuslot.runtime.base.Metrics(), null, System.out, System.err));
    }

    @Test
    void agentDownMeansInvocationsStillSucceedWithoutASlot() throws Exception {
        // A budget no loaded machine exhausts: the failed connect, not the clock, must end the
        // wait (with 50 ms, a connect still under way at a busy moment reads as "budget").
        SlotClient c = SlotClient.builder().socket(dir.resolve("none.sock").toString())
                .acquireBudget(Duration.ofSeconds(60)).build();
        try (Harness h = new Harness(Map.of("CPUSLOT_DEFAULT_QUOTA", "0.5"), c)) {
            h.post("/init", initJava("testfns.Echo"));
            Resp r = h.post("/run", run(json("{}")));
            assertEquals(200, r.status());
            assertEquals("500", r.header("X-Cpuslot-Quota-Milli"));
            assertEquals("unreachable", r.header("X-Cpuslot-Noslot"));
            assertTrue(h.metrics().contains("cpuslot_slot_outcomes_total{outcome=\"noslot_unreachable\"} 1"));
        }
    }

    @Test
    void failClosedRefusesTheLoadAndTheInvocation() throws Exception {
        SlotClient c = SlotClient.builder().socket(dir.resolve("none.sock").toString()).failClosed(true).build();
        try (Harness h = new Harness(Map.of("CPUSLOT_DEFAULT_QUOTA", "100m"), c)) {
            // the function's code (its static initialisers) runs in no slot either
            Resp init = h.post("/init", initJava("testfns.Echo"));
            assertEquals(502, init.status(), init.raw());
            assertTrue(init.raw().contains("no CPU slot for the function's load"), init.raw());
            // a function that has no code to load (a sequence) still gets to its call, which is refused
            Resp reg = h.post("/register?name=seq&steps=a,b", "");
            assertEquals(200, reg.status(), reg.raw());
            Resp r = h.post("/", "{\"name\":\"seq\",\"arguments\":\"{}\"}");
            assertEquals(502, r.status());
            assertTrue(r.obj().get("error").getAsString().contains("no CPU slot"), r.raw());
        }
    }

    /**
     * A load in its slot past its deadline: the /register is answered, the load stopped, and its
     * slot given back (TIMEOUT) once its thread is out of it; a load that fails gives it back
     * (FAILED).
     */
    @Test
    void aLoadPastItsDeadlineOrThatFailsGivesItsSlotBack() throws Exception {
        try (FakeAgent agent = new FakeAgent(dir).start();
             Harness h = new Harness(Map.of("CPUSLOT_ANNOTATION_LOOKUP", "false"), client(agent))) {
            Resp r = h.post("/register?name=loop&language=python&entryPoint=main&timeout=1000&quota=300m",
                    "while True:\n    pass\ndef main(args):\n    return {}\n");
            assertEquals(400, r.status(), r.raw());
            assertTrue(r.raw().contains("did not load within 1000 ms"), r.raw());
            Protocol.Acquire a = loadReleased(agent);
            assertEquals(300, a.quotaMilli());
            assertEquals("loop", a.action());
            Protocol.Release timedOut = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).findFirst().orElseThrow();
            assertEquals(Protocol.RELEASE_TIMEOUT, timedOut.outcome());
            Resp bad = h.post("/register?name=bad&language=python&entryPoint=main&quota=300m", "raise ValueError('no')\ndef main(args):\n    return {}\n");
            assertEquals(400, bad.status(), bad.raw());
            long until = System.nanoTime() + 30_000_000_000L;
            while (agent.count(Protocol.Release.class) < 2 && System.nanoTime() - until < 0) Thread.sleep(5);
            assertEquals(2, agent.count(Protocol.Release.class), "given back: " + agent.received);
            Protocol.Release failed = (Protocol.Release) agent.received.stream().filter(m -> m instanceof Protocol.Release).skip(1).findFirst().orElseThrow();
            assertEquals(Protocol.RELEASE_FAILED, failed.outcome());
        }
    }

    /** A stand-in for the OpenWhisk controller's REST API. */
    static HttpServer fakeOpenWhisk(List<String> requests, AtomicReference<String> annotation) throws Exception {
        HttpServer s = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 16);
        s.createContext("/api/v1/namespaces/", ex -> {
            requests.add(ex.getRequestURI().getRawPath() + " " + ex.getRequestHeaders().getFirst("Authorization"));
            String body = "{\"name\":\"fib\",\"annotations\":[{\"key\":\"exec\",\"value\":\"java\"}"
                    + (annotation.get() == null ? "" : ",{\"key\":\"cpu-quota\",\"value\":" + annotation.get() + "}") + "]}";
            byte[] b = body.getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(200, b.length);
            ex.getResponseBody().write(b);
            ex.close();
        });
        s.start();
        return s;
    }

    @Test
    void quotaResolutionOrderAnnotationCachingAndBadValues() throws Exception {
        List<String> reqs = new CopyOnWriteArrayList<>();
        AtomicReference<String> ann = new AtomicReference<>("\"250m\"");
        HttpServer ow = fakeOpenWhisk(reqs, ann);
        String host = "http://127.0.0.1:" + ow.getAddress().getPort();
        try (Harness h = new Harness(Map.of("__OW_API_HOST", host, "CPUSLOT_DEFAULT_QUOTA", "100m",
                "CPUSLOT_ALLOW_INVOCATION_QUOTA", "true", "CPUSLOT_MAX_QUOTA_MILLI", "1000"), null)) {
            JsonObject init = json(initJava("testfns.Echo"));
            init.getAsJsonObject("value").add("env", json("{\"CPUSLOT_QUOTA\":\"200m\"}"));
            h.post("/init", init.toString());
            Map<String, String> act = Map.of("api_key", "user:secret", "action_name", "/guest/pkg/fib", "action_version", "0.0.1");
            // the first activation does not wait for the lookup: it runs with the init env's quota
            Resp first = h.post("/run", run(json("{}"), act));
            assertEquals(200, first.status());
            Resp r = untilSource(h, act, "annotation");
            assertEquals("250", r.header("X-Cpuslot-Quota-Milli"));
            assertEquals("annotation", r.header("X-Cpuslot-Quota-Source"));
            h.post("/run", run(json("{}"), act));
            assertEquals(1, reqs.size(), "annotation read once per action version: " + reqs);
            assertEquals("/api/v1/namespaces/guest/actions/pkg/fib Basic "
                    + Base64.getEncoder().encodeToString("user:secret".getBytes(StandardCharsets.UTF_8)), reqs.get(0));
            // the invocation parameter wins (operator allowed it), is capped, and is not passed on
            Resp p = h.post("/run", run(json("{\"__cpuslot_quota\":\"4\",\"k\":1}"), act));
            assertEquals("1000", p.header("X-Cpuslot-Quota-Milli"));
            assertEquals("invocation", p.header("X-Cpuslot-Quota-Source"));
            assertEquals(json("{\"k\":1}"), p.json());
            // a new action version is looked up again; a garbage annotation is refused in OpenWhisk's format
            ann.set("\"lots\"");
            Map<String, String> v2 = Map.of("api_key", "user:secret", "action_name", "/guest/pkg/fib", "action_version", "0.0.2");
            // the read may already be done when the new version's first activation resolves its
            // quota (the lending setting asks for the same read first): every refusal counts
            int refusedFirst = h.post("/run", run(json("{}"), v2)).status() == 400 ? 1 : 0;
            Resp bad = untilStatus(h, v2, 400);
            assertEquals(400, bad.status());
            assertTrue(bad.obj().get("error").getAsString().contains("annotation"), bad.raw());
            assertTrue(h.metrics().contains("cpuslot_quota_invalid_total{source=\"annotation\"} " + (1 + refusedFirst)), h.metrics());
            // no annotation: init env, then the pod default
            ann.set(null);
            Map<String, String> v3 = Map.of("api_key", "user:secret", "action_name", "/guest/pkg/fib", "action_version", "0.0.3");
            assertEquals("init", h.post("/run", run(json("{}"), v3)).header("X-Cpuslot-Quota-Source"));
            untilLookups(reqs, 3);
            assertEquals("init", h.post("/run", run(json("{}"), v3)).header("X-Cpuslot-Quota-Source"));
            assertEquals(200, h.post("/run", run(json("{}"), v3)).status(), "still serving");
        } finally {
            ow.stop(0);
        }
    }

    @Test
    void anInitAsTheInvokerSendsItStartsTheAnnotationRead() throws Exception {
        // OpenWhisk's invoker (ContainerProxy) puts the cold start's __OW_* fields in the /init env
        List<String> reqs = new CopyOnWriteArrayList<>();
        HttpServer ow = fakeOpenWhisk(reqs, new AtomicReference<>("\"250m\""));
        try (Harness h = new Harness(Map.of("__OW_API_HOST", "http://127.0.0.1:" + ow.getAddress().getPort()), null)) {
            JsonObject init = json(initJava("testfns.Echo"));
            init.getAsJsonObject("value").add("env", json("{\"__OW_API_KEY\":\"user:secret\",\"__OW_NAMESPACE\":\"guest\","
                    + "\"__OW_ACTION_NAME\":\"/guest/pkg/fib\",\"__OW_ACTION_VERSION\":\"0.0.1\",\"__OW_ACTIVATION_ID\":\"cold\","
                    + "\"__OW_TRANSACTION_ID\":\"t-cold\",\"__OW_DEADLINE\":\"1\"}"));
            assertEquals(200, h.post("/init", init.toString()).status());
            untilLookups(reqs, 1); // before any /run
            Map<String, String> act = Map.of("api_key", "user:secret", "action_name", "/guest/pkg/fib", "action_version", "0.0.1");
            assertEquals("250", untilSource(h, act, "annotation").header("X-Cpuslot-Quota-Milli"));
            assertEquals(1, reqs.size(), "the init's read serves the activations: " + reqs);
        } finally {
            ow.stop(0);
        }
    }

    /** Runs until the background annotation lookup has answered (bounded: a hang says why). */
    private static Resp untilSource(Harness h, Map<String, String> act, String source) throws Exception {
        for (int i = 0; i < 500; i++) {
            Resp r = h.post("/run", run(json("{}"), act));
            if (source.equals(r.header("X-Cpuslot-Quota-Source"))) return r;
            Thread.sleep(20);
        }
        throw new AssertionError("quota source never became " + source);
    }

    private static Resp untilStatus(Harness h, Map<String, String> act, int status) throws Exception {
        for (int i = 0; i < 500; i++) {
            Resp r = h.post("/run", run(json("{}"), act));
            if (r.status() == status) return r;
            Thread.sleep(20);
        }
        throw new AssertionError("status never became " + status);
    }

    private static void untilLookups(List<String> reqs, int n) throws Exception {
        for (int i = 0; i < 500 && reqs.size() < n; i++) Thread.sleep(20);
        assertEquals(n, reqs.size(), "lookups: " + reqs);
    }

    @Test
    void annotationLookupNeverBlocksAnActivation() throws Exception {
        // an API host that accepts the connection and never answers
        try (java.net.ServerSocket silent = new java.net.ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
             Harness h = new Harness(Map.of("__OW_API_HOST", "http://127.0.0.1:" + silent.getLocalPort(),
                     "CPUSLOT_DEFAULT_QUOTA", "100m", "CPUSLOT_ANNOTATION_TIMEOUT_MS", "600000"), null)) {
            h.post("/init", initJava("testfns.Echo"));
            Map<String, String> act = Map.of("api_key", "user:secret", "action_name", "/guest/slow", "action_version", "0.0.1");
            for (int i = 0; i < 3; i++) {
                Resp r = h.post("/run", run(json("{}"), act));
                assertEquals(200, r.status());
                assertEquals("default", r.header("X-Cpuslot-Quota-Source"));
            }
            assertTrue(h.metrics().contains("cpuslot_annotation_pending_total 3"), h.metrics());
        }
    }

    @Test
    void knativeHeaderOnlyWhenAllowed() throws Exception {
        try (Harness h = new Harness(Map.of("CPUSLOT_DEFAULT_QUOTA", "100m"), null)) {
            h.post("/init", initJava("testfns.Echo"));
            Resp r = h.post("/", "{\"value\":{}}", Map.of("X-Cpuslot-Quota", "900m"));
            assertEquals("100", r.header("X-Cpuslot-Quota-Milli"), "header ignored unless allowed");
        }
        try (Harness h = new Harness(Map.of("CPUSLOT_DEFAULT_QUOTA", "100m", "CPUSLOT_ALLOW_HEADER_QUOTA", "true"), null)) {
            h.post("/init", initJava("testfns.Echo"));
            assertEquals("900", h.post("/", "{\"value\":{}}", Map.of("X-Cpuslot-Quota", "900m")).header("X-Cpuslot-Quota-Milli"));
            assertEquals(400, h.post("/", "{\"value\":{}}", Map.of("X-Cpuslot-Quota", "-1")).status());
        }
    }

    @Test
    void quantityParsing() {
        assertEquals(250, Quota.parseMilli("250m"));
        assertEquals(500, Quota.parseMilli("0.5"));
        assertEquals(2000, Quota.parseMilli("2"));
        assertEquals(1, Quota.parseMilli("0.0001"));
        for (String bad : List.of("", "abc", "-1", "0", "12x", "1e20"))
            assertThrows(IllegalArgumentException.class, () -> Quota.parseMilli(bad), bad);
    }
}
