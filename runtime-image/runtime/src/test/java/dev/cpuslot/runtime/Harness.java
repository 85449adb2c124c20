package dev.cpuslot.runtime;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.slot.SlotClient;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Base64;
import java.util.HashMap;
import java.util.Map;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.stream.Stream;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.core.FunctionRuntime;
import dev.cpuslot.runtime.front.HttpFront;

/** Starts a runtime on an ephemeral port with captured stdout/stderr. */
final class Harness implements AutoCloseable {
    final ByteArrayOutputStream outBytes = new ByteArrayOutputStream(), errBytes = new ByteArrayOutputStream();
    final PrintStream out = new PrintStream(outBytes, true, StandardCharsets.UTF_8);
    final PrintStream err = new PrintStream(errBytes, true, StandardCharsets.UTF_8);
    /** The runtime's own lines (CPUSLOT_LOG), apart from the tenant's streams. */
    final ByteArrayOutputStream logBytes = new ByteArrayOutputStream();
    final PrintStream log = new PrintStream(logBytes, true, StandardCharsets.UTF_8);
    final FunctionRuntime rt;
    final HttpFront front;
    static final PrintStream REAL_OUT = System.out, REAL_ERR = System.err;
    final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    Harness(Map<String, String> env, SlotClient slots) throws IOException {
        // as deployed (deploy/openwhisk): OpenWhisk may send overlapping /run to one container
        // and no compiler slot: the tests count the invocations' leases (RuntimeWithAgentIT tests the compiler's)
        Map<String, String> e = new HashMap<>(Map.of("PORT", "0", "CPUSLOT_METRICS_PORT", "0", "__OW_ALLOW_CONCURRENT", "true",
                "CPUSLOT_COMPILER_QUOTA", "0"));
        e.putAll(env);
        Config cfg = Config.from(e);
        // functions print to the process's stdout/stderr: capture those too, as a container would
        System.setOut(out);
        System.setErr(err);
        Log.to(log);
        rt = new FunctionRuntime(cfg, new Metrics(), slots, out, err);
        front = new HttpFront(rt, 0, 0, false); // its clients are this process: the tests
        front.start();
    }

    Harness() throws IOException { this(Map.of(), null); }

    String stdout() { synchronized (outBytes) { return outBytes.toString(StandardCharsets.UTF_8); } }
    String stderr() { synchronized (errBytes) { return errBytes.toString(StandardCharsets.UTF_8); } }
    String log() { synchronized (logBytes) { return logBytes.toString(StandardCharsets.UTF_8); } }

    /**
     * The runtime's log once it contains {@code needle}: an activation's line is written after its
     * reply is sent. Gives up after 30 s (a hang, not a timing bound) and returns the log as it is.
     */
    String awaitLog(String needle) throws InterruptedException {
        long until = System.nanoTime() + 30_000_000_000L;
        String l;
        while (!(l = log()).contains(needle) && System.nanoTime() < until) Thread.sleep(5);
        return l;
    }

    record Resp(int status, JsonElement json, String raw, HttpResponse<String> http) {
        JsonObject obj() { return json.getAsJsonObject(); }
        String header(String h) { return http.headers().firstValue(h).orElse(null); }
    }

    Resp post(String path, String body) throws Exception { return post(path, body, Map.of()); }

