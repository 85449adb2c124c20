package dev.cpuslot.it;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.runtime.Relay;

import java.io.IOException;
import java.net.ServerSocket;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The runtime JVM (runtime/target/runtime-*.jar) as a child process. When procsFiles are given
 * the process writes its own pid to them (a tiny sh wrapper) before exec'ing java, so the JVM
 * lives in that cgroup from its first instruction.
 */
final class RuntimeProc implements AutoCloseable {
    static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();

    final int port, metricsPort;
    final Path log;
    private final Process process;

    /** One invocation's answer. */
    record Reply(int status, String body, Map<String, String> headers) {
        JsonObject json() { return JsonParser.parseString(body).getAsJsonObject(); }
        String header(String name) { return headers.get(name.toLowerCase()); }
        long headerLong(String name) {
            String v = header(name);
            if (v == null) throw new AssertionError("no " + name + " header; headers " + headers + " body " + body);
            return Long.parseLong(v);
        }
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    static String javaCommand() {
        return ProcessHandle.current().info().command().orElse(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    }

    RuntimeProc(Path jar, Map<String, String> env, List<Path> procsFiles, Path log) throws Exception {
        // guest code compiled as in the image (image/jvm-options-jit): Graal beside the jar, in compiler/
        this(List.of(javaCommand(), "-Xmx512m", "-XX:+UseSerialGC",
                "-XX:+UnlockExperimentalVMOptions", "-XX:+EnableJVMCI", "--upgrade-module-path=" + jar.toAbsolutePath().getParent().resolve("compiler"),
                "-jar", jar.toString()), env, procsFiles, log);
    }

    /** Any command that starts the runtime (e.g. an image's entrypoint under chroot). */
    RuntimeProc(List<String> java, Map<String, String> env, List<Path> procsFiles, Path log) throws Exception {
        this.port = freePort();
        this.metricsPort = freePort();
        this.log = log;
        List<String> cmd = new ArrayList<>();
        if (procsFiles.isEmpty()) {
            cmd.addAll(java);
        } else {
            // sh writes its pid ($$) to each cgroup.procs, then becomes java (same pid)
            StringBuilder sh = new StringBuilder();
            for (Path p : procsFiles) sh.append("echo $$ > '").append(p).append("' || exit 97; ");
            sh.append("exec \"$@\"");
            cmd.addAll(List.of("/bin/sh", "-c", sh.toString(), "sh"));
            cmd.addAll(java);
        }
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile());
        pb.environment().put("PORT", Integer.toString(port));
        pb.environment().put("CPUSLOT_METRICS_PORT", Integer.toString(metricsPort));
        pb.environment().put("CPUSLOT_LOG", "stderr"); // the runtime's own lines into this process's log file too
        // no compiler slot unless a test asks for one: the tests count the invocations' leases
        pb.environment().put("CPUSLOT_COMPILER_QUOTA", "0");
        pb.environment().putAll(env);
        process = pb.start();
        long until = System.nanoTime() + 60_000_000_000L;
        while (System.nanoTime() < until) {
            if (!process.isAlive()) throw new IllegalStateException("runtime exited " + process.exitValue() + ":\n" + Files.readString(log));
            try {
                if (metricsText().length() > 0) return;
            } catch (IOException notYet) {
            }
            Thread.sleep(100);
        }
        throw new IllegalStateException("runtime not up within 60 s:\n" + Files.readString(log));
    }

    long pid() { return process.pid(); }

    /** Hydra /register of a Java function from a jar file, with an init-time quota (or none). */
    void register(String name, String entryPoint, Path jar, String quota) throws Exception {
        String q = "name=" + enc(name) + "&language=java&entryPoint=" + enc(entryPoint) + "&url=" + enc(jar.toUri().toString())
                + (quota == null ? "" : "&quota=" + enc(quota));
        HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(URI.create(base() + "/register?" + q))
                .POST(HttpRequest.BodyPublishers.noBody()).timeout(Duration.ofSeconds(30)).build(), HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != 200) throw new IllegalStateException("register " + name + ": " + r.statusCode() + " " + r.body());
    }

