package dev.cpuslot.runtime;

import dev.cpuslot.slot.FakeAgent;
import dev.cpuslot.slot.SlotClient;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.URI;
import java.net.http.HttpRequest;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Readiness against a fake agent (no root; ReadinessWithAgentIT has the real one): not ready
 * until the agent answers HELLO, ready at once without a configured socket, and ready after
 * CPUSLOT_READY_WAIT when no agent comes.
 */
class ReadinessTest {
    @TempDir
    Path dir;

    static Harness.Resp ready(Harness h) throws Exception {
        return h.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + h.front.port() + "/ready"))
                .timeout(Duration.ofSeconds(30)).GET().build());
    }

    /** Polls /ready until 200; gives up after 60 s (a hang, not a bound) with the last answer. */
    static Harness.Resp awaitReady(Harness h) throws Exception {
        Harness.Resp r = ready(h);
        long until = System.nanoTime() + 60_000_000_000L;
        while (r.status() != 200 && System.nanoTime() < until) {
            Thread.sleep(20);
            r = ready(h);
        }
        return r;
    }

    SlotClient client(Path socket) {
        return SlotClient.builder().socket(socket.toString()).build();
    }

    @Test
    void notReadyUntilTheAgentAnswersThenReady() throws Exception {
        FakeAgent agent = new FakeAgent(dir); // not listening yet
        try (agent; Harness h = new Harness(Map.of("CPUSLOT_SOCKET", agent.socket.toString(), "CPUSLOT_READY_WAIT", "600s"),
                client(agent.socket))) {
            Harness.Resp r = ready(h);
            assertEquals(503, r.status(), r.raw());
            String why = r.obj().get("error").getAsString(); // the first connect may still be under way: "no answer yet"
            assertTrue(why.startsWith("not served by the cpuslot agent yet (") && why.contains(agent.socket.toString()), r.raw());
            agent.start();
            r = awaitReady(h);
            assertEquals(200, r.status(), "not ready 60 s after the agent came: " + r.raw() + "\n" + h.log());
            assertTrue(h.rt.slots().served());
            // the ready thread logs once its HELLO is answered, which /ready already shows
            String log = h.awaitLog("served by the cpuslot agent");
            assertTrue(log.contains("served by the cpuslot agent"), "no line says so 30 s after ready:\n" + log);
        }
    }

    @Test
    void readyAtOnceWithoutAConfiguredSocket() throws Exception {
        try (Harness h = new Harness(Map.of(), client(dir.resolve("agent.sock")))) {
            assertEquals(200, ready(h).status());
        }
    }

    @Test
    void withoutAnAgentReadyAfterTheWaitAndTheLogSaysWhy() throws Exception {
        Path nobody = dir.resolve("nobody.sock");
        try (Harness h = new Harness(Map.of("CPUSLOT_SOCKET", nobody.toString(), "CPUSLOT_READY_WAIT", "300ms"), client(nobody))) {
            Harness.Resp r = awaitReady(h);
            assertEquals(200, r.status(), "not ready 60 s after start with CPUSLOT_READY_WAIT=300ms: " + r.raw());
            String log = h.log();
            long until = System.nanoTime() + 30_000_000_000L;
            while (!log.contains("CPUSLOT_READY_WAIT") && System.nanoTime() < until) {
                Thread.sleep(20);
                log = h.log();
            }
            assertTrue(log.contains("not served by the cpuslot agent within CPUSLOT_READY_WAIT (300 ms; connect " + nobody), log);
        }
    }
}
