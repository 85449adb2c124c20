package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.Test;

import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * apache/openwhisk-runtime-java {@code tests/src/test/scala/actionContainers/JavaActionContainerTests.scala}
 * (with BasicActionRunnerTests), against the {@code java} kind.
 */
@DisplayName("Java action (JavaActionContainerTests)")
class JavaActionContainerTest extends BasicActionRunnerCases {
    static final String ERR_PREFIX = "An error has occurred (see logs for details):";

    @Override String kind() { return "java"; }

    static String helloWhisk(String body) throws Exception {
        return Archives.jar(Map.of("example/HelloWhisk.java", """
                package example;
                import com.google.gson.JsonObject;
                public class HelloWhisk {
                    public static JsonObject main(JsonObject args) {
                %s
                    }
                }
                """.formatted(body)));
    }

    static String echo(String main) throws Exception {
        return Archives.jar(Map.of("example/HelloWhisk.java", """
                package example;
                import com.google.gson.JsonObject;
                public class HelloWhisk {
                    public static JsonObject %s(JsonObject args) { return args; }
                }
                """.formatted(main)));
    }

    private static TestConfig jarConfig(String jar, String main) { return TestConfig.of(jar, main).asBinary(); }

    @Override TestConfig testNoSourceOrExec() { return TestConfig.of(""); }
    @Override TestConfig testNotReturningJson() { return TestConfig.of("").skip(); } // upstream: see "enforce that the user returns an object"

    @Override TestConfig testEnv() {
        try {
            return jarConfig(helloWhisk("""
                    JsonObject response = new JsonObject();
                    response.addProperty("api_host", System.getenv("__OW_API_HOST"));
                    response.addProperty("api_key", System.getenv("__OW_API_KEY"));
                    response.addProperty("namespace", System.getenv("__OW_NAMESPACE"));
                    response.addProperty("action_name", System.getenv("__OW_ACTION_NAME"));
                    response.addProperty("action_version", System.getenv("__OW_ACTION_VERSION"));
                    response.addProperty("activation_id", System.getenv("__OW_ACTIVATION_ID"));
                    response.addProperty("deadline", System.getenv("__OW_DEADLINE"));
                    return response;"""), "example.HelloWhisk");
        } catch (Exception e) { throw new IllegalStateException(e); }
    }

