package dev.cpuslot.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonPrimitive;
import dev.cpuslot.slot.FakeAgent;
import dev.cpuslot.slot.Protocol;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * A cold start as OpenWhisk's invoker drives it (ContainerProxy): {@code /init} carries the
 * {@code __OW_*} fields of the activation that caused it, and that activation's {@code /run}
 * follows the init's answer at once. The action's quota is its {@code cpu-quota} annotation, which
 * the runtime reads from the OpenWhisk API with those fields; the API here answers slowly. The
 * agent is an in-process stand-in speaking the slot protocol on the container's socket.
 */
@DisplayName("a cold start's first /run at its annotation's quota")
class ColdStartQuotaTest {
    @TempDir
    Path dir;

    static final String ACTION = "/guest/coldfn";

    /** The env of an /init as the invoker sends it: the init parameters and the cold start's activation fields, strings. */
    static Map<String, JsonElement> invokerInitEnv(Map<String, String> params) {
        Map<String, JsonElement> env = new HashMap<>();
        Map<String, String> ow = Map.of("__OW_API_KEY", ChainPlatformTest.KEY, "__OW_NAMESPACE", "guest",
                "__OW_ACTION_NAME", ACTION, "__OW_ACTION_VERSION", "0.0.1", "__OW_ACTIVATION_ID", "c01d",
                "__OW_TRANSACTION_ID", "t-c01d", "__OW_DEADLINE", Long.toString(System.currentTimeMillis() + 600_000));
        ow.forEach((k, v) -> env.put(k, new JsonPrimitive(v)));
        params.forEach((k, v) -> env.put(k, new JsonPrimitive(v)));
        return env;
    }

    /** The cold start's own /run: its activation fields beside the value. */
    static com.google.gson.JsonObject coldRun() {
        return runPayload(json("{\"x\":1}"), Map.of("api_key", ChainPlatformTest.KEY, "namespace", "guest",
                "action_name", ACTION, "action_version", "0.0.1", "activation_id", "c01d", "transaction_id", "t-c01d",
                "deadline", Long.toString(System.currentTimeMillis() + 600_000)));
    }

    /** The container's env: the API, the agent's socket, and budgets no loaded machine reaches (beside what a case sets). */
    static Map<String, String> containerEnv(OpenWhiskApiStandIn ow, FakeAgent agent, String annotationBudget) {
        return env("__OW_API_HOST", ow.url(), "CPUSLOT_SOCKET", agent.socket.toString(),
                "CPUSLOT_ANNOTATION_TIMEOUT_MS", annotationBudget,
                "CPUSLOT_FIRST_ACQUIRE_BUDGET_MS", "300000", "CPUSLOT_ACQUIRE_BUDGET_MS", "300000");
    }

    /**
     * The read takes longer than everything else the init does: the first /run sent as soon as
     * /init answers still runs at the annotation's quota, in a slot of it, and one read serves
     * the init and the activations.
     */
    @Test
    void theFirstRunRightAfterInitRunsInASlotOfTheAnnotationsQuota() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(ChainPlatformTest.KEY); FakeAgent agent = new FakeAgent(dir).start()) {
            ow.annotations = "[{\"key\":\"cpu-quota\",\"value\":\"250m\"}]";
            ow.readDelayMs = 5000;
            String jar = JavaActionContainerTest.echo("main");
            with("java", containerEnv(ow, agent, "300000"), c -> {
                Reply init = c.init(initPayload(jar, "example.HelloWhisk", true, invokerInitEnv(Map.of())));
                assertEquals(200, init.code(), String.valueOf(init.raw()));
                Reply r = c.run(coldRun());
                assertEquals(200, r.code(), String.valueOf(r.raw()));
                assertEquals(json("{\"x\":1}"), r.body(), "the result is the action's");
                assertEquals("annotation", r.header("X-Cpuslot-Quota-Source"), "the first /run's quota source: " + r.headers().map());
                assertEquals("250", r.header("X-Cpuslot-Quota-Milli"), r.headers().map().toString());
                assertNotNull(r.header("X-Cpuslot-Slot"), "the first /run ran without a slot: " + r.headers().map());
                assertTrue(agent.received.stream().anyMatch(m -> m instanceof Protocol.Acquire a && a.quotaMilli() == 250),
                        "the agent was asked for a 250m slot: " + agent.received);
                assertEquals(1, ow.reads.get(), "one read of the annotations serves the init and the activations");
            });
        }
    }

    /**
     * Fail-open: a read slower than its budget (CPUSLOT_ANNOTATION_TIMEOUT_MS, also its request's
     * timeout) does not hold the init beyond it; the first /run goes on with the next source (here
     * the init's CPUSLOT_QUOTA), in a slot of that, and the runtime's log says why.
     */
    @Test
    void aReadSlowerThanItsBudgetLetsTheInitAnswerAndTheFirstRunTakesTheNextSource() throws Exception {
        try (OpenWhiskApiStandIn ow = new OpenWhiskApiStandIn(ChainPlatformTest.KEY); FakeAgent agent = new FakeAgent(dir).start()) {
            ow.annotations = "[{\"key\":\"cpu-quota\",\"value\":\"250m\"}]";
            ow.readDelayMs = 600_000; // never, within the case
            String jar = JavaActionContainerTest.echo("main");
            with("java", containerEnv(ow, agent, "200"), c -> {
                Reply init = c.init(initPayload(jar, "example.HelloWhisk", true, invokerInitEnv(Map.of("CPUSLOT_QUOTA", "100m"))));
                assertEquals(200, init.code(), String.valueOf(init.raw()));
                Reply r = c.run(coldRun());
                assertEquals(200, r.code(), String.valueOf(r.raw()));
                assertEquals("init", r.header("X-Cpuslot-Quota-Source"), r.headers().map().toString());
                assertEquals("100", r.header("X-Cpuslot-Quota-Milli"), r.headers().map().toString());
                assertNotNull(r.header("X-Cpuslot-Slot"), "the first /run ran without a slot: " + r.headers().map());
                // the init stopped waiting, or the read's own request timed out first
                String log = Files.readString(c.runtimeLog);
                assertTrue(log.contains("annotation read for " + ACTION + " not answered") || log.contains("annotation lookup for " + ACTION + " failed"),
                        "the log says why:\n" + log);
            });
        }
    }
}
