package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Local chaining (docs/chaining.md): a function calls another function of the same
 * owner registered in the same runtime (Hydra /register), in process, each hop on its own worker
 * and slot. Java, JavaScript and Python callers; the limits (owner, depth, fan-out, a callee's
 * failure and time limit) fail the caller with a typed error and never the runtime.
 */
@DisplayName("Local chaining")
class ChainTest {

    /** One jar with every Java test function (entry points example.*). */
    static final String JAR_SOURCES_CALLER = """
            package example;
            import com.google.gson.*;
            import dev.cpuslot.chain.Chain;
            import dev.cpuslot.chain.ChainException;
            public class Caller {
                public static JsonObject main(JsonObject a) {
                    String callee = a.get("callee").getAsString();
                    JsonObject args = a.has("args") ? a.getAsJsonObject("args") : new JsonObject();
                    String mode = a.has("mode") ? a.get("mode").getAsString() : "sync";
                    JsonObject r = new JsonObject();
                    switch (mode) {
                        case "sync" -> r.add("got", Chain.call(callee, args));
                        case "catch" -> {
                            try {
                                r.add("got", Chain.call(callee, args));
                            } catch (ChainException e) {
                                r.addProperty("kind", e.kind().name());
                                r.addProperty("message", e.getMessage());
                            }
                        }
                        case "async" -> {
                            int n = a.get("n").getAsInt();
                            for (int i = 0; i < n; i++) {
                                try {
                                    Chain.callAsync(callee, args);
                                } catch (ChainException e) {
                                    r.addProperty("kind", e.kind().name());
                                    r.addProperty("refusedAt", i);
                                    break;
                                }
                            }
                        }
                        case "thread" -> { // a thread of its own, ended before the activation returns
                            Thread t = new Thread(() -> {});
                            t.start();
                            try {
                                t.join();
                            } catch (InterruptedException e) {
                                throw new IllegalStateException(e);
                            }
                            r.addProperty("thread", true);
                        }
                        default -> throw new IllegalArgumentException(mode);
                    }
                    return r;
                }
            }
            """;