    /** Hydra /register of a JavaScript or Python function from a file, with an init-time quota (or none). */
    void registerText(String name, String language, Path file, String quota) throws Exception {
        String q = "name=" + enc(name) + "&language=" + enc(language) + "&entryPoint=main&url=" + enc(file.toUri().toString())
                + (quota == null ? "" : "&quota=" + enc(quota));
        HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(URI.create(base() + "/register?" + q))
                .POST(HttpRequest.BodyPublishers.noBody()).timeout(Duration.ofSeconds(120)).build(), HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() != 200) throw new IllegalStateException("register " + name + ": " + r.statusCode() + " " + r.body());
    }

    /**
     * Request header that asks for the invocation's CPU usage in its answer (X-Cpuslot-Cpu-Ns,
     * X-Cpuslot-Throttled-Ns): the tests' requests send it unless they say otherwise.
     */
    static final String USAGE_HEADER = "X-Cpuslot-Usage";

    /** POST of a JSON body to a path (OpenWhisk /init, /run). */
    Reply post(String path, String json) throws IOException, InterruptedException {
        HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(URI.create(base() + path)).header(USAGE_HEADER, "reply")
                .POST(HttpRequest.BodyPublishers.ofString(json)).timeout(Duration.ofSeconds(120)).build(),
                HttpResponse.BodyHandlers.ofString());
        Map<String, String> h = new HashMap<>();
        r.headers().map().forEach((k, v) -> h.put(k.toLowerCase(), v.isEmpty() ? "" : v.get(0)));
        return new Reply(r.statusCode(), r.body(), h);
    }

    /** Hydra invoke: POST / {"name", "arguments": "<JSON string>"}. */
    Reply invoke(String name, String argumentsJson) throws IOException, InterruptedException {
        return invoke(name, argumentsJson, true);
    }

    /** Hydra invoke; {@code askUsage} false: the answer carries no usage (read after the reply). */
    Reply invoke(String name, String argumentsJson, boolean askUsage) throws IOException, InterruptedException {
        JsonObject req = new JsonObject();
        req.addProperty("name", name);
        req.addProperty("arguments", argumentsJson);
        HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(URI.create(base() + "/")).header(USAGE_HEADER, askUsage ? "reply" : "no")
                .POST(HttpRequest.BodyPublishers.ofString(req.toString())).timeout(Duration.ofSeconds(120)).build(),
                HttpResponse.BodyHandlers.ofString());
        Map<String, String> h = new HashMap<>();
        r.headers().map().forEach((k, v) -> h.put(k.toLowerCase(), v.isEmpty() ? "" : v.get(0)));
        return new Reply(r.statusCode(), r.body(), h);
    }

    String metricsText() throws IOException, InterruptedException {
        return HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + metricsPort + "/metrics")).timeout(Duration.ofSeconds(5)).build(),
                HttpResponse.BodyHandlers.ofString()).body();
    }

    Map<String, Double> metrics() throws IOException, InterruptedException { return Prom.parse(metricsText()); }

    /**
     * The metrics once the slot client's {@code event} has counted at least {@code atLeast} (a
     * RELEASE goes after the answer it ends), or after 30 s as they are.
     */
    Map<String, Double> metricsOnce(String event, double atLeast) throws IOException, InterruptedException {
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        Map<String, Double> m = metrics();
        while (event(m, event) < atLeast && System.nanoTime() - until < 0) {
            Thread.sleep(10);
            m = metrics();
        }
        return m;
    }

    /** Slot client counter (cpuslot_slot_client_events_total{event=...}). */
    static double event(Map<String, Double> m, String event) {
        return Prom.get(m, "cpuslot_slot_client_events_total{event=\"" + event + "\"}");
    }

    /** Thread ids of the process whose name starts with prefix. */
    List<Long> threads(String prefix) throws IOException {
        List<Long> l = new ArrayList<>();
        try (var s = Files.list(Path.of("/proc/" + pid() + "/task"))) {
            for (Path t : (Iterable<Path>) s::iterator) {
                try {
                    if (Files.readString(t.resolve("comm")).trim().startsWith(prefix)) l.add(Long.parseLong(t.getFileName().toString()));
                } catch (IOException gone) {
                }
            }
        }
        return l;
    }

    String base() { return "http://127.0.0.1:" + port; }

    static String enc(String s) { return URLEncoder.encode(s, StandardCharsets.UTF_8); }

    private Relay relay;

    /**
     * The port of a relay to the runtime in another process (the test's), as Knative's
     * queue-proxy: for a function that calls its runtime's HTTP path, which answers no connection
     * of the runtime's own process.
     */
    synchronized int relayPort() throws IOException {
        if (relay == null) relay = new Relay(port);
        return relay.port();
    }

    @Override
    public void close() throws InterruptedException {
        synchronized (this) {
            if (relay != null) relay.close();
        }
        process.destroy();
        if (!process.waitFor(10, TimeUnit.SECONDS)) {
            process.destroyForcibly();
            process.waitFor(10, TimeUnit.SECONDS);
        }
    }
}
