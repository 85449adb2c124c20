package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Owners on every path of the runtime's control plane, against the runtime as its image starts it:
 * a runtime serving several owners ({@code CPUSLOT_OWNER=*}) never lets one owner's
 * {@code /register} replace, or its {@code /deregister} remove, another owner's function; one owner
 * cannot fill the pending asynchronous chain calls of another; and a {@code /register} that fails
 * never quotes the file or code it read.
 */
@DisplayName("Owners on every path")
class OwnerBoundaryTest {

    static final Map<String, String> JAVA;

    static {
        Map<String, String> m = new HashMap<>(ChainTest.JAVA);
        m.put("example/Who.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Who {
                    public static JsonObject main(JsonObject a) {
                        JsonObject r = new JsonObject();
                        r.addProperty("who", "alice's function");
                        return r;
                    }
                }
                """);
        m.put("example/Evil.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Evil {
                    public static JsonObject main(JsonObject a) {
                        JsonObject r = new JsonObject();
                        r.addProperty("who", "bob's code");
                        r.add("stolen", a);
                        return r;
                    }
                }
                """);
        m.put("example/Nap.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Nap {
                    public static JsonObject main(JsonObject a) throws InterruptedException {
                        Thread.sleep(a.get("ms").getAsLong());
                        return new JsonObject();
                    }
                }
                """);
        JAVA = Map.copyOf(m);
    }

    private static String jar;

    private static synchronized Path jar(ActionContainer c) throws Exception {
        if (jar == null) jar = Archives.jar(JAVA);
        Path p = c.dir.resolve("functions.jar");
        if (!Files.exists(p)) Files.write(p, Base64.getDecoder().decode(jar));
        return p;
    }

    static Reply register(ActionContainer c, String name, String cls, String owner, String extra) throws Exception {
        return c.post("/register?name=" + name + "&language=java&entryPoint=example." + cls + "&url=" + jar(c).toUri()
                + "&owner=" + owner + extra, "");
    }

    static JsonObject result(Reply r) {
        assertEquals(200, r.code(), String.valueOf(r.raw()));
        return r.body().getAsJsonObject("result");
    }

    /**
     * Bob's /register of the name alice's function has is refused (403) and alice's calls still
     * run her code with her arguments. (Before: bob's code ran with alice's arguments.)
     */
    @Test
    void aRegisterNeverReplacesAnotherOwnersFunction() throws Exception {
        with("java", env("CPUSLOT_OWNER", "*"), c -> {
            assertEquals(200, register(c, "f", "Who", "alice", "").code());
            Reply bob = register(c, "f", "Evil", "bob", "");
            assertEquals(403, bob.code(), String.valueOf(bob.raw()));
            JsonObject r = result(ChainTest.invoke(c, "f", "{\"secret\":\"alice's\"}"));
            assertEquals("alice's function", r.get("who").getAsString(), r.toString());
            // the owner may still replace her own
            assertEquals(200, register(c, "f", "Double", "alice", "").code());
            assertEquals(4, result(ChainTest.invoke(c, "f", "{\"x\":2}")).get("x").getAsInt());
        });
    }

    /**
     * /deregister names the owner and removes only that owner's function, in a runtime of several
     * owners and in one of one owner. (Before: /deregister checked no owner.)
     */
    @ParameterizedTest(name = "CPUSLOT_OWNER={0}")
    @ValueSource(strings = {"*", "alice"})
    void aDeregisterRemovesOnlyTheOwnersFunction(String owner) throws Exception {
        with("java", env("CPUSLOT_OWNER", owner), c -> {
            assertEquals(200, register(c, "f", "Who", "alice", "").code());
            for (String q : new String[]{"&owner=bob", "", "&owner="}) {
                Reply r = c.post("/deregister?name=f" + q, "");
                assertEquals(403, r.code(), q + ": " + r.raw());
            }
            assertEquals("alice's function", result(ChainTest.invoke(c, "f", "{}")).get("who").getAsString());
            assertEquals(200, c.post("/deregister?name=f&owner=alice", "").code());
            assertEquals(404, ChainTest.invoke(c, "f", "{}").code());
        });
    }

    /**
     * Pending asynchronous chain calls are bounded per owner: bob's calls that fill his share
     * leave alice's asynchronous call running. (Before: one table for the runtime, and alice's call
     * got FAN_OUT.)
     */
    @Test
    void oneOwnerCannotFillAnothersPendingChainCalls() throws Exception {
        with("java", env("CPUSLOT_OWNER", "*", "CPUSLOT_CHAIN_MAX_PENDING", "2"), c -> {
            assertEquals(200, register(c, "bobcaller", "Caller", "bob", "").code());
            assertEquals(200, register(c, "bobnap", "Nap", "bob", "").code());
            assertEquals(200, register(c, "alicecaller", "Caller", "alice", "").code());
            assertEquals(200, register(c, "alicecount", "Count", "alice", "").code());
            JsonObject r = result(ChainTest.invoke(c, "bobcaller",
                    "{\"mode\":\"async\",\"callee\":\"bobnap\",\"n\":5,\"args\":{\"ms\":60000}}"));
            assertEquals("FAN_OUT", r.get("kind").getAsString(), "bob's share is full: " + r);
            r = result(ChainTest.invoke(c, "alicecaller", "{\"mode\":\"async\",\"callee\":\"alicecount\",\"n\":1}"));
            assertFalse(r.has("kind"), "alice's asynchronous call was refused: " + r);
        });
    }

    /** Alice's function: a secret in a file of its temporary directory, in its java.util.logging records and its output. */
    static final String VAULT = """
            Path f = Path.of(System.getProperty("java.io.tmpdir"), "secret.xml");
            Files.writeString(f, "<s>alice-SECRET-42</s>");
            java.util.logging.Logger.getLogger("vault").info("alice-SECRET-42 logged");
            System.out.println("alice-SECRET-42 printed");
            args.addProperty("path", f.toString());
            return args;""";

    /** Bob's ways to alice's data, each a function of his ({@code got}: what it read). */
    static final Map<String, String> THIEVES = Map.of(
            "byPath", "args.addProperty(\"got\", Files.readString(Path.of(args.get(\"path\").getAsString()))); return args;",
            "xmlByUri", """
                    var d = javax.xml.parsers.DocumentBuilderFactory.newInstance().newDocumentBuilder()
                            .parse("file:" + args.get("path").getAsString());
                    args.addProperty("got", d.getDocumentElement().getTextContent());
                    return args;""",
            "xmlInputSource", """
                    var d = javax.xml.parsers.DocumentBuilderFactory.newInstance().newDocumentBuilder()
                            .parse(new org.xml.sax.InputSource("file:" + args.get("path").getAsString()));
                    args.addProperty("got", d.getDocumentElement().getTextContent());
                    return args;""",
            "logHandler", """
                    if (!args.has("path")) {
                        java.util.logging.Logger.getLogger("").addHandler(new java.util.logging.Handler() {
                            @Override public void publish(java.util.logging.LogRecord r) { SEEN.add(String.valueOf(r.getMessage())); }
                            @Override public void flush() {}
                            @Override public void close() {}
                        });
                        return args;
                    }
                    args.addProperty("got", String.valueOf(SEEN));
                    return args;
                    }
                    static final List<String> SEEN = Collections.synchronizedList(new ArrayList<>());
                    static {""",
            "logFilter", """
                    if (!args.has("path")) {
                        java.util.logging.Logger.getLogger("vault").setFilter(r -> { SEEN.add(String.valueOf(r.getMessage())); return true; });
                        return args;
                    }
                    args.addProperty("got", String.valueOf(SEEN));
                    return args;
                    }
                    static final List<String> SEEN = Collections.synchronizedList(new ArrayList<>());
                    static {""");

    /**
     * In a runtime of several owners, bob's functions read none of alice's data: not her
     * temporary file by its path, nor through an XML parser that opens it by URI itself, nor her
     * java.util.logging records through a handler or a filter on the JVM-wide loggers. Each way is
     * refused at bob's /register, or fails at the call, or reads nothing of hers. (Before: the XML
     * parser read her file, and a handler on the root logger and a filter on her logger got her
     * records.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"byPath", "xmlByUri", "xmlInputSource", "logHandler", "logFilter"})
    void oneOwnersFunctionReadsNoneOfAnothersData(String way) throws Exception {
        String vault = JavaContainmentTest.probe(VAULT), thief = JavaContainmentTest.probe(THIEVES.get(way));
        with("java", env("CPUSLOT_OWNER", "*"), c -> {
            assertEquals(200, JavaContainmentTest.register(c, "vault", JavaContainmentTest.jarFile(c, "vault", vault), "alice").code());
            Reply reg = JavaContainmentTest.register(c, "thief", JavaContainmentTest.jarFile(c, "thief", thief), "bob");
            if (reg.code() != 200) { // refused at /register, naming what
                assertTrue(reg.code() >= 400 && reg.code() < 500 && String.valueOf(reg.raw()).contains("java.util.logging"),
                        "bob's /register: " + reg.raw());
                return;
            }
            if (way.startsWith("log")) assertEquals(200, JavaContainmentTest.invoke(c, "thief").code(), "bob's first call");
            Reply a = JavaContainmentTest.invoke(c, "vault");
            assertEquals(200, a.code(), String.valueOf(a.raw()));
            assertTrue(result(a).has("path"), String.valueOf(a.raw()));
            String path = result(a).get("path").getAsString();
            Reply r = ChainTest.invoke(c, "thief", "{\"path\":\"" + path + "\"}");
            assertFalse(String.valueOf(r.raw()).contains("alice-SECRET-42"), way + ": bob read alice's data: " + r.raw());
            if (r.code() != 200) assertTrue(String.valueOf(r.raw()).contains("SecurityException"), way + ": " + r.raw());
            assertEquals(200, JavaContainmentTest.invoke(c, "vault").code(), "alice's function after bob's");
        });
    }

    /**
     * A /register whose code does not load says why without quoting what it read: not a file of
     * the runtime's process ({@code /proc/self/environ}: a secret of its environment), nor the code
     * sent. (Before: the parse error quoted both.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"python", "javascript", "java"})
    void aFailedRegisterQuotesNoFileOrCode(String language) throws Exception {
        String secret = "s3cret-" + language + "-7Xq";
        with(language.equals("java") ? "java" : language, env("SOME_TOKEN", secret), c -> {
            Reply r = c.post("/register?name=x&language=" + language + "&entryPoint=main&url=file:/proc/self/environ", "");
            assertNotEquals(200, r.code(), String.valueOf(r.raw()));
            assertFalse(String.valueOf(r.raw()).contains(secret), "the error quotes the process's environment: " + r.raw());
            Path code = c.dir.resolve("bad.txt");
            Files.writeString(code, "def main(a): ( " + secret + " ]]] {{{\n", StandardCharsets.UTF_8);
            r = c.post("/register?name=y&language=" + language + "&entryPoint=main&url=" + code.toUri(), "");
            assertNotEquals(200, r.code(), String.valueOf(r.raw()));
            assertFalse(String.valueOf(r.raw()).contains(secret), "the error quotes the code: " + r.raw());
            r = c.post("/register?name=z&language=" + language + "&entryPoint=main", "def main(a): ( " + secret + " ]]] {{{\n");
            assertNotEquals(200, r.code(), String.valueOf(r.raw()));
            assertFalse(String.valueOf(r.raw()).contains(secret), "the error quotes the code in the body: " + r.raw());
        });
    }
}
