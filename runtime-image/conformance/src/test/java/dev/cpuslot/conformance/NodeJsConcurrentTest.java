package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * apache/openwhisk-runtime-nodejs {@code NodeJsConcurrentTests.scala}: the suite with
 * {@code __OW_ALLOW_CONCURRENT=true} in the container's environment, and 128 activations at once.
 */
@DisplayName("JavaScript action, concurrent (NodeJsConcurrentTests)")
class NodeJsConcurrentTest extends NodeJsActionContainerTest {
    static final int REQUESTS = 128;

    @Override Map<String, String> nodeEnv() { return Map.of("__OW_ALLOW_CONCURRENT", "true"); }

    /**
     * Upstream's action counts arrivals in {@code global.count} and answers once all 128 have
     * arrived, so every log line precedes every sentinel. DIVERGENCE: each concurrent activation
     * runs in its own sandbox (a JS context per worker, the pool grows on demand), so globals are
     * per sandbox, not per container. The action here answers after 1 s instead; the checks are
     * upstream's except that the 128 sentinels are checked to be whole lines, not one block.
     */
    @Test
    @DisplayName("NodeJsConcurrentTests: allow running activations concurrently -- DIVERGENCE: globals are per sandbox")
    void concurrent() throws Exception {
        String code = """
                function main(args) {
                    console.log("interleave me");
                    return new Promise(function(resolve, reject) {
                        setTimeout(function() { resolve({ args: args }); }, 1000);
                    });
                }
                """;
        List<JsonObject> ps = payloads(REQUESTS);
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            List<Reply> rs = c.runMultiple(ps);
            for (JsonObject p : ps) {
                JsonObject expected = new JsonObject();
                expected.add("args", p.get("value"));
                assertTrue(rs.stream().anyMatch(r -> r.code() == 200 && expected.equals(r.body())), "no 200 " + expected + " in " + rs);
            }
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("interleave me".repeat(REQUESTS), o.replace("\n", ""));
            assertEquals("", e);
        }, REQUESTS);
        for (String line : logs[0].split("\n"))
            assertTrue(line.equals(SENTINEL) || line.equals("interleave me"), "a line mixes outputs: " + line);
    }
}
