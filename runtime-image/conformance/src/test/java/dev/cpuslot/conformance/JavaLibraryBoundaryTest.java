package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * The runtime's own libraries and state are not reachable from a Java function, by construction:
 * the function's class loader sees only the JDK, the guard's entry points its rewritten code
 * calls and a copy of its own of the function API (Gson, the chain API), so a library's
 * reflection acts within the function; the runtime's metrics registry (prometheus-metrics-core)
 * does not load. Against the runtime as its image starts it.
 */
@DisplayName("Java function: the runtime's libraries")
class JavaLibraryBoundaryTest {

    /**
     * Gson is the function's own copy: its reflection cannot read or write the guard's private
     * statics. (Before: the runtime's Gson, shared with every function, read the guard's thread
     * limit and could set it to 0.)
     */
    @Test
    void gsonIsTheFunctionsOwnAndCannotReachTheGuard() throws Exception {
        String jar = JavaContainmentTest.probe("""
                JsonObject r = new JsonObject();
                r.addProperty("ownGson", com.google.gson.Gson.class.getClassLoader() == Probe.class.getClassLoader());
                try {
                    Class<?> g = Class.forName("dev.cpuslot.runtime.guard.ThreadBudget");
                    com.google.gson.Gson gson = new com.google.gson.GsonBuilder().excludeFieldsWithModifiers()
                        .setExclusionStrategies(new com.google.gson.ExclusionStrategy() {
                            public boolean shouldSkipField(com.google.gson.FieldAttributes f) { return !f.getName().equals("maxThreads"); }
                            public boolean shouldSkipClass(Class<?> c) { return false; }
                        }).create();
                    Object o = gson.fromJson("{\\"maxThreads\\":3}", g);
                    r.addProperty("leak", gson.toJson(o));
                } catch (Throwable e) {
                    r.addProperty("refused", e.toString());
                }
                for (String cls : new String[]{"dev.cpuslot.runtime.Main", "dev.cpuslot.runtime.front.HttpFront",
                        "dev.cpuslot.runtime.core.FunctionRuntime", "dev.cpuslot.runtime.chain.LocalBus",
                        "dev.cpuslot.runtime.lang.PolyglotFunction", "dev.cpuslot.runtime.exec.FunctionPool",
                        "dev.cpuslot.runtime.base.Config", "dev.cpuslot.slot.SlotClient",
                        "io.prometheus.metrics.model.registry.PrometheusRegistry", "io.prometheus.metrics.core.metrics.Counter"}) {
                    try {
                        Class.forName(cls);
                        r.addProperty("sees " + cls, true);
                    } catch (Throwable e) {
                    }
                }
                return r;""");
        with("java", c -> {
            assertEquals(200, c.init(JavaContainmentTest.init(jar)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            JsonObject b = r.body();
            assertFalse(b.has("leak"), "the function's Gson read and wrote the guard's statics: " + b);
            assertTrue(b.get("ownGson").getAsBoolean(), "the function's Gson is the runtime's: " + b);
            // every package of the runtime's, along the invocation path
            for (String cls : new String[]{"Main", "front.HttpFront", "core.FunctionRuntime", "chain.LocalBus",
                    "lang.PolyglotFunction", "exec.FunctionPool", "base.Config"})
                assertFalse(b.has("sees dev.cpuslot.runtime." + cls), b.toString());
            assertFalse(b.has("sees dev.cpuslot.slot.SlotClient"), b.toString());
            // the runtime's metrics registry: a function that reached it could forge or inflate any series
            assertFalse(b.has("sees io.prometheus.metrics.model.registry.PrometheusRegistry"), b.toString());
            assertFalse(b.has("sees io.prometheus.metrics.core.metrics.Counter"), b.toString());
        });
    }

    /**
     * Gson on each of issue 30's other targets, from mallory's function in a runtime of several
     * owners: the guard's protected-file and temporary-directory lists (FileAccess), its memory
     * share (HeapShare), the container's stdout that activations write through (ActivationOutput),
     * the in-flight activations (Activations), alice's function's private static, and alice's class
     * bytes. Gson reads and writes none of them, and alice's function still answers its own value.
     * (Before: the runtime's shared Gson read and wrote every one.)
     */
    @Test
    void gsonReachesNoTargetOfTheRuntimeOrOfAnotherOwner() throws Exception {
        String alice = Archives.jar(java.util.Map.of("example/Secret.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Secret {
                    private static String secret = "alice's";
                    public static JsonObject main(JsonObject a) {
                        JsonObject r = new JsonObject();
                        r.addProperty("secret", secret);
                        return r;
                    }
                }
                """));
        String mallory = JavaContainmentTest.probe("""
                JsonObject r = new JsonObject();
                com.google.gson.Gson gson = new com.google.gson.GsonBuilder().excludeFieldsWithModifiers().create();
                for (String name : new String[]{"dev.cpuslot.runtime.guard.FileAccess", "dev.cpuslot.runtime.guard.HeapShare",
                        "dev.cpuslot.runtime.guard.ActivationOutput", "dev.cpuslot.runtime.guard.Activations", "example.Secret"}) {
                    try {
                        Class<?> c = Class.forName(name);
                        r.addProperty("leak read " + name, gson.toJson(gson.fromJson("{}", c)));
                        gson.fromJson("{\\"secret\\":\\"mallory's\\"}", c);
                        r.addProperty("leak write " + name, true);
                    } catch (Throwable e) {
                        r.addProperty("refused " + name, e.getClass().getName());
                    }
                }
                for (ClassLoader l : new ClassLoader[]{Probe.class.getClassLoader(), ClassLoader.getSystemClassLoader(),
                        Thread.currentThread().getContextClassLoader()}) {
                    try (InputStream in = l.getResourceAsStream("example/Secret.class")) {
                        if (in != null) r.addProperty("leak bytes " + l, in.readAllBytes().length);
                    } catch (Throwable e) {
                        r.addProperty("refused bytes " + l, e.getClass().getName());
                    }
                }
                return r;""");
        with("java", env("CPUSLOT_OWNER", "*"), c -> {
            java.nio.file.Path aliceJar = JavaContainmentTest.jarFile(c, "alice", alice);
            assertEquals(200, c.post("/register?name=secret&language=java&entryPoint=example.Secret&owner=alice&url=" + aliceJar.toUri(), "").code());
            assertEquals(200, JavaContainmentTest.register(c, "gson", JavaContainmentTest.jarFile(c, "gson", mallory), "mallory").code());
            assertEquals("alice's", JavaContainmentTest.invoke(c, "secret").body().getAsJsonObject("result").get("secret").getAsString());
            Reply r = JavaContainmentTest.invoke(c, "gson");
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            JsonObject b = r.body().getAsJsonObject("result");
            System.out.println("mallory's Gson: " + b);
            for (String k : b.keySet()) assertFalse(k.startsWith("leak"), "mallory's Gson reached " + k + ": " + b);
            assertEquals(5, b.keySet().stream().filter(k -> k.startsWith("refused dev.") || k.startsWith("refused example.")).count(), b.toString());
            Reply after = JavaContainmentTest.invoke(c, "secret");
            assertEquals("alice's", after.body().getAsJsonObject("result").get("secret").getAsString(), String.valueOf(after.raw()));
        });
    }
}
