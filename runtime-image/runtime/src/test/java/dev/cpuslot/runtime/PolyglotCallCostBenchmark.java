package dev.cpuslot.runtime;

import com.google.gson.JsonElement;
import com.google.gson.JsonParser;
import org.junit.jupiter.api.Test;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.Arrays;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import dev.cpuslot.runtime.exec.Function;
import dev.cpuslot.runtime.lang.PolyglotFunction;

/**
 * What the runtime itself spends per call of a guest function: a hello-world
 * {@code main} called through a function's sandbox with an activation's {@code __OW_*}
 * environment, the calling thread's CPU time per call (so neither the compiler threads nor the
 * machine's load count). Not a test: runs only when named, e.g.
 * <pre>
 * ./build.sh verify -pl runtime -am -DskipITs -Dtest=PolyglotCallCostBenchmark -Dsurefire.failIfNoSpecifiedTests=false \
 *     -Dcallcost.language=python -Dcallcost.calls=3000 -Dcallcost.last=1000
 * </pre>
 * The tests' JVM runs guest code on Truffle's fallback runtime (no JIT): compare builds with it,
 * not with a runtime started as its image starts it.
 */
class PolyglotCallCostBenchmark {
    @Test
    void helloWorldCallCost() throws Exception {
        String lang = System.getProperty("callcost.language", "python");
        int calls = Integer.getInteger("callcost.calls", 3000), last = Integer.getInteger("callcost.last", 1000);
        String code = lang.equals("python") ? "def main(args):\n    return {'hello': 'world'}\n"
                : "function main(args) { return { hello: 'world' }; }\n";
        ThreadMXBean tm = ManagementFactory.getThreadMXBean();
        try (PolyglotFunction f = new PolyglotFunction("callcost", lang, code, "main", Map.of("A", "1", "B", "2"))) {
            Function.Sandbox s = f.newSandbox();
            try {
                JsonElement args = JsonParser.parseString("{\"name\":\"x\",\"n\":3}");
                long[] cpu = new long[calls];
                for (int i = 0; i < calls; i++) {
                    Map<String, String> env = Map.of("__OW_ACTIVATION_ID", "act" + i, "__OW_DEADLINE", Long.toString(System.currentTimeMillis() + 60_000),
                            "__OW_NAMESPACE", "guest", "__OW_ACTION_NAME", "/guest/callcost");
                    long c = tm.getCurrentThreadCpuTime();
                    JsonElement r = s.invoke(args, env);
                    cpu[i] = tm.getCurrentThreadCpuTime() - c;
                    if (i == 0) assertEquals("world", r.getAsJsonObject().get("hello").getAsString());
                }
                long[] tail = Arrays.copyOfRange(cpu, calls - last, calls);
                Arrays.sort(tail);
                System.out.printf("%s hello-world: thread CPU per call, last %d of %d: p50 %.1f us, mean %.1f us%n", lang, last, calls,
                        tail[last / 2] / 1e3, Arrays.stream(tail).average().orElse(0) / 1e3);
            } finally {
                s.close();
            }
        }
    }
}