    Resp post(String path, String body, Map<String, String> headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + front.port() + path))
                .timeout(Duration.ofSeconds(60))
                .POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8));
        headers.forEach(b::header);
        return send(b.build());
    }

    Resp postBytes(String path, byte[] body) throws Exception {
        return send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + front.port() + path))
                .timeout(Duration.ofSeconds(60)).POST(HttpRequest.BodyPublishers.ofByteArray(body)).build());
    }

    Resp send(HttpRequest req) throws Exception {
        HttpResponse<String> r = http.send(req, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        JsonElement j = null;
        try {
            j = JsonParser.parseString(r.body());
        } catch (RuntimeException ignored) {
        }
        return new Resp(r.statusCode(), j, r.body(), r);
    }

    String metrics() throws Exception {
        return http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + front.metricsPort() + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString()).body();
    }

    /** A jar of the test functions (package testfns), built from the compiled test classes. */
    static byte[] testJar() throws IOException {
        Path classes = Path.of("target/test-classes");
        var bytes = new java.io.ByteArrayOutputStream();
        try (JarOutputStream jar = new JarOutputStream(bytes); Stream<Path> s = Files.walk(classes.resolve("testfns"))) {
            for (Path p : (Iterable<Path>) s.filter(Files::isRegularFile)::iterator) {
                jar.putNextEntry(new JarEntry(classes.relativize(p).toString().replace('\\', '/')));
                jar.write(Files.readAllBytes(p));
                jar.closeEntry();
            }
        }
        return bytes.toByteArray();
    }

    static String initJava(String main) throws IOException {
        JsonObject v = new JsonObject();
        v.addProperty("main", main);
        v.addProperty("binary", true);
        v.addProperty("code", Base64.getEncoder().encodeToString(testJar()));
        JsonObject b = new JsonObject();
        b.add("value", v);
        return b.toString();
    }

    static String initCode(String code, String main, Map<String, String> env) {
        JsonObject v = new JsonObject();
        v.addProperty("main", main);
        v.addProperty("binary", false);
        v.addProperty("code", code);
        JsonObject e = new JsonObject();
        env.forEach(e::addProperty);
        v.add("env", e);
        JsonObject b = new JsonObject();
        b.add("value", v);
        return b.toString();
    }

    static String run(JsonObject value) { return run(value, Map.of()); }

    static String run(JsonObject value, Map<String, String> activation) {
        JsonObject b = new JsonObject();
        b.add("value", value);
        activation.forEach(b::addProperty);
        return b.toString();
    }

    static JsonObject json(String s) { return JsonParser.parseString(s).getAsJsonObject(); }

    /** The ACQUIREs the agent got for calls, not for a function's load (its own slot, invocation "load-N"). */
    static long callAcquires(dev.cpuslot.slot.FakeAgent agent) {
        return agent.received.stream().filter(m -> m instanceof dev.cpuslot.slot.Protocol.Acquire a && !a.invocation().startsWith("load-")).count();
    }

    /**
     * Waits until the agent got the RELEASE of the function's load (sent as the load ends, before
     * its answer, but on a connection of its own) and returns its ACQUIRE.
     */
    static dev.cpuslot.slot.Protocol.Acquire loadReleased(dev.cpuslot.slot.FakeAgent agent) throws InterruptedException {
        long until = System.nanoTime() + 30_000_000_000L;
        while (agent.count(dev.cpuslot.slot.Protocol.Release.class) < 1 && System.nanoTime() - until < 0) Thread.sleep(5);
        org.junit.jupiter.api.Assertions.assertEquals(1, agent.count(dev.cpuslot.slot.Protocol.Release.class), "the load's slot given back: " + agent.received);
        return agent.received.stream().filter(m -> m instanceof dev.cpuslot.slot.Protocol.Acquire a && a.invocation().startsWith("load-"))
                .map(m -> (dev.cpuslot.slot.Protocol.Acquire) m).findFirst().orElseThrow();
    }

    /** The function workers sleeping in testfns.Waits now. */
    static java.util.List<Thread> workersInWaits() {
        java.util.List<Thread> out = new java.util.ArrayList<>();
        for (Map.Entry<Thread, StackTraceElement[]> e : Thread.getAllStackTraces().entrySet()) {
            if (e.getKey().getName().startsWith("fn-") && e.getKey().getState() == Thread.State.TIMED_WAITING
                    && java.util.stream.Stream.of(e.getValue()).anyMatch(f -> f.getClassName().equals("testfns.Waits"))) out.add(e.getKey());
        }
        return out;
    }

    /** The kernel ids of this process's threads whose kernel name (comm) passes {@code name}. */
    static java.util.List<String> tids(java.util.function.Predicate<String> name) {
        java.util.List<String> out = new java.util.ArrayList<>();
        try (java.util.stream.Stream<java.nio.file.Path> ts = java.nio.file.Files.list(java.nio.file.Path.of("/proc/self/task"))) {
            for (java.nio.file.Path t : ts.toList()) {
                try {
                    if (name.test(java.nio.file.Files.readString(t.resolve("comm")).strip())) out.add(t.getFileName().toString());
                } catch (IOException gone) { // the thread ended while listed
                }
            }
        } catch (IOException e) {
            throw new IllegalStateException(e);
        }
        return out;
    }

    @Override
    public void close() {
        front.close();
        rt.close();
        System.setOut(REAL_OUT);
        System.setErr(REAL_ERR);
    }
}
