package dev.cpuslot.conformance;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
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
