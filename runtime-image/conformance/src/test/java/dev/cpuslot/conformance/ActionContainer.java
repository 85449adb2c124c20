package dev.cpuslot.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.runtime.Relay;

import java.io.IOException;
import java.net.URI;
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
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * One action container as OpenWhisk's test harness sees it: a fresh runtime process started as
 * the image starts it (JavaScript and Python, as root: {@link ImageRoot}; else the JDK's java with
 * the image's JVM options, {@code image/jvm-options}) and kind ({@code CPUSLOT_LANGUAGE}, as
 * the per-kind image sets it), a clean environment (no locale, as in a container) plus the
 * container env the case gives, {@code POST /init} and {@code /run}, and its stdout/stderr from
 * process start to kill.
 */
final class ActionContainer implements AutoCloseable {
    static final String SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX";
    /** Long enough for a cold Python /init on a loaded 2-core machine; a hang fails with the logs. */
    static final Duration REQUEST_TIMEOUT = Duration.ofSeconds(Long.getLong("cpuslot.conformance.timeout.s", 300));

    private static final AtomicLong IDS = new AtomicLong();
    private static final Pattern LISTENING = Pattern.compile("listening on :(\\d+)");

    /** A reply: status and the body as a JSON object (null when it is not one). */
    record Reply(int code, JsonObject body, JsonElement raw, java.net.http.HttpHeaders headers) {
        /** A response header, or null. */
        String header(String name) { return headers == null ? null : headers.firstValue(name).orElse(null); }
    }

    final Path dir, stdout, stderr, runtimeLog;
    private final Process proc;
    private final int port;
    /** Started from the image's root with its AOT cache (ImageRoot). */
    final boolean aot;
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
    private String out, err;

    private ActionContainer(String kind, Map<String, String> env) throws Exception { this(kind, env, prop("cpuslot.runtime.jar")); }

    /** @param jar the runtime's jar (another build's, for a side-by-side comparison) */
    private ActionContainer(String kind, Map<String, String> env, String jar) throws Exception {
        Path work = Path.of(System.getProperty("cpuslot.work", "target/conformance"));
        dir = work.resolve(kind + "-" + ProcessHandle.current().pid() + "-" + IDS.incrementAndGet());
        Files.createDirectories(dir);
        stdout = dir.resolve("stdout");
        stderr = dir.resolve("stderr");
        runtimeLog = dir.resolve("runtime.log");
        // A container's own /tmp: the runtime's temporary files (an action's jar) stay beside its
        // logs, not in the machine's /tmp, when the case kills it as docker kill does.
        Path tmp = Files.createDirectories(dir.resolve("tmp"));
        Map<String, String> e = new java.util.LinkedHashMap<>();
        e.put("PORT", "0");
        e.put("CPUSLOT_METRICS_PORT", "-1");
        e.put("CPUSLOT_LANGUAGE", kind);
        e.put("CPUSLOT_LOG", "file:" + runtimeLog);
        e.putAll(env);
        // JavaScript and Python as the image starts them (its JRE, module options and AOT cache,
        // under chroot as nobody); the java kind's image has no AOT cache, and another build's jar
        // is no image: those with the JDK
        ImageRoot image = kind.equals("java") || !jar.equals(prop("cpuslot.runtime.jar")) ? null : ImageRoot.get();
        aot = image != null;
        ProcessBuilder pb;
        if (image != null) {
            for (Path p : List.of(dir, tmp)) Files.setPosixFilePermissions(p, java.nio.file.attribute.PosixFilePermissions.fromString("rwxrwxrwx"));
            pb = new ProcessBuilder(image.command(e, List.of("-Djava.io.tmpdir=" + tmp)));
            pb.environment().clear(); // chroot_run passes only the variables named
        } else {
            List<String> cmd = new ArrayList<>();
            cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
            cmd.addAll(imageJvmOptions(kind));
            cmd.add("-Djava.io.tmpdir=" + tmp);
            cmd.add("-jar");
            cmd.add(jar);
            pb = new ProcessBuilder(cmd);
            Map<String, String> pe = pb.environment();
            pe.clear(); // a container's environment: no locale, nothing from the test JVM
            pe.put("PATH", "/usr/bin:/bin");
            pe.putAll(e);
        }
        proc = pb.directory(dir.toFile()).redirectOutput(stdout.toFile()).redirectError(stderr.toFile()).start();
        port = awaitPort();
        if (aot) checkAotCache();
    }

    /** The JVM maps the image's AOT cache, and said nothing of it (a refused cache is unmapped, and the JVM says why). */
    private void checkAotCache() throws IOException {
        String maps = Files.readString(Path.of("/proc/" + proc.pid() + "/maps"));
        String said = Files.readString(stdout) + Files.readString(stderr);
        if (!maps.contains("/opt/cpuslot/runtime.aot") || said.contains("[aot]")) {
            proc.destroyForcibly();
            fail("the runtime did not take the image's AOT cache; stdout and stderr:\n" + said);
        }
    }

