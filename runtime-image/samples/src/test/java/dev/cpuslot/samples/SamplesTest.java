package dev.cpuslot.samples;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.sun.net.httpserver.HttpServer;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.core.FunctionRuntime;
import dev.cpuslot.runtime.front.HydraAdapter;
import dev.cpuslot.runtime.base.Metrics;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.HexFormat;
import java.util.Map;
import java.util.Random;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.*;

/** Deploys every sample into an in-process runtime (Hydra register) and checks its answer. */
class SamplesTest {
    static FunctionRuntime rt;
    static HydraAdapter hydra;
    static HttpServer local;
    static byte[] file;

    @BeforeAll
    static void setUp() throws Exception {
        rt = new FunctionRuntime(Config.from(Map.of()), new Metrics(), null, System.out, System.err);
        hydra = new HydraAdapter(rt);
        file = new byte[3 * 1024 * 1024 + 17];
        new Random(42).nextBytes(file);
        local = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 16);
        local.createContext("/file.bin", ex -> {
            ex.sendResponseHeaders(200, file.length);
            ex.getResponseBody().write(file);
            ex.close();
        });
        local.createContext("/kv/", ex -> {
            String key = ex.getRequestURI().getPath().substring("/kv/".length());
            byte[] b = key.equals("colour") ? "{\"v\":\"blue\"}".getBytes(StandardCharsets.UTF_8) : new byte[0];
            ex.sendResponseHeaders(b.length > 0 ? 200 : 404, b.length > 0 ? b.length : -1);
            if (b.length > 0) ex.getResponseBody().write(b);
            ex.close();
        });
        local.start();
        byte[] jar = samplesJar();
        for (String c : new String[]{"HelloWorld", "Fibonacci", "FileHash", "VideoDownscale", "RestKv", "CpuBurn"}) {
            var r = hydra.register(Map.of("name", c, "language", "java", "entryPoint", "dev.cpuslot.samples." + c), jar);
            assertEquals(200, r.status(), r.body().toString());
        }
        for (String lang : new String[]{"js", "python"}) {
            for (String f : new String[]{"hello", "fib"}) {
                Path src = Path.of("src/main/" + lang + "/" + f + (lang.equals("js") ? ".js" : ".py"));
                var r = hydra.register(Map.of("name", lang + "-" + f, "language", lang.equals("js") ? "javascript" : "python",
                        "entryPoint", "main"), Files.readAllBytes(src));
                assertEquals(200, r.status(), r.body().toString());
            }
        }
    }

    @AfterAll
    static void tearDown() {
        local.stop(0);
        rt.close();
    }

    static byte[] samplesJar() throws IOException {
        Path classes = Path.of("target/classes");
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        try (JarOutputStream jar = new JarOutputStream(b); Stream<Path> s = Files.walk(classes)) {
            for (Path p : (Iterable<Path>) s.filter(p -> p.toString().endsWith(".class"))::iterator) {
                jar.putNextEntry(new JarEntry(classes.relativize(p).toString().replace('\\', '/')));
                jar.write(Files.readAllBytes(p));
                jar.closeEntry();
            }
        }
        return b.toByteArray();
    }

    static JsonObject invoke(String name, String args) {
        JsonObject req = new JsonObject();
        req.addProperty("name", name);
        req.addProperty("arguments", args);
        var r = hydra.invoke(req, null, false, false);
        assertEquals(200, r.status(), name + ": " + r.body());
        return r.body().getAsJsonObject().getAsJsonObject("result");
    }

    String base() { return "http://127.0.0.1:" + local.getAddress().getPort(); }

    @Test
    void helloWorld() {
        assertEquals("Hello cpuslot!", invoke("HelloWorld", "{\"name\":\"cpuslot\"}").get("greeting").getAsString());
        assertEquals("Hello cpuslot!", invoke("js-hello", "{\"name\":\"cpuslot\"}").get("greeting").getAsString());
        assertEquals("Hello cpuslot!", invoke("python-hello", "{\"name\":\"cpuslot\"}").get("greeting").getAsString());
    }

    @Test
    void fibonacci() {
        assertEquals(832040, invoke("Fibonacci", "{\"n\":30}").get("fib").getAsLong());
        assertEquals(75025, invoke("js-fib", "{\"n\":25}").get("fib").getAsLong());
        assertEquals(6765, invoke("python-fib", "{\"n\":20}").get("fib").getAsLong());
    }

    @Test
    void cpuBurnRunsForItsWallTimeOnEveryThread() {
        JsonObject one = invoke("CpuBurn", "{\"ms\":50}");
        assertEquals(1, one.get("threads").getAsInt());
        assertTrue(one.get("wall_ms").getAsDouble() >= 50, one.toString());
        assertTrue(one.get("iterations").getAsLong() > 0, one.toString());
        JsonObject four = invoke("CpuBurn", "{\"ms\":50,\"threads\":4}");
        assertEquals(4, four.get("threads").getAsInt());
        assertTrue(four.get("wall_ms").getAsDouble() >= 50, four.toString());
    }

    @Test
    void fileHashing() throws Exception {
        JsonObject r = invoke("FileHash", "{\"url\":\"" + base() + "/file.bin\"}");
        assertEquals(file.length, r.get("bytes").getAsLong());
        assertEquals(HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(file)), r.get("sha256").getAsString());
    }

    @Test
    void videoDownscale() {
        JsonObject r = invoke("VideoDownscale", "{\"width\":64,\"height\":32,\"frames\":3,\"factor\":2}");
        assertEquals("32x16", r.get("output").getAsString());
        JsonObject again = invoke("VideoDownscale", "{\"width\":64,\"height\":32,\"frames\":3,\"factor\":2}");
        assertEquals(r.get("sha256"), again.get("sha256"), "deterministic");
        assertNotEquals(r.get("sha256"), invoke("VideoDownscale", "{\"width\":64,\"height\":32,\"frames\":4,\"factor\":2}").get("sha256"));
    }

    @Test
    void restKeyValue() {
        JsonObject r = invoke("RestKv", "{\"kv\":\"" + base() + "/kv\",\"key\":\"colour\"}");
        assertEquals(JsonParser.parseString("{\"v\":\"blue\"}"), r.get("value"));
        assertEquals(404, invoke("RestKv", "{\"kv\":\"" + base() + "/kv\",\"key\":\"missing\"}").get("status").getAsInt());
    }
}
