package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.util.List;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/** apache/openwhisk-runtime-nodejs {@code NodeJsNonConcurrentTests.scala}: the suite without __OW_ALLOW_CONCURRENT. */
@DisplayName("JavaScript action, not concurrent (NodeJsNonConcurrentTests)")
class NodeJsNonConcurrentTest extends NodeJsActionContainerTest {
    @Test
    @DisplayName("NodeJsNonConcurrentTests: NOT allow running activations concurrently (without proper env setup)")
    void notConcurrent() throws Exception {
        String code = """
                function main(args) {
                    console.log("no concurrency");
                    return new Promise(function(resolve, reject) {
                        setTimeout(function() {
                            resolve({ args: args});
                        }, 1000);
                    });
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            // both at once; upstream's 1 s activation keeps the first one running. On a loaded
            // machine the second can arrive after the first ended: then both succeed, and the
            // case is repeated (bounded) until they overlapped.
            for (int attempt = 0; ; attempt++) {
                List<Reply> rs = c.runMultiple(payloads(2));
                long ok = rs.stream().filter(r -> r.code() == 200 && r.body() != null && r.body().has("args")).count();
                long refused = rs.stream().filter(r -> r.code() == 403 && r.body() != null
                        && new JsonPrimitive("System not ready, status is running.").equals(r.body().get("error"))).count();
                if (ok == 2 && attempt < 5) continue;
                assertEquals(1, ok, rs.toString());
                assertEquals(1, refused, rs.toString());
                break;
            }
        });
        // the retries above add whole activations (one line and one sentinel each)
        int n = count(logs[0], SENTINEL);
        checkStreams(logs, (o, e) -> {
            assertEquals("no concurrency".repeat(n), o.replace("\n", ""));
            assertEquals("Internal system error: System not ready, status is running.", e);
        }, n);
    }
}
