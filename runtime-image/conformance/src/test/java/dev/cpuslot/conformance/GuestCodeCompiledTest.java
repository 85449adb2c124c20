package dev.cpuslot.conformance;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * The runtime started as its image starts it compiles guest code: Truffle found Graal through
 * JVMCI (image/jvm-options-jit). Without it every JavaScript and Python function runs in
 * Truffle's interpreter, 10-25 times slower, and nothing else would fail.
 */
@DisplayName("Guest code is compiled (the optimizing Truffle runtime)")
class GuestCodeCompiledTest {
    private static final Pattern ENGINE = Pattern.compile("polyglot engine (\\w+): (.+)");

    @Test
    void javascript() throws Exception {
        assertCompiled("javascript", "js", "function main(args) { return { hello: 'world' }; }");
    }

    @Test
    void python() throws Exception {
        assertCompiled("python", "python", "def main(args):\n    return {'hello': 'world'}\n");
    }

    /**
     * Compilation's share of the machine does not grow with its cores: by default Truffle starts up
     * to min(16, cores/4 + log2(log2(cores))) compiler threads and HotSpot scales C1/C2 with the cores,
     * none of them in any invocation's slot (12 Truffle, 12 C2 and 6 C1 threads for one function on a
     * runtime that saw 64 cores). image/jvm-options-jit fixes them at one Truffle and two HotSpot
     * compiler threads. A JavaScript function with 200 hot functions queues 200 compilations at once.
     */
    @Test
    void compilerThreadsDoNotScaleWithTheCores() throws Exception {
        String code = """
                var fs = [];
                for (var k = 0; k < 200; k++)
                  fs.push(new Function('x', 'var s = 0; for (var i = 0; i < 50; i++) s += (x * ' + k + ' + i) % 7; return s;'));
                function main(args) {
                  var t = 0;
                  for (var r = 0; r < 20; r++) for (var k = 0; k < fs.length; k++) t += fs[k](r);
                  return { t: t };
                }
                """;
        ActionContainer.with("javascript", Map.of("JAVA_TOOL_OPTIONS", "-XX:ActiveProcessorCount=64"), c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Map<String, Integer> most = new TreeMap<>();
            for (int i = 0; i < 5; i++) {
                Reply r = c.run(runPayload(json("{}")));
                assertEquals(200, r.code(), String.valueOf(r.raw()));
                compilerThreads(c.pid()).forEach((k, v) -> most.merge(k, v, Math::max));
            }
            assertTrue(most.getOrDefault("TruffleCompiler", 0) <= 1, "Truffle compiler threads: " + most);
            assertTrue(most.getOrDefault("C1 CompilerThre", 0) + most.getOrDefault("C2 CompilerThre", 0) <= 2, "HotSpot compiler threads: " + most);
        });
    }

    /** The process's compiler threads by name (as /proc has them: 15 characters), counted. */
    private static Map<String, Integer> compilerThreads(long pid) throws IOException {
        Map<String, Integer> n = new TreeMap<>();
        try (var tasks = Files.list(Path.of("/proc/" + pid + "/task"))) {
            for (Path t : (Iterable<Path>) tasks::iterator) {
                String comm;
                try {
                    comm = Files.readString(t.resolve("comm")).strip();
                } catch (IOException gone) { // the thread ended meanwhile
                    continue;
                }
                if (comm.contains("Compiler")) n.merge(comm.replaceAll("[-#]?\\d+$", ""), 1, Integer::sum);
            }
        }
        return n;
    }

    /** Truffle's engine implementation: "Interpreted" is the fallback without a JIT. */
    private static void assertCompiled(String kind, String polyglotId, String code) throws Exception {
        String[] outErr = ActionContainer.with(kind, c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(json("{}")));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            String log = Files.readString(c.runtimeLog);
            Matcher m = ENGINE.matcher(log);
            assertTrue(m.find(), "the runtime names its polyglot engine:\n" + log);
            assertEquals(polyglotId, m.group(1));
            assertNotEquals("Interpreted", m.group(2).strip(), "guest code runs in Truffle's interpreter only:\n" + log);
        });
        assertFalse(outErr[1].contains("fallback runtime"), "Truffle warned of its interpreter-only fallback:\n" + outErr[1]);
        // e.g. "Using polyglot contexts on Java virtual threads on HotSpot is experimental": guest
        // code must run on platform threads (compiled code cannot materialize frames on virtual ones)
        assertFalse(outErr[1].contains("[engine] WARNING"), "Truffle warned:\n" + outErr[1]);
    }
}