    @Override TestConfig testEnvParameters() {
        try {
            // the init env is visible while the class initialises, as the Java runtime exports it first
            return jarConfig(Archives.jar(Map.of("example/HelloWhisk.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    public class HelloWhisk {
                        static final String SOME = System.getenv("SOME_VAR"), ANOTHER = System.getenv("ANOTHER_VAR");
                        public static JsonObject main(JsonObject args) {
                            JsonObject r = new JsonObject();
                            r.addProperty("SOME_VAR", SOME);
                            r.addProperty("ANOTHER_VAR", ANOTHER);
                            return r;
                        }
                    }
                    """)), "example.HelloWhisk");
        } catch (Exception e) { throw new IllegalStateException(e); }
    }

    @Override TestConfig testEcho() {
        try {
            return jarConfig(helloWhisk("""
                    System.out.println("hello stdout");
                    System.err.println("hello stderr");
                    return args;"""), "example.HelloWhisk");
        } catch (Exception e) { throw new IllegalStateException(e); }
    }

    @Override TestConfig testUnicode() {
        try {
            return jarConfig(helloWhisk("""
                    String delimiter = args.getAsJsonPrimitive("delimiter").getAsString();
                    JsonObject response = new JsonObject();
                    String str = delimiter + " ☃ " + delimiter;
                    System.out.println(str);
                    response.addProperty("winter", str);
                    return response;"""), "example.HelloWhisk");
        } catch (Exception e) { throw new IllegalStateException(e); }
    }

    @Override TestConfig testInitCannotBeCalledMoreThanOnce() {
        try { return jarConfig(echo("main"), "example.HelloWhisk"); } catch (Exception e) { throw new IllegalStateException(e); }
    }

    @Override TestConfig testEntryPointOtherThanMain() {
        try { return jarConfig(echo("naim"), "example.HelloWhisk#naim"); } catch (Exception e) { throw new IllegalStateException(e); }
    }

    @Override TestConfig testLargeInput() { return testInitCannotBeCalledMoreThanOnce(); }

    @ParameterizedTest(name = "JavaActionContainerTests: report an error if explicit 'main' is not found ({0})")
    @ValueSource(strings = {"", "x", "!", "#", "#main", "#bogus"})
    void explicitMainNotFound(String m) throws Exception {
        String jar = echo("hello");
        String[] logs = withActionContainer(c -> {
            Reply r = c.init(initPayload(jar, "example.HelloWhisk" + m, true, null));
            assertEquals(502, r.code());
            String expected = switch (m) {
                case "x", "!" -> ERR_PREFIX + " java.lang.ClassNotFoundException: example.HelloWhisk" + m;
                case "#bogus" -> ERR_PREFIX + " java.lang.NoSuchMethodException: example.HelloWhisk.bogus(com.google.gson.JsonObject)";
                default -> ERR_PREFIX + " java.lang.NoSuchMethodException: example.HelloWhisk.main(com.google.gson.JsonObject)";
            };
            String error = r.body().get("error").getAsString();
            assertTrue(error.startsWith(expected), error + "\nexpected to start with\n" + expected);
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertFalse(e.isEmpty());
        });
    }

    @Test
    @DisplayName("JavaActionContainerTests: fail to initialize with bad code")
    void badCode() throws Exception {
        // a valid zip holding one file that is not a class
        String brokenJar = Archives.zip(Map.of("notaclassfile", "saucisson\n"));
        String[] logs = withActionContainer(c -> assertNotEquals(200, c.init(initPayload(brokenJar, "example.Broken", true, null)).code()));
        checkStreams(logs, (o, e) -> assertTrue((o + e).toLowerCase().contains("exception"), o + e));
    }

    @Test
    @DisplayName("JavaActionContainerTests: return some error on action error")
    void actionError() throws Exception {
        String jar = Archives.jar(Map.of("example/HelloWhisk.java", """
                package example;
                import com.google.gson.JsonObject;
                public class HelloWhisk {
                    public static JsonObject main(JsonObject args) throws Exception { throw new Exception("noooooooo"); }
                }
                """));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "example.HelloWhisk", true, null)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertNotEquals(200, r.code());
            assertNotNull(r.body().get("error"));
        });
        checkStreams(logs, (o, e) -> assertTrue((o + e).toLowerCase().contains("exception"), o + e));
    }

    @Test
    @DisplayName("JavaActionContainerTests: support application errors")
    void applicationErrors() throws Exception {
        String jar = Archives.jar(Map.of("example/Error.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Error {
                    public static JsonObject main(JsonObject args) throws Exception {
                        JsonObject error = new JsonObject();
                        error.addProperty("error", "This action is unhappy.");
                        return error;
                    }
                }
                """));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Error", true, null)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertNotNull(r.body().get("error"));
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertEquals("", e);
        });
    }

    @Test
    @DisplayName("JavaActionContainerTests: support main in default package")
    void defaultPackage() throws Exception {
        String jar = Archives.jar(Map.of("HelloWhisk.java", """
                import com.google.gson.JsonObject;
                public class HelloWhisk {
                    public static JsonObject main(JsonObject args) throws Exception { return args; }
                }
                """));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "HelloWhisk", true, null)).code());
            JsonObject args = json("{\"a\":\"A\"}");
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code());
            assertEquals(args, r.body());
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertEquals("", e);
        });
    }

    @Test
    @DisplayName("JavaActionContainerTests: survive System.exit")
    void survivesSystemExit() throws Exception {
        String jar = Archives.jar(Map.of("example/Quitter.java", """
                package example;
                import com.google.gson.*;
                public class Quitter {
                    public static JsonObject main(JsonObject main) {
                        if (main.has("halt")) Runtime.getRuntime().halt(3);
                        if (main.has("rt")) Runtime.getRuntime().exit(2);
                        System.exit(1);
                        return new JsonObject();
                    }
                }
                """));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Quitter", true, null)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertNotEquals(200, r.code());
            assertNotNull(r.body().get("error"));
            // beyond upstream: the other exits, and the runtime still serves; each answer names the
            // call the function made and that it is refused (before: Runtime's were a NoSuchMethodError)
            Map<String, String> calls = new java.util.LinkedHashMap<>();
            calls.put("{}", "System.exit(1)");
            calls.put("{\"rt\":true}", "Runtime.exit(2)");
            calls.put("{\"halt\":true}", "Runtime.halt(3)");
            for (Map.Entry<String, String> e : calls.entrySet()) {
                Reply x = c.run(runPayload(json(e.getKey())));
                assertNotEquals(200, x.code());
                String error = String.valueOf(x.body().get("error"));
                assertTrue(error.contains("SecurityException") && error.contains(e.getValue() + " called by the action: not allowed"),
                        e.getValue() + ": " + x.raw());
            }
            assertTrue(c.alive(), "the runtime process is still alive");
        });
        checkStreams(logs, (o, e) -> assertTrue((o + e).toLowerCase().contains("system.exit"), o + e), 4);
    }

    @Test
    @DisplayName("JavaActionContainerTests: enforce that the user returns an object")
    void returnsNull() throws Exception {
        String jar = Archives.jar(Map.of("example/Nuller.java", """
                package example;
                import com.google.gson.*;
                public class Nuller {
                    public static JsonObject main(JsonObject args) { return null; }
                }
                """));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Nuller", true, null)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertNotEquals(200, r.code());
            assertNotNull(r.body().get("error"));
        });
        checkStreams(logs, (o, e) -> assertTrue((o + e).toLowerCase().contains("the action returned null"), o + e));
    }

    static final Map<String, String> DYNAMIC = Map.of(
            "example/EntryPoint.java", """
                    package example;
                    import com.google.gson.*;
                    import java.lang.reflect.*;
                    public class EntryPoint {
                        private final static String CLASS_NAME = "example.DynamicClass";
                        public static JsonObject main(JsonObject args) throws Exception {
                            String cl = args.getAsJsonPrimitive("classLoader").getAsString();
                            Class<?> d = null;
                            if ("local".equals(cl)) d = Class.forName(CLASS_NAME);
                            else if ("thread".equals(cl)) d = Thread.currentThread().getContextClassLoader().loadClass(CLASS_NAME);
                            Object o = d.getDeclaredConstructor().newInstance();
                            Method m = o.getClass().getMethod("getMessage");
                            JsonObject response = new JsonObject();
                            response.addProperty("message", (String) m.invoke(o));
                            return response;
                        }
                    }
                    """,
            "example/DynamicClass.java", """
                    package example;
                    public class DynamicClass { public String getMessage() { return "dynamic!"; } }
                    """);

    @ParameterizedTest(name = "JavaActionContainerTests: support loading classes from the {0} classloader")
    @ValueSource(strings = {"local", "thread"})
    void classLoaders(String param) throws Exception {
        String jar = Archives.jar(DYNAMIC);
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "example.EntryPoint", true, null)).code());
            JsonObject a = new JsonObject();
            a.addProperty("classLoader", param);
            Reply r = c.run(runPayload(a));
            assertEquals(200, r.code());
            assertEquals(new JsonPrimitive("dynamic!"), r.body().get("message"));
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertEquals("", e);
        });
    }

    /**
     * A fat jar that ships an older Gson (2.9.0) in place of the runtime's copy. In a shared runtime
     * the jar's Gson is set aside and the function gets the runtime's copy, as OpenWhisk's Java
     * runtime (whose class loader asks its parent first) gives it: the function's own code may not
     * reflect on fields, and Gson does. In a runtime for trusted code its arguments and results
     * cross with its own Gson, JsonObject and Map entry points alike (the runtime's boundary code
     * must not need what only its own Gson has).
     */
    @Test
    @DisplayName("Java action: a jar that ships its own, older Gson")
    void jarShippingAnOlderGson() throws Exception {
        java.nio.file.Path older = java.nio.file.Path.of(System.getProperty("cpuslot.gson.older", "target/older-gson/gson-older.jar"));
        assertTrue(java.nio.file.Files.isRegularFile(older), "the build copies Gson 2.9.0 to " + older);
        String jar = Archives.jarBundling(Map.of("example/Old.java", """
                package example;
                import com.google.gson.*;
                import java.util.*;
                public class Old {
                    public static class Point { int x = 1; int y = 2; }
                    public record Pair(String k, int v) {}
                    static boolean older() { // Gson 2.11 added Strictness
                        try {
                            Class.forName("com.google.gson.Strictness");
                            return false;
                        } catch (ClassNotFoundException e) {
                            return true;
                        }
                    }
                    public static JsonObject main(JsonObject args) {
                        JsonObject r = new JsonObject();
                        r.add("args", args);
                        r.addProperty("older", older());
                        r.addProperty("half", 0.5);
                        return r;
                    }
                    public static Map<String, Object> map(Map<String, Object> args) {
                        Map<String, Object> r = new LinkedHashMap<>();
                        r.put("args", args);
                        r.put("older", older());
                        r.put("point", new Point()); // not plain JSON: Gson's data binding
                        return r;
                    }
                    public static Map<String, Object> record(Map<String, Object> args) {
                        Gson gson = new Gson();
                        Pair p = gson.fromJson("{'k':'a','v':3}", Pair.class); // binds through the record's components
                        Point q = gson.fromJson("{'x':5}", Point.class);
                        return Map.of("pair", p, "x", q.x, "text", gson.toJson(p));
                    }
                }
                """), older, "com/google/gson/");
        JsonObject args = json("{\"s\":\"x\",\"n\":[1,2.5,null],\"o\":{\"t\":true}}");
        with("java", c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Old", true, null)).code());
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(json("{\"args\":" + args + ",\"older\":false,\"half\":0.5}"), r.body());
        });
        with("java", c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Old#map", true, null)).code());
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(json("{\"args\":{\"s\":\"x\",\"n\":[1,2.5,null],\"o\":{\"t\":true}},\"older\":false,\"point\":{\"x\":1,\"y\":2}}"), r.body());
        });
        with("java", c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Old#record", true, null)).code());
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(json("{\"pair\":{\"k\":\"a\",\"v\":3},\"x\":5,\"text\":\"{\\\"k\\\":\\\"a\\\",\\\"v\\\":3}\"}"), r.body());
        });
        Map<String, String> trusted = env("CPUSLOT_JAVA_TRUSTED", "true");
        with("java", trusted, c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Old", true, null)).code());
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(json("{\"args\":" + args + ",\"older\":true,\"half\":0.5}"), r.body());
        });
        with("java", trusted, c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Old#map", true, null)).code());
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(json("{\"args\":{\"s\":\"x\",\"n\":[1,2.5,null],\"o\":{\"t\":true}},\"older\":true,\"point\":{\"x\":1,\"y\":2}}"), r.body());
        });
    }

    @Test
    @DisplayName("JavaActionContainerTests (newer runtimes): support a JsonArray main and result")
    void jsonArray() throws Exception {
        String jar = Archives.jar(Map.of("example/Arr.java", """
                package example;
                import com.google.gson.*;
                public class Arr {
                    public static JsonArray main(JsonArray args) {
                        JsonArray a = new JsonArray();
                        a.add("a"); a.add("b"); a.add(args.size());
                        return a;
                    }
                }
                """));
        withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Arr", true, null)).code());
            com.google.gson.JsonArray in = new com.google.gson.JsonArray();
            in.add(1);
            JsonObject p = new JsonObject();
            p.add("value", in);
            Reply r = c.run(p);
            assertEquals(200, r.code());
            assertEquals(com.google.gson.JsonParser.parseString("[\"a\",\"b\",1]"), r.raw());
        });
    }
}