    static final Map<String, String> JAVA = Map.of(
            "example/Caller.java", JAR_SOURCES_CALLER,
            "example/Double.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    public class Double {
                        public static JsonObject main(JsonObject a) {
                            JsonObject r = new JsonObject();
                            r.addProperty("x", 2 * a.get("x").getAsInt());
                            return r;
                        }
                    }
                    """,
            "example/Count.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    import java.util.concurrent.atomic.AtomicInteger;
                    public class Count {
                        static final AtomicInteger N = new AtomicInteger();
                        public static JsonObject main(JsonObject a) {
                            JsonObject r = new JsonObject();
                            r.addProperty("count", a.has("read") ? N.get() : N.incrementAndGet());
                            return r;
                        }
                    }
                    """,
            "example/Rec.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    import dev.cpuslot.chain.Chain;
                    import dev.cpuslot.chain.ChainException;
                    public class Rec {
                        public static JsonObject main(JsonObject a) {
                            int n = a.get("n").getAsInt();
                            JsonObject next = new JsonObject();
                            next.addProperty("n", n + 1);
                            try {
                                return Chain.call("rec", next).getAsJsonObject();
                            } catch (ChainException e) {
                                if (e.kind() != ChainException.Kind.DEPTH) throw e;
                                JsonObject r = new JsonObject();
                                r.addProperty("deepest", n);
                                r.addProperty("kind", e.kind().name());
                                return r;
                            }
                        }
                    }
                    """,
            "example/Boom.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    public class Boom {
                        public static JsonObject main(JsonObject a) { throw new IllegalStateException("boom in the callee"); }
                    }
                    """,
            "example/Forever.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    public class Forever {
                        public static JsonObject main(JsonObject a) {
                            long x = 0;
                            while (x >= 0) x++;
                            return new JsonObject();
                        }
                    }
                    """);

    private static String jarBase64;

    private static synchronized String jarBase64() throws Exception {
        if (jarBase64 == null) jarBase64 = Archives.jar(JAVA);
        return jarBase64;
    }

    static void registerJava(ActionContainer c, String name, String cls, String extra) throws Exception {
        Path jar = c.dir.resolve("functions.jar");
        if (!Files.exists(jar)) Files.write(jar, Base64.getDecoder().decode(jarBase64()));
        Reply r = c.post("/register?name=" + name + "&language=java&entryPoint=example." + cls + "&url=" + jar.toUri() + extra, "");
        assertEquals(200, r.code(), "register " + name + ": " + r.raw());
    }

    static void registerText(ActionContainer c, String name, String language, String code, String extra) throws Exception {
        Path f = c.dir.resolve(name + (language.equals("python") ? ".py" : ".js"));
        Files.writeString(f, code, StandardCharsets.UTF_8);
        Reply r = c.post("/register?name=" + name + "&language=" + language + "&entryPoint=main&url=" + f.toUri() + extra, "");
        assertEquals(200, r.code(), "register " + name + ": " + r.raw());
    }

    static Reply invoke(ActionContainer c, String name, String args) throws Exception {
        JsonObject o = new JsonObject();
        o.addProperty("name", name);
        o.addProperty("arguments", args);
        return c.post("/", o.toString());
    }

    static JsonObject result(Reply r) {
        assertEquals(200, r.code(), String.valueOf(r.raw()));
        return r.body().getAsJsonObject("result");
    }

    static void assertAlive(ActionContainer c) throws Exception {
        assertTrue(c.alive(), "the runtime process died");
        assertEquals(200, c.post("/", "").code(), "health");
    }

    /** A synchronous call returns the callee's result; the answer names the hop (X-Cpuslot-Chain-*). */
    @Test
    void aSyncCallReturnsTheCalleesResult() throws Exception {
        with("java", c -> {
            registerJava(c, "caller", "Caller", "");
            registerJava(c, "double", "Double", "");
            Reply r = invoke(c, "caller", "{\"callee\":\"double\",\"args\":{\"x\":21}}");
            assertEquals(42, result(r).getAsJsonObject("got").get("x").getAsInt(), String.valueOf(r.raw()));
            assertEquals("1", r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
            assertTrue(r.header("X-Cpuslot-Chain").startsWith("double="), r.header("X-Cpuslot-Chain"));
        });
    }

    /** JavaScript and Python functions call (and are called) alike; a Java callee answers both. */
    @Test
    void javaScriptAndPythonCallersGetTheResult() throws Exception {
        with("javascript", c -> {
            registerJava(c, "double", "Double", "");
            registerJava(c, "boom", "Boom", "");
            registerText(c, "jscaller", "javascript", """
                    function main(a) {
                      if (a.mode === 'catch') {
                        try { cpuslot.call(a.callee, a.args); return {}; }
                        catch (e) { return { kind: e.kind, name: e.name, message: e.message }; }
                      }
                      return { got: cpuslot.call(a.callee, a.args) };
                    }
                    """, "");
            registerText(c, "pycaller", "python", """
                    def main(a):
                        try:
                            return {'got': cpuslot.call(a['callee'], a.get('args', {}))}
                        except cpuslot.ChainError as e:
                            return {'kind': e.kind, 'message': str(e)}
                    """, "");
            assertEquals(42, result(invoke(c, "jscaller", "{\"callee\":\"double\",\"args\":{\"x\":21}}"))
                    .getAsJsonObject("got").get("x").getAsInt());
            assertEquals(42, result(invoke(c, "pycaller", "{\"callee\":\"double\",\"args\":{\"x\":21}}"))
                    .getAsJsonObject("got").get("x").getAsInt());
            // JavaScript calling Python calling Java
            JsonObject nested = result(invoke(c, "jscaller",
                    "{\"callee\":\"pycaller\",\"args\":{\"callee\":\"double\",\"args\":{\"x\":4}}}"));
            assertEquals(8, nested.getAsJsonObject("got").getAsJsonObject("got").get("x").getAsInt(), nested.toString());
            JsonObject js = result(invoke(c, "jscaller", "{\"mode\":\"catch\",\"callee\":\"boom\",\"args\":{}}"));
            assertEquals("FAILED", js.get("kind").getAsString(), js.toString());
            assertEquals("ChainError", js.get("name").getAsString(), js.toString());
            JsonObject py = result(invoke(c, "pycaller", "{\"callee\":\"boom\"}"));
            assertEquals("FAILED", py.get("kind").getAsString(), py.toString());
            assertTrue(py.get("message").getAsString().contains("boom in the callee"), py.toString());
        });
    }

    /** Asynchronous calls run (each on the callee's own worker); more than the fan-out bound are refused. */
    @Test
    void asyncCallsRunAndTheirFanOutIsBounded() throws Exception {
        with("java", env("CPUSLOT_CHAIN_MAX_ASYNC", "3"), c -> {
            registerJava(c, "caller", "Caller", "");
            registerJava(c, "count", "Count", "");
            JsonObject r = result(invoke(c, "caller", "{\"mode\":\"async\",\"callee\":\"count\",\"n\":2}"));
            assertFalse(r.has("kind"), r.toString());
            awaitCount(c, 2);
            r = result(invoke(c, "caller", "{\"mode\":\"async\",\"callee\":\"count\",\"n\":10}"));
            assertEquals("FAN_OUT", r.get("kind").getAsString(), r.toString());
            assertEquals(3, r.get("refusedAt").getAsInt(), r.toString());
            awaitCount(c, 5);
        });
    }

    /** The async callees' side effect shows; a hang says what it saw (the request timeout bounds it). */
    private static void awaitCount(ActionContainer c, int want) throws Exception {
        int seen = -1;
        for (int i = 0; i < 6000 && seen < want; i++) {
            seen = result(invoke(c, "count", "{\"read\":true}")).get("count").getAsInt();
            if (seen < want) Thread.sleep(10);
        }
        assertEquals(want, seen, "async callees that ran");
    }

    /** Another owner's function is refused, even in a runtime that serves several owners; so is a function not here. */
    @Test
    void anotherOwnersFunctionIsRefused() throws Exception {
        with("java", env("CPUSLOT_OWNER", "*"), c -> {
            registerJava(c, "caller", "Caller", "&owner=alice");
            registerJava(c, "bobs", "Double", "&owner=bob");
            registerJava(c, "alices", "Double", "&owner=alice");
            JsonObject r = result(invoke(c, "caller", "{\"mode\":\"catch\",\"callee\":\"bobs\",\"args\":{\"x\":1}}"));
            assertEquals("OTHER_OWNER", r.get("kind").getAsString(), r.toString());
            r = result(invoke(c, "caller", "{\"mode\":\"catch\",\"callee\":\"alices\",\"args\":{\"x\":1}}"));
            assertEquals(2, r.getAsJsonObject("got").get("x").getAsInt(), r.toString());
            r = result(invoke(c, "caller", "{\"mode\":\"catch\",\"callee\":\"elsewhere\",\"args\":{}}"));
            assertEquals("NOT_LOCAL", r.get("kind").getAsString(), r.toString());
        });
    }

    /** A function calling itself stops at the depth bound with a DEPTH error its caller can see. */
    @Test
    void recursionStopsAtTheDepthBound() throws Exception {
        with("java", env("CPUSLOT_CHAIN_MAX_DEPTH", "4"), c -> {
            registerJava(c, "rec", "Rec", "");
            Reply r = invoke(c, "rec", "{\"n\":0}");
            JsonObject o = result(r);
            assertEquals("DEPTH", o.get("kind").getAsString(), o.toString());
            assertEquals(4, o.get("deepest").getAsInt(), o.toString());
            assertEquals("4", r.header("X-Cpuslot-Chain-Hops"), r.headers().map().toString());
            assertAlive(c);
        });
    }

    /**
     * The threads that serve a chain call (the callee's worker, an async call's thread) are the
     * runtime's, not threads the calling Java function made: they do not count against its
     * CPUSLOT_JAVA_MAX_THREADS nor inherit its activation. (Before: each one counted, and a
     * chain of new workers hit a limit of 1 at its second hop.)
     */
    @Test
    void chainThreadsAreNotTheCallersThreads() throws Exception {
        with("java", env("CPUSLOT_JAVA_MAX_THREADS", "1", "CPUSLOT_CHAIN_MAX_DEPTH", "3"), c -> {
            registerJava(c, "rec", "Rec", "");
            registerJava(c, "caller", "Caller", "");
            registerJava(c, "count", "Count", "");
            JsonObject o = result(invoke(c, "rec", "{\"n\":0}"));
            assertEquals(3, o.get("deepest").getAsInt(), o.toString());
            JsonObject r = result(invoke(c, "caller", "{\"mode\":\"async\",\"callee\":\"count\",\"n\":3}"));
            assertFalse(r.has("kind"), r.toString());
            awaitCount(c, 3);
        });
    }

    /** A callee that throws fails its caller with a typed error naming the callee and its error. */
    @Test
    void aCalleeFailureFailsTheCaller() throws Exception {
        with("java", c -> {
            registerJava(c, "caller", "Caller", "");
            registerJava(c, "boom", "Boom", "");
            Reply r = invoke(c, "caller", "{\"callee\":\"boom\"}");
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            String err = r.body().get("error").getAsString();
            assertTrue(err.contains("ChainException") && err.contains("FAILED") && err.contains("boom")
                    && err.contains("boom in the callee"), err);
            assertAlive(c);
        });
    }

    /**
     * A callee past its own time limit fails its caller with TIMEOUT, and the caller goes on; a
     * callee never runs past its caller's deadline (the whole chain ends at the caller's).
     */
    @Test
    void aCalleeTimeoutFailsTheCaller() throws Exception {
        with("java", c -> {
            registerJava(c, "caller", "Caller", "");
            registerJava(c, "forever", "Forever", "&timeout=300");
            registerJava(c, "forever2", "Forever", "");
            registerJava(c, "shortcaller", "Caller", "&timeout=500");
            JsonObject r = result(invoke(c, "caller", "{\"mode\":\"catch\",\"callee\":\"forever\",\"args\":{}}"));
            assertEquals("TIMEOUT", r.get("kind").getAsString(), r.toString());
            // the callee has no limit of its own (the default: a minute); the caller's 500 ms bound it
            // (the caller sees TIMEOUT, or its own deadline ends it first: either way the chain ended)
            Reply s = invoke(c, "shortcaller", "{\"mode\":\"catch\",\"callee\":\"forever2\",\"args\":{}}");
            boolean typed = s.code() == 200 && "TIMEOUT".equals(s.body().getAsJsonObject("result").get("kind").getAsString());
            boolean ended = s.code() == 502 && s.body().get("error").getAsString().contains("deadline");
            assertTrue(typed || ended, String.valueOf(s.raw()));
            assertAlive(c);
            // a JavaScript caller waits in host code while its callee runs: the same, its context cancelled at its deadline
            registerText(c, "jscaller", "javascript", """
                    function main(a) {
                      try { cpuslot.call(a.callee, {}); return {}; } catch (e) { return { kind: e.kind }; }
                    }
                    """, "");
            registerText(c, "jsshort", "javascript", "function main(a) { cpuslot.call(a.callee, {}); return {}; }", "&timeout=500");
            JsonObject js = result(invoke(c, "jscaller", "{\"callee\":\"forever\"}"));
            assertEquals("TIMEOUT", js.get("kind").getAsString(), js.toString());
            Reply jss = invoke(c, "jsshort", "{\"callee\":\"forever2\"}");
            assertEquals(502, jss.code(), String.valueOf(jss.raw()));
            assertAlive(c);
            assertEquals("TIMEOUT", result(invoke(c, "jscaller", "{\"callee\":\"forever\"}")).get("kind").getAsString());
            Reply again = invoke(c, "caller", "{\"callee\":\"double2\"}");
            assertEquals(502, again.code(), String.valueOf(again.raw())); // not local: the caller's error, the runtime serves on
        });
    }
}
