package dev.cpuslot.it;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/**
 * A new pod's runtime starts before the node agent serves it (Kubernetes: the agent sees the
 * container running, finds its cgroup, makes its slots, then creates the socket). The runtime
 * must not take traffic before that, for at most CPUSLOT_READY_WAIT: the first invocation then
 * runs in a slot with the default 50 ms acquire budget. Each case starts the runtime first and
 * the real agent a few seconds later, as a node does.
 *
 * <p>Layout: /cpuslot-it-PID-ready/CASE is each runtime's cgroup; removed at the end.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ReadinessWithAgentIT {
    /** How long the agent comes after the runtime: a pause, not a bound on anything measured. */
    static final long AGENT_LATE_MS = 3000;

    Path work, agentBin, samplesJar, runtimeJar;
    Cgroups cg;
    String parent;
    final List<Agent> agents = new ArrayList<>();
    final List<Path> sockDirs = new ArrayList<>();

    @BeforeAll
    void setUp() throws Exception {
        cg = Cgroups.orSkip("needs root to create cgroups");
        Path repo = Path.of(System.getProperty("cpuslot.repo")).toAbsolutePath().normalize();
        work = Path.of(System.getProperty("cpuslot.work")).toAbsolutePath().resolve("ready");
        Files.createDirectories(work);
        runtimeJar = Path.of(System.getProperty("cpuslot.runtime.jar")).toAbsolutePath().normalize();
        samplesJar = Path.of(System.getProperty("cpuslot.samples.jar")).toAbsolutePath().normalize();
        assertTrue(Files.exists(runtimeJar), "build the runtime first (mvn package): " + runtimeJar);
        agentBin = Agent.build(repo, work.resolve("node-agent"));
        parent = "/cpuslot-it-" + ProcessHandle.current().pid() + "-ready";
        Runtime.getRuntime().addShutdownHook(new Thread(this::cleanUpQuietly));
    }

    @AfterAll
    void tearDown() throws Exception {
        if (cg != null) cleanUp();
    }

    private synchronized void cleanUp() throws Exception {
        for (Agent a : agents) a.stop();
        agents.clear();
        for (Path d : sockDirs) {
            Files.deleteIfExists(d.resolve("agent.sock"));
            Files.deleteIfExists(d);
        }
        sockDirs.clear();
        if (parent != null && Files.isDirectory(cg.dir(cg.roots.get(0), parent))) Agent.cleanup(agentBin, parent);
    }

    private void cleanUpQuietly() {
        try {
            cleanUp();
        } catch (Throwable ignored) {
        }
    }

    /** An agent serving below this case's cgroup, on a socket of its own; not started. */
    Agent agent(String name) throws Exception {
        Path dir = Files.createTempDirectory("cpuslot-ready");
        sockDirs.add(dir);
        Agent a = new Agent(agentBin, dir.resolve("agent.sock"), parent, "200m=2", RuntimeProc.freePort(), work.resolve("agent-" + name + ".log"));
        agents.add(a);
        return a;
    }

    /** A runtime in cgroup parent/name with the recipe's settings (default budget, local leasing). */
    RuntimeProc runtime(String name, Map<String, String> env) throws Exception {
        cg.create(parent + "/" + name);
        return new RuntimeProc(runtimeJar, env, cg.procsFiles(parent + "/" + name), work.resolve("runtime-" + name + ".log"));
    }

    String initValue() throws Exception {
        String code = java.util.Base64.getEncoder().encodeToString(Files.readAllBytes(samplesJar));
        return "{\"name\":\"hello\",\"main\":\"dev.cpuslot.samples.HelloWorld\",\"binary\":true,\"code\":\"" + code
                + "\",\"env\":{\"CPUSLOT_QUOTA\":\"200m\"}}";
    }

    static HttpResponse<String> ready(RuntimeProc rt) throws Exception {
        return RuntimeProc.HTTP.send(HttpRequest.newBuilder(URI.create(rt.base() + "/ready")).timeout(Duration.ofSeconds(30)).build(),
                HttpResponse.BodyHandlers.ofString());
    }

    static CompletableFuture<RuntimeProc.Reply> postAsync(RuntimeProc rt, String path, String body) {
        return CompletableFuture.supplyAsync(() -> {
            try {
                return rt.post(path, body);
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        }, r -> Thread.ofPlatform().start(r));
    }

    /** Waits at most ms (a pause) for f; says whether it was done by then. */
    static boolean doneWithin(CompletableFuture<?> f, long ms) throws InterruptedException {
        long until = System.nanoTime() + ms * 1_000_000;
        while (!f.isDone() && System.nanoTime() < until) Thread.sleep(20);
        return f.isDone();
    }

    /**
     * OpenWhisk: the invoker sends /init as soon as the container's port answers, then /run.
     * /init must wait until the agent serves the container, so that the first /run holds a slot.
     */
    @Test
    void openWhiskInitWaitsForTheAgentAndTheFirstRunHoldsASlot() throws Exception {
        Agent agent = agent("ow");
        try (RuntimeProc rt = runtime("ow", Map.of("CPUSLOT_SOCKET", agent.socket.toString()))) {
            CompletableFuture<RuntimeProc.Reply> init = postAsync(rt, "/init", "{\"value\":" + initValue() + "}");
            boolean answeredAlone = doneWithin(init, AGENT_LATE_MS);
            agent.start();
            RuntimeProc.Reply ir = init.get(2, TimeUnit.MINUTES);
            assertEquals(200, ir.status(), ir.body());
            // the first /run finds a connection the agent answered HELLO on: its acquire pays no
            // connect and no HELLO inside the 50 ms budget (what made CI's first activation miss it)
            Map<String, Double> m = rt.metrics();
            assertTrue(RuntimeProc.event(m, "connect.ok") >= 1, "/init answered before the agent served the container: " + m);
            RuntimeProc.Reply r = rt.post("/run", "{\"value\":{\"name\":\"first\"},\"activation_id\":\"first-1\"}");
            assertEquals(200, r.status(), r.body());
            assertNotNull(r.header("X-Cpuslot-Slot"), "the first /run on a new container ran without a slot: " + r.headers()
                    + "\n" + Files.readString(rt.log));
            assertNull(r.header("X-Cpuslot-Noslot"), r.headers().toString());
            System.out.printf(java.util.Locale.ROOT, "[it] agent %d ms after the runtime: first /run %s, its acquire %.2f ms%n", AGENT_LATE_MS,
                    r.header("X-Cpuslot-Outcome"), 1e3 * Prom.get(rt.metrics(), "cpuslot_slot_acquire_seconds_sum"));
            assertFalse(answeredAlone, "/init answered before the agent was there: " + ir.body());
        }
    }

    /**
     * Knative: queue-proxy runs the user container's readinessProbe; /ready answers 503 with why
     * until the agent serves the pod, then 200, and the first request (init bundled) holds a slot.
     */
    @Test
    void knativeReadinessIs503UntilTheAgentServesThenTheFirstRequestHoldsASlot() throws Exception {
        Agent agent = agent("kn");
        try (RuntimeProc rt = runtime("kn", Map.of("CPUSLOT_SOCKET", agent.socket.toString()))) {
            HttpResponse<String> before = ready(rt);
            assertEquals(503, before.statusCode(), "before the agent: " + before.body());
            assertTrue(before.body().contains("agent"), "a reason: " + before.body());
            agent.start();
            HttpResponse<String> after = before;
            long until = System.nanoTime() + 60_000_000_000L; // a hang, not a bound: says why below
            while (after.statusCode() != 200 && System.nanoTime() < until) {
                Thread.sleep(25);
                after = ready(rt);
            }
            assertEquals(200, after.statusCode(), "still not ready 60 s after the agent started: " + after.body()
                    + "\n" + Files.readString(rt.log));
            RuntimeProc.Reply r = rt.post("/", "{\"init\":" + initValue() + ",\"activation\":{\"activation_id\":\"kn-1\"},"
                    + "\"value\":{\"name\":\"kn\"}}");
            assertEquals(200, r.status(), r.body());
            assertNotNull(r.header("X-Cpuslot-Slot"), "the first request on a ready pod ran without a slot: " + r.headers()
                    + "\n" + Files.readString(rt.log));
        }
    }

    /**
     * No agent ever: the runtime is ready once CPUSLOT_READY_WAIT has passed (never blocked for
     * good), /init answers, and invocations run without a slot (fail-open) with the reason logged.
     */
    @Test
    void withoutAnAgentTheRuntimeIsReadyAfterTheBoundAndFailsOpen() throws Exception {
        Path nobody = work.resolve("nobody-here.sock");
        Files.deleteIfExists(nobody);
        try (RuntimeProc rt = runtime("none", Map.of("CPUSLOT_SOCKET", nobody.toString(), "CPUSLOT_READY_WAIT", "3s"))) {
            HttpResponse<String> r = ready(rt);
            long until = System.nanoTime() + 60_000_000_000L; // a hang, not a bound: says why below
            while (r.statusCode() != 200 && System.nanoTime() < until) {
                Thread.sleep(50);
                r = ready(rt);
            }
            assertEquals(200, r.statusCode(), "not ready 60 s after start with CPUSLOT_READY_WAIT=3s: " + r.body());
            RuntimeProc.Reply ir = rt.post("/init", "{\"value\":" + initValue() + "}");
            assertEquals(200, ir.status(), ir.body());
            RuntimeProc.Reply run = rt.post("/run", "{\"value\":{\"name\":\"alone\"}}");
            assertEquals(200, run.status(), run.body());
            assertEquals("unreachable", run.header("X-Cpuslot-Noslot"), run.headers().toString());
            String log = Files.readString(rt.log);
            assertTrue(log.contains("not served by the cpuslot agent"), "the log says why: " + log);
        }
    }
}