    /**
     * The image's JVM options for a kind (image/jvm-options, plus image/jvm-options-jit unless
     * the kind is java, as build-image.sh does), with the image's /opt/cpuslot/ (runtime.jar,
     * compiler/) read as the runtime's build directory, which holds the same files.
     */
    static List<String> imageJvmOptions(String kind) throws IOException {
        List<Path> files = new ArrayList<>(List.of(Path.of(prop("cpuslot.jvm.options"))));
        if (!kind.equals("java")) files.add(Path.of(prop("cpuslot.jvm.options.jit")));
        String home = Path.of(prop("cpuslot.runtime.jar")).toAbsolutePath().getParent() + "/";
        List<String> opts = new ArrayList<>();
        for (Path f : files)
            for (String l : Files.readAllLines(f)) if (!l.isBlank()) opts.add(l.strip().replace("/opt/cpuslot/", home));
        return opts;
    }

    private static String prop(String k) {
        String v = System.getProperty(k);
        if (v == null) throw new IllegalStateException("system property " + k + " is not set (run through Maven)");
        return v;
    }

    /** The runtime listens on an ephemeral port and names it in its own log. */
    private int awaitPort() throws Exception {
        long until = System.nanoTime() + REQUEST_TIMEOUT.toNanos();
        while (System.nanoTime() < until) {
            for (Path p : List.of(runtimeLog, stderr)) { // a runtime without CPUSLOT_LOG names it on stderr
                if (!Files.exists(p)) continue;
                Matcher m = LISTENING.matcher(Files.readString(p));
                if (m.find()) return Integer.parseInt(m.group(1));
            }
            if (!proc.isAlive()) fail("the runtime exited with " + proc.exitValue() + " before listening; stderr:\n" + Files.readString(stderr));
            Thread.sleep(20);
        }
        proc.destroyForcibly();
        fail("the runtime did not listen within " + REQUEST_TIMEOUT + "; stderr:\n" + Files.readString(stderr));
        return -1;
    }

    /** Runs {@code code} against a fresh container of {@code kind}; returns its (stdout, stderr). */
    static String[] with(String kind, Map<String, String> env, ContainerCode code) throws Exception {
        return with(kind, env, prop("cpuslot.runtime.jar"), code);
    }

    /** The same with the runtime of another build (its jar). */
    static String[] with(String kind, Map<String, String> env, String jar, ContainerCode code) throws Exception {
        try (ActionContainer c = new ActionContainer(kind, env, jar)) {
            try {
                code.accept(c);
                c.stopsOnSigterm();
            } catch (AssertionError | Exception t) {
                c.kill();
                throw new AssertionError(t.getMessage() + "\n--- stdout:\n" + c.out + "\n--- stderr:\n" + c.err
                        + "\n--- runtime log: " + c.runtimeLog, t);
            }
            c.kill();
            return new String[]{c.out, c.err};
        }
    }

    static String[] with(String kind, ContainerCode code) throws Exception { return with(kind, Map.of(), code); }

    @FunctionalInterface
    interface ContainerCode { void accept(ActionContainer c) throws Exception; }

    Reply init(JsonObject payload) throws Exception { return post("/init", payload.toString()); }

    Reply run(JsonObject payload) throws Exception { return post("/run", payload.toString()); }

    /** The requests at the same time, each on its own connection (as the invoker's connection pool). */
    List<Reply> runMultiple(List<JsonObject> payloads) throws Exception {
        try (ExecutorService ex = Executors.newVirtualThreadPerTaskExecutor()) {
            List<Future<Reply>> fs = new ArrayList<>();
            for (JsonObject p : payloads) fs.add(ex.submit(() -> post("/run", p.toString())));
            List<Reply> rs = new ArrayList<>();
            for (Future<Reply> f : fs) rs.add(f.get(REQUEST_TIMEOUT.toSeconds() * 2, TimeUnit.SECONDS));
            return rs;
        }
    }

    /** A POST of any body to a path with its query (Hydra /register, invoke). */
    Reply post(String path, String body) throws Exception { return post(path, body, Map.of()); }

