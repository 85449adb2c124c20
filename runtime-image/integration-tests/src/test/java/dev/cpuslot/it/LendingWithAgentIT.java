package dev.cpuslot.it;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.TestMethodOrder;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Lending (docs/lending.md) end to end: the runtime JVM against the real node agent run with
 * admission.lendRatio 0.5, on this host's cgroups. A caller blocked in a synchronous local chain
 * call sleeps: its lease lends half its quota, a new invocation is admitted into it, and when
 * the call returns the caller's lease counts in full again (WAKE).
 *
 * <p>Layout: /cpuslot-it-PID-lend/rt-lend is the runtime's cgroup, limit 1000m (its admission
 * budget); everything is removed at the end.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class LendingWithAgentIT {
    Path work, agentBin, samplesJar, runtimeJar, sockDir;
    Cgroups cg;
    String parent;
    Agent agent;
    Quiet quiet;

    @BeforeAll
    void setUp() throws Exception {
        cg = Cgroups.orSkip("needs root to create cgroups");
        Path repo = Path.of(System.getProperty("cpuslot.repo")).toAbsolutePath().normalize();
        work = Path.of(System.getProperty("cpuslot.work")).toAbsolutePath().resolve("lend");
        Files.createDirectories(work);
        runtimeJar = Path.of(System.getProperty("cpuslot.runtime.jar")).toAbsolutePath().normalize();
        samplesJar = Path.of(System.getProperty("cpuslot.samples.jar")).toAbsolutePath().normalize();
        assertTrue(Files.exists(runtimeJar), "build the runtime first (mvn package): " + runtimeJar);
        agentBin = Agent.build(repo, work.resolve("node-agent"));
        for (String stale : cg.stale()) System.out.println("[it] removing stale " + stale + ": " + Agent.cleanup(agentBin, stale));
        quiet = Quiet.hold();
        parent = "/cpuslot-it-" + ProcessHandle.current().pid() + "-lend";
        Runtime.getRuntime().addShutdownHook(new Thread(this::cleanUpQuietly));
        cg.create(parent);
        cg.favour(parent);
        sockDir = Files.createTempDirectory("cpuslot-lend");
        agent = new Agent(agentBin, sockDir.resolve("agent.sock"), parent, "200m=1,500m=2", RuntimeProc.freePort(),
                work.resolve("agent.log"));
        agent.extraArgs.addAll(List.of("--lend-ratio", "0.5"));
        agent.start();
    }

    @AfterAll
    void tearDown() throws Exception {
        if (cg != null) cleanUp();
    }

    private synchronized void cleanUp() throws Exception {
        try {
            if (agent != null) agent.stop();
            agent = null;
            if (sockDir != null) {
                Files.deleteIfExists(sockDir.resolve("agent.sock"));
                Files.deleteIfExists(sockDir);
            }
            if (parent != null && Files.isDirectory(cg.dir(cg.roots.get(0), parent))) Agent.cleanup(agentBin, parent);
        } finally {
            if (quiet != null) quiet.close();
            quiet = null;
        }
    }

    private void cleanUpQuietly() {
        try {
            cleanUp();
        } catch (Throwable ignored) {
        }
    }

    private JsonObject pool(String cgroup) throws Exception {
        JsonObject all = JsonParser.parseString(agent.get("/debug/pools").body()).getAsJsonObject();
        for (var p : all.getAsJsonArray("pools"))
            if (p.getAsJsonObject().get("name").getAsString().equals(cgroup)) return p.getAsJsonObject();
        throw new AssertionError("no pool " + cgroup + " in " + all);
    }

    /**
     * Budget 1000m. The caller (JavaScript, 500m) calls a 200m CPU-bound callee synchronously
     * and waits: 500m x 0.5 = 250m is lent, so 250m + 200m are charged and a new 500m invocation
     * fits at once (without lending 500m + 200m + 500m = 1200m would not: it would queue or be
     * degraded). When the call returns the caller WAKEs: it counts 500m again and its slot never
     * lost its quota; the agent lowers the youngest awake lease to stay within the budget.
     */
    @Test
    @Order(1)
    void aCallerBlockedInAChainCallLendsItsQuotaAndHasItBackWhenTheCallReturns() throws Exception {
        String cgroup = parent + "/rt-lend";
        String mine = "\"" + cgroup + "\""; // this container's series (label value)
        cg.create(cgroup);
        cg.limit(cgroup, 1000);
        Path js = work.resolve("lend-caller.js");
        Files.writeString(js, """
                function main(a) {
                  var t0 = Date.now();
                  var hop = cpuslot.call('callee', { ms: a.ms });
                  return { hop: hop, wall_ms: Date.now() - t0 };
                }
                """);
        try (RuntimeProc lr = new RuntimeProc(runtimeJar, Map.of("CPUSLOT_SOCKET", agent.socket.toString(),
                "CPUSLOT_ACQUIRE_BUDGET_MS", "2000"), cg.procsFiles(cgroup), work.resolve("runtime-lend.log"))) {
            lr.register("callee", "dev.cpuslot.samples.CpuBurn", samplesJar, "200m");
            lr.register("burn500", "dev.cpuslot.samples.CpuBurn", samplesJar, "500m");
            lr.registerText("caller", "javascript", js, "500m");
            RuntimeProc.Reply warm = lr.invoke("caller", "{\"ms\":50}"); // the caller's context; 500m + 200m held
            assertEquals(200, warm.status(), warm.body());
            assertEquals("true", warm.header("X-Cpuslot-Local"), "local leasing: " + warm.headers());
            JsonObject p0 = pool(cgroup);
            assertEquals(0, p0.get("lentMilli").getAsLong(), "awake: nothing lent: " + p0);
            assertEquals(700, p0.get("usedMilli").getAsLong(), "the caller's and the callee's held slots: " + p0);
            Map<String, Double> a0 = agent.metrics();

            CompletableFuture<RuntimeProc.Reply> call = CompletableFuture.supplyAsync(() -> {
                try {
                    return lr.invoke("caller", "{\"ms\":8000}");
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            }, r -> Thread.ofPlatform().start(r));
            long until = System.nanoTime() + 60_000_000_000L;
            JsonObject p = pool(cgroup);
            while (p.get("lentMilli").getAsLong() == 0 && !call.isDone() && System.nanoTime() < until) {
                Thread.sleep(20);
                p = pool(cgroup);
            }
            assertEquals(250, p.get("lentMilli").getAsLong(), "the waiting caller lends half its 500m (call done: "
                    + call.isDone() + "): " + p + "\n" + lr.metricsText());
            assertEquals(450, p.get("usedMilli").getAsLong(), "charged: 250m of the sleeper + the callee's 200m: " + p);
            Map<String, Double> a1 = agent.metrics();
            assertEquals(250, Prom.sum(a1, "cpuslot_lent_millicores", mine), "metric: " + a1);

            RuntimeProc.Reply b = lr.invoke("burn500", "{\"ms\":100}");
            assertFalse(call.isDone(), "the caller still waits (its callee burns 8 s)");
            assertEquals(200, b.status(), b.body());
            assertNotNull(b.header("X-Cpuslot-Slot"), "the new invocation got a slot: " + b.headers());
            Map<String, Double> a2 = agent.metrics();
            for (String res : List.of("queued", "degraded", "rejected"))
                assertEquals(Prom.sum(a0, "cpuslot_admission_total", "result=\"" + res + "\""),
                        Prom.sum(a2, "cpuslot_admission_total", "result=\"" + res + "\""),
                        "admitted at once at its full quota, not " + res);
            JsonObject p2 = pool(cgroup);
            assertEquals(950, p2.get("usedMilli").getAsLong(), "450m + the new 500m, within the 1000m budget: " + p2);

            RuntimeProc.Reply r = call.get(5, TimeUnit.MINUTES);
            assertEquals(200, r.status(), r.body());
            JsonObject p3 = pool(cgroup);
            assertEquals(0, p3.get("lentMilli").getAsLong(), "awake again: nothing lent: " + p3);
            assertTrue(p3.get("usedMilli").getAsLong() <= 1000, "the wake brought the container back within its budget: " + p3);
            assertEquals(1, p3.get("degraded").getAsLong(), "the borrower, the youngest awake lease, gave the 200m back: " + p3);
            Map<String, Double> a3 = agent.metrics();
            assertEquals(1, Prom.sum(a3, "cpuslot_wakes_total", mine) - Prom.sum(a0, "cpuslot_wakes_total", mine));
            assertEquals(0, Prom.sum(a3, "cpuslot_lent_millicores", mine));
            // the caller's slot kept its quota through the sleep: 500m, never lowered
            List<Long> workers = lr.threads("fn-caller-");
            assertFalse(workers.isEmpty());
            for (long w : workers) {
                String slot = cg.cgroupOf(lr.pid(), w);
                if (cg.version == 1) assertEquals("50000", cg.read(slot, "cpu.cfs_quota_us"), slot);
                else assertEquals("50000 100000", cg.read(slot, "cpu.max"), slot);
            }
            // the runtime's idle ratio per function (docs/lending.md, Metrics): the caller slept
            // through the callee's 8 s and left its 500m idle; the callee burnt its 200m. Its CPU
            // is recorded after the reply, before its activation line: wait for the caller's second line.
            String caller = "function=\"caller\"", callee = "function=\"callee\"";
            Path log = work.resolve("runtime-lend.log");
            long logUntil = System.nanoTime() + 60_000_000_000L;
            while (Files.readString(log).split(" action=caller ", -1).length < 3 && System.nanoTime() < logUntil) Thread.sleep(20);
            Map<String, Double> m = lr.metrics();
            double slept = Prom.sum(m, "cpuslot_slot_slept_seconds_total", caller);
            double callerReserved = Prom.sum(m, "cpuslot_slot_reserved_seconds_total", caller);
            assertTrue(slept >= 8 && slept <= callerReserved / 0.5, "slept " + slept + " s, reserved " + callerReserved + ": " + lr.metricsText());
            double callerIdle = 1 - Prom.sum(m, "cpuslot_slot_cpu_seconds_total", caller) / callerReserved;
            double calleeIdle = 1 - Prom.sum(m, "cpuslot_slot_cpu_seconds_total", callee) / Prom.sum(m, "cpuslot_slot_reserved_seconds_total", callee);
            assertTrue(callerIdle > 0.9 && calleeIdle < callerIdle, "idle ratio caller " + callerIdle + ", callee " + calleeIdle + ": " + lr.metricsText());
            System.out.println("[it] lending: lent " + p.get("lentMilli") + "m while the caller waited; pool after the wake " + p3
                    + "; client " + RuntimeProc.event(m, "lend.sleep") + " SLEEP, " + RuntimeProc.event(m, "lend.wake") + " WAKE"
                    + "; idle ratio caller " + String.format("%.3f", callerIdle) + ", callee " + String.format("%.3f", calleeIdle)
                    + ", caller slept " + String.format("%.2f", slept) + " s");
        }
    }
    /**
     * What sleeping costs a chain call (reported, not asserted): ChainBench calls hello (200m)
     * through the local bus, each call a SLEEP and a WAKE of the caller's lease (two one-way
     * writes); compare RuntimeWithAgentIT#chainHopLatencyLocalAgainstHttpWithSlots, the same
     * calls to an agent without LEND.
     */
    @Test
    @Order(2)
    void chainHopLatencyWhenEveryCallSleeps() throws Exception {
        String cgroup = parent + "/rt-lendbench";
        cg.create(cgroup);
        int rounds = Integer.getInteger("chain.bench.rounds", 6), calls = Integer.getInteger("chain.bench.calls", 200);
        try (RuntimeProc lr = new RuntimeProc(runtimeJar, Map.of("CPUSLOT_SOCKET", agent.socket.toString(),
                "CPUSLOT_ACQUIRE_BUDGET_MS", "2000"), cg.procsFiles(cgroup), work.resolve("runtime-lendbench.log"))) {
            lr.register("hello", "dev.cpuslot.samples.HelloWorld", samplesJar, "200m");
            lr.register("bench", "dev.cpuslot.samples.ChainBench", samplesJar, "500m");
            List<Long> ns = new java.util.ArrayList<>();
            for (int r = -1; r < rounds; r++) { // round -1 warms up
                RuntimeProc.Reply rep = lr.invoke("bench", "{\"mode\":\"local\",\"callee\":\"hello\",\"n\":" + calls
                        + ",\"port\":" + lr.port + "}");
                assertEquals(200, rep.status(), rep.body());
                if (r < 0) continue;
                for (var e : rep.json().getAsJsonObject("result").getAsJsonArray("ns")) ns.add(e.getAsLong());
            }
            Map<String, Double> m = lr.metrics();
            assertEquals((rounds + 1) * calls, RuntimeProc.event(m, "lend.sleep"), "one SLEEP per call: " + lr.metricsText());
            assertEquals((rounds + 1) * calls, RuntimeProc.event(m, "lend.wake"), "one WAKE per call");
            java.util.Collections.sort(ns);
            System.out.printf(java.util.Locale.ROOT, "[it] lending: local chain hop with SLEEP+WAKE (hello at 200m): %d calls, p50 %.1f us, p99 %.1f us%n",
                    ns.size(), RuntimeWithAgentIT.pct(ns, 50) / 1e3, RuntimeWithAgentIT.pct(ns, 99) / 1e3);
        }
    }
}