    /** The same with request headers. */
    Reply post(String path, String body, Map<String, String> headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path)).timeout(REQUEST_TIMEOUT)
                .header("Content-Type", "application/json");
        headers.forEach(b::header);
        HttpRequest req = b.POST(HttpRequest.BodyPublishers.ofString(body, StandardCharsets.UTF_8)).build();
        HttpResponse<String> r;
        try {
            r = http.send(req, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        } catch (java.net.http.HttpTimeoutException e) {
            throw new AssertionError(path + " got no answer within " + REQUEST_TIMEOUT + " (runtime alive: " + proc.isAlive() + ")", e);
        }
        JsonObject o = null;
        JsonElement j = null;
        try {
            j = JsonParser.parseString(r.body());
            if (j.isJsonObject()) o = j.getAsJsonObject();
        } catch (RuntimeException ignored) {
        }
        return new Reply(r.statusCode(), o, j, r.headers());
    }

    /** A GET (/ready). */
    Reply get(String path) throws Exception {
        HttpRequest req = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path)).timeout(REQUEST_TIMEOUT).GET().build();
        HttpResponse<String> r = http.send(req, HttpResponse.BodyHandlers.ofString(StandardCharsets.UTF_8));
        JsonElement j = null;
        try {
            j = JsonParser.parseString(r.body());
        } catch (RuntimeException ignored) {
        }
        return new Reply(r.statusCode(), j != null && j.isJsonObject() ? j.getAsJsonObject() : null, j, r.headers());
    }

    boolean alive() { return proc.isAlive(); }

    /** As Kubernetes ends a pod's container: SIGTERM. */
    void terminate() { proc.destroy(); }

    /** The exit code, once the process has exited; fails naming what it waited for when it has not within {@code d}. */
    int awaitExit(Duration d, String what) throws Exception {
        if (!proc.waitFor(d.toMillis(), TimeUnit.MILLISECONDS)) fail("the runtime did not exit within " + d + " " + what);
        return proc.exitValue();
    }

    /** The runtime's HTTP port. */
    int port() { return port; }

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

    long pid() { return proc.pid(); }

    /** Longest a runtime may take to stop on SIGTERM: its drain (CPUSLOT_DRAIN_TIMEOUT, 25 s) and more. */
    private static final Duration STOP = Duration.ofSeconds(120);

    /**
     * After every case, as Kubernetes ends a pod: SIGTERM, and the runtime stops (whatever the
     * case's functions did to it: the runtime owns the process). One the case itself ended is left.
     */
    private void stopsOnSigterm() throws Exception {
        if (!alive()) return;
        terminate();
        awaitExit(STOP, "of SIGTERM after the case (runtime log: " + runtimeLog + ")");
    }

    /** As {@code docker kill}: SIGKILL, then the logs as written until then. */
    private void kill() throws IOException, InterruptedException {
        if (out != null) return;
        proc.destroyForcibly();
        proc.waitFor(60, TimeUnit.SECONDS);
        out = Files.readString(stdout, StandardCharsets.UTF_8);
        err = Files.readString(stderr, StandardCharsets.UTF_8);
    }

    @Override
    public void close() throws Exception {
        synchronized (this) {
            if (relay != null) relay.close();
        }
        kill();
    }

    // ---- payloads and checks, with the upstream harness's semantics --------------------------

    static JsonObject initPayload(String code, String main) { return initPayload(code, main, false, null); }

    static JsonObject initPayload(String code, String main, boolean binary, Map<String, JsonElement> env) {
        JsonObject v = new JsonObject();
        if (code != null) v.addProperty("code", code);
        else v.add("code", com.google.gson.JsonNull.INSTANCE);
        v.addProperty("main", main);
        v.addProperty("binary", binary);
        if (env != null) {
            JsonObject e = new JsonObject();
            env.forEach(e::add);
            v.add("env", e);
        }
        JsonObject o = new JsonObject();
        o.add("value", v);
        return o;
    }

    static JsonObject runPayload(JsonElement args) { return runPayload(args, Map.of()); }

    static JsonObject runPayload(JsonElement args, Map<String, String> other) {
        JsonObject o = new JsonObject();
        o.add("value", args);
        other.forEach(o::addProperty);
        return o;
    }

    static JsonObject json(String s) { return JsonParser.parseString(s).getAsJsonObject(); }

    /** Counts the sentinels on each stream, then checks the streams without them (trimmed). */
    static void checkStreams(String[] outErr, StreamCheck check, int sentinelCount) throws Exception {
        String out = outErr[0], err = outErr[1];
        assertEquals(sentinelCount, count(out, SENTINEL), "expected number of stdout sentinels; stdout:\n" + out);
        assertEquals(sentinelCount, count(err, SENTINEL), "expected number of stderr sentinels; stderr:\n" + err);
        String o = out.replace(SENTINEL, "").strip(), e = err.replace(SENTINEL, "").strip();
        assertFalse(o.contains(SENTINEL));
        check.accept(o, e);
    }

    static void checkStreams(String[] outErr, StreamCheck check) throws Exception { checkStreams(outErr, check, 1); }

    @FunctionalInterface
    interface StreamCheck { void accept(String o, String e) throws Exception; }

    static int count(String s, String sub) {
        int n = 0;
        for (int i = s.indexOf(sub); i >= 0; i = s.indexOf(sub, i + sub.length())) n++;
        return n;
    }

    static Map<String, String> env(String... kv) {
        Map<String, String> m = new HashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put(kv[i], kv[i + 1]);
        return m;
    }
}
