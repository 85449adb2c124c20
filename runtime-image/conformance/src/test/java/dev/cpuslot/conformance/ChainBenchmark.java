package dev.cpuslot.conformance;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Hop latency, side by side in one runtime (docs/chaining.md): a Java function calls a no-op
 * function {@code n} times, through the local bus ({@code Chain.call}) and through the runtime's
 * own HTTP invoke path (Hydra {@code POST /}, keep-alive, as the platform path's stand-in), in
 * alternating rounds, timing each call inside the caller. Not a test (no bound is asserted): run
 * it by name,
 * {@code ./build.sh -DskipTests package && ./build.sh -pl conformance -am -Dtest=ChainBenchmark
 * -Dsurefire.failIfNoSpecifiedTests=false -Dchain.bench.rounds=10 -Dchain.bench.calls=200 test};
 * the table goes to stdout and to target/chain-benchmark.md.
 */
class ChainBenchmark {
    static final Map<String, String> SOURCES = Map.of(
            "example/Noop.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    public class Noop {
                        public static JsonObject main(JsonObject a) { return a; }
                    }
                    """,
            "example/Bench.java", """
                    package example;
                    import com.google.gson.*;
                    import dev.cpuslot.chain.Chain;
                    import java.io.*;
                    import java.net.*;
                    import java.nio.charset.StandardCharsets;
                    public class Bench {
                        public static JsonObject main(JsonObject a) throws Exception {
                            String mode = a.get("mode").getAsString();
                            int n = a.get("n").getAsInt();
                            URL url = URI.create("http://127.0.0.1:" + a.get("port").getAsInt() + "/").toURL();
                            byte[] body = "{\\"name\\":\\"noop\\",\\"arguments\\":\\"{}\\"}".getBytes(StandardCharsets.UTF_8);
                            JsonArray ns = new JsonArray();
                            JsonObject args = new JsonObject();
                            for (int i = 0; i < n; i++) {
                                long t0 = System.nanoTime();
                                if (mode.equals("local")) {
                                    Chain.call("noop", args);
                                } else {
                                    HttpURLConnection c = (HttpURLConnection) url.openConnection();
                                    c.setRequestMethod("POST");
                                    c.setDoOutput(true);
                                    c.setRequestProperty("Content-Type", "application/json");
                                    try (OutputStream o = c.getOutputStream()) { o.write(body); }
                                    try (InputStream in = c.getInputStream()) { in.readAllBytes(); }
                                    if (c.getResponseCode() != 200) throw new IllegalStateException("HTTP " + c.getResponseCode());
                                }
                                ns.add(System.nanoTime() - t0);
                            }
                            JsonObject r = new JsonObject();
                            r.add("ns", ns);
                            return r;
                        }
                    }
                    """);

    @Test
    void hopLatencyLocalAgainstHttp() throws Exception {
        int rounds = Integer.getInteger("chain.bench.rounds", 10), calls = Integer.getInteger("chain.bench.calls", 200);
        String jarB64 = Archives.jar(SOURCES);
        with("java", c -> {
            Path jar = c.dir.resolve("bench.jar");
            Files.write(jar, Base64.getDecoder().decode(jarB64));
            for (String[] f : new String[][]{{"noop", "Noop"}, {"bench", "Bench"}})
                assertEquals(200, c.post("/register?name=" + f[0] + "&language=java&entryPoint=example." + f[1] + "&url=" + jar.toUri(), "").code());
            List<Long> local = new ArrayList<>(), http = new ArrayList<>();
            for (int r = -1; r < rounds; r++) { // round -1: warm-up, not counted
                for (String mode : r % 2 == 0 ? new String[]{"local", "http"} : new String[]{"http", "local"}) {
                    JsonObject a = new JsonObject();
                    a.addProperty("mode", mode);
                    a.addProperty("n", calls);
                    a.addProperty("port", c.relayPort());
                    JsonObject o = new JsonObject();
                    o.addProperty("name", "bench");
                    o.addProperty("arguments", a.toString());
                    Reply rep = c.post("/", o.toString());
                    assertEquals(200, rep.code(), String.valueOf(rep.raw()));
                    JsonArray ns = rep.body().getAsJsonObject("result").getAsJsonArray("ns");
                    if (r < 0) continue;
                    for (var e : ns) (mode.equals("local") ? local : http).add(e.getAsLong());
                }
            }
            String table = "| path | calls | p50 | p99 |\n|---|---|---|---|\n"
                    + row("local (Chain.call)", local) + row("runtime HTTP (POST /)", http)
                    + String.format("\nratio HTTP / local: p50 %.1fx, p99 %.1fx (%d rounds x %d calls, alternating)%n",
                    pct(http, 50) / (double) pct(local, 50), pct(http, 99) / (double) pct(local, 99), rounds, calls);
            System.out.println(table);
            Files.writeString(Path.of("target", "chain-benchmark.md"), table);
        });
    }

    /**
     * The hop latency of this build against another build's runtime jar ({@code
     * -Dchain.bench.baseline.jar=...}, e.g. the commit before a change on the hop's path), side by
     * side in one run: both runtimes up at once, the same functions, rounds alternating between
     * them (and which goes first), each round one activation of {@code calls} local calls.
     */
    @Test
    void hopLatencyAgainstAnotherBuild() throws Exception {
        String baseline = System.getProperty("chain.bench.baseline.jar", "");
        org.junit.jupiter.api.Assumptions.assumeFalse(baseline.isBlank(), "-Dchain.bench.baseline.jar=<another build's runtime jar>");
        int rounds = Integer.getInteger("chain.bench.rounds", 10), calls = Integer.getInteger("chain.bench.calls", 200);
        String jarB64 = Archives.jar(SOURCES);
        with("java", Map.of(), baseline, b -> with("java", c -> {
            ActionContainer[] both = {b, c};
            for (ActionContainer x : both) {
                Path jar = x.dir.resolve("bench.jar");
                Files.write(jar, Base64.getDecoder().decode(jarB64));
                for (String[] f : new String[][]{{"noop", "Noop"}, {"bench", "Bench"}})
                    assertEquals(200, x.post("/register?name=" + f[0] + "&language=java&entryPoint=example." + f[1] + "&url=" + jar.toUri(), "").code());
            }
            List<Long> before = new ArrayList<>(), after = new ArrayList<>();
            for (int r = -1; r < rounds; r++) { // round -1: warm-up, not counted
                for (int i = 0; i < 2; i++) {
                    ActionContainer x = both[(r + i + 2) % 2];
                    JsonObject a = new JsonObject();
                    a.addProperty("mode", "local");
                    a.addProperty("n", calls);
                    a.addProperty("port", x.port());
                    JsonObject o = new JsonObject();
                    o.addProperty("name", "bench");
                    o.addProperty("arguments", a.toString());
                    Reply rep = x.post("/", o.toString());
                    assertEquals(200, rep.code(), String.valueOf(rep.raw()));
                    if (r < 0) continue;
                    for (var e : rep.body().getAsJsonObject("result").getAsJsonArray("ns")) (x == b ? before : after).add(e.getAsLong());
                }
            }
            String table = "| runtime | calls | p50 | p99 |\n|---|---|---|---|\n"
                    + row("baseline (" + Path.of(baseline).getFileName() + ")", before) + row("this build", after)
                    + String.format("\nratio this build / baseline: p50 %.2fx, p99 %.2fx (%d rounds x %d local calls, alternating)%n",
                    pct(after, 50) / (double) pct(before, 50), pct(after, 99) / (double) pct(before, 99), rounds, calls);
            System.out.println(table);
            Files.writeString(Path.of("target", "chain-benchmark-baseline.md"), table);
        }));
    }

    /** The pipeline's functions: a stage (fixed compute, optional hold) and a driver that runs N stages in series. */
    static final Map<String, String> PIPELINE = Map.of(
            "example/Stage.java", """
                    package example;
                    import com.google.gson.JsonObject;
                    public class Stage {
                        public static JsonObject main(JsonObject a) throws Exception {
                            long t0 = System.nanoTime();
                            long x = 0, work = a.get("work").getAsLong();
                            for (long i = 0; i < work; i++) x += i ^ (x >>> 3);
                            long compute = System.nanoTime() - t0;
                            if (a.has("hold_ms")) Thread.sleep(a.get("hold_ms").getAsLong());
                            a.addProperty("compute_ns", a.get("compute_ns").getAsLong() + compute);
                            a.addProperty("i", a.get("i").getAsInt() + 1);
                            a.addProperty("sink", x & 1);
                            return a;
                        }
                    }
                    """,
            "example/Pipe.java", """
                    package example;
                    import com.google.gson.*;
                    import dev.cpuslot.chain.Chain;
                    import java.io.*;
                    import java.net.*;
                    import java.nio.charset.StandardCharsets;
                    public class Pipe {
                        public static JsonObject main(JsonObject a) throws Exception {
                            String mode = a.get("mode").getAsString();
                            int n = a.get("n").getAsInt(), reps = a.get("reps").getAsInt();
                            JsonArray e2e = new JsonArray(), compute = new JsonArray();
                            for (int r = 0; r < reps; r++) {
                                JsonObject cur = new JsonObject();
                                cur.add("work", a.get("work"));
                                if (a.has("hold_ms")) cur.add("hold_ms", a.get("hold_ms"));
                                cur.addProperty("compute_ns", 0L);
                                cur.addProperty("i", 0);
                                long t0 = System.nanoTime();
                                for (int i = 0; i < n; i++) {
                                    if (mode.equals("local")) cur = Chain.call("stage", cur).getAsJsonObject();
                                    else cur = post(a, mode, cur);
                                }
                                e2e.add(System.nanoTime() - t0);
                                compute.add(cur.get("compute_ns").getAsLong());
                                if (cur.get("i").getAsInt() != n) throw new IllegalStateException("ran " + cur.get("i") + " stages");
                            }
                            JsonObject r = new JsonObject();
                            r.add("e2e_ns", e2e);
                            r.add("compute_ns", compute);
                            return r;
                        }

                        /** http: the runtime's own invoke (Hydra POST /); api: the OpenWhisk API's blocking invoke. */
                        static JsonObject post(JsonObject a, String mode, JsonObject cur) throws Exception {
                            HttpURLConnection c = (HttpURLConnection) URI.create(a.get(mode + "_url").getAsString()).toURL().openConnection();
                            c.setRequestMethod("POST");
                            c.setDoOutput(true);
                            c.setRequestProperty("Content-Type", "application/json");
                            if (mode.equals("api")) c.setRequestProperty("Authorization", a.get("auth").getAsString());
                            String body;
                            if (mode.equals("http")) {
                                JsonObject o = new JsonObject();
                                o.addProperty("name", "stage");
                                o.addProperty("arguments", cur.toString());
                                body = o.toString();
                            } else {
                                body = cur.toString();
                            }
                            try (OutputStream o = c.getOutputStream()) { o.write(body.getBytes(StandardCharsets.UTF_8)); }
                            String got;
                            try (InputStream in = c.getInputStream()) { got = new String(in.readAllBytes(), StandardCharsets.UTF_8); }
                            if (c.getResponseCode() != 200) throw new IllegalStateException("HTTP " + c.getResponseCode());
                            JsonObject r = JsonParser.parseString(got).getAsJsonObject();
                            return mode.equals("http") ? r.getAsJsonObject("result") : r;
                        }
                    }
                    """);

    /**
     * The N-stage pipeline (N = 2, 4, 8), side by side in one runtime: a driver runs N stages in
     * series, each stage's output the next one's input, through the local bus, through the
     * runtime's own HTTP invoke (POST /), and through the OpenWhisk API stand-in (a blocking
     * invoke that the stand-in forwards to the runtime's POST /, as a controller would to an
     * invoker); rounds alternate the paths. Reported: end-to-end time minus the stages' compute
     * (the platform's overhead per pipeline), and the runtime's resident memory per concurrent
     * pipeline and its threads (the peak RSS and thread count while C pipelines whose stages hold 250 ms run at once, minus before, over C).
     * {@code -Dchain.bench.pipeline.rounds=6 -Dchain.bench.pipeline.reps=25 -Dchain.bench.pipeline.concurrent=16};
     * the table goes to stdout and to target/chain-pipeline.md.
     */
    @Test
    void pipelineLocalAgainstHttpAndApi() throws Exception {
        int rounds = Integer.getInteger("chain.bench.pipeline.rounds", 6), reps = Integer.getInteger("chain.bench.pipeline.reps", 25);
        int conc = Integer.getInteger("chain.bench.pipeline.concurrent", 16);
        long work = Long.getLong("chain.bench.pipeline.work", 20_000);
        String key = "bench:key";
        String jarB64 = Archives.jar(PIPELINE);
        java.net.http.HttpClient fwd = java.net.http.HttpClient.newBuilder().version(java.net.http.HttpClient.Version.HTTP_1_1).build();
        try (OpenWhiskApiStandIn api = new OpenWhiskApiStandIn(key)) {
            api.recording = false;
            with("java", env("CPUSLOT_SANDBOXES_PER_FUNCTION", Integer.toString(2 * conc + 4)), c -> {
                api.forward = forwarder(fwd, c);
                Path jar = c.dir.resolve("pipeline.jar");
                Files.write(jar, Base64.getDecoder().decode(jarB64));
                for (String[] f : new String[][]{{"stage", "Stage"}, {"pipe", "Pipe"}})
                    assertEquals(200, c.post("/register?name=" + f[0] + "&language=java&entryPoint=example." + f[1] + "&url=" + jar.toUri(), "").code());
                String[] modes = {"local", "http", "api"};
                StringBuilder table = new StringBuilder("| N | path | pipelines | e2e p50 | compute p50 | e2e - compute p50 | p99 | RSS per concurrent pipeline | threads per concurrent pipeline |\n|---|---|---|---|---|---|---|---|---|\n");
                StringBuilder ratios = new StringBuilder();
                for (int n : new int[]{2, 4, 8}) {
                    Map<String, List<Long>> over = new java.util.HashMap<>(), e2e = new java.util.HashMap<>(), comp = new java.util.HashMap<>();
                    Map<String, List<Long>> mem = new java.util.HashMap<>(), threads = new java.util.HashMap<>();
                    for (String m : modes) {
                        over.put(m, new ArrayList<>()); e2e.put(m, new ArrayList<>()); comp.put(m, new ArrayList<>());
                        mem.put(m, new ArrayList<>()); threads.put(m, new ArrayList<>());
                    }
                    for (int r = -1; r < rounds; r++) { // round -1: warm-up (and every worker made), not counted
                        for (int k = 0; k < modes.length; k++) {
                            String mode = modes[(k + Math.max(r, 0)) % modes.length];
                            JsonObject res = pipe(c, api, key, mode, n, r < 0 ? 5 : reps, work, -1);
                            if (r >= 0) {
                                JsonArray es = res.getAsJsonArray("e2e_ns"), cs = res.getAsJsonArray("compute_ns");
                                for (int i = 0; i < es.size(); i++) {
                                    e2e.get(mode).add(es.get(i).getAsLong());
                                    comp.get(mode).add(cs.get(i).getAsLong());
                                    over.get(mode).add(es.get(i).getAsLong() - cs.get(i).getAsLong());
                                }
                            }
                            long[] per = memoryPerConcurrentPipeline(c, api, key, mode, n, work, conc);
                            if (r >= 0) {
                                mem.get(mode).add(per[0]);
                                threads.get(mode).add(per[1]);
                            }
                        }
                    }
                    for (String m : modes) {
                        table.append(String.format("| %d | %s | %d | %.1f us | %.1f us | %.1f us | %.1f us | %.2f MB | %.2f |%n", n, label(m), over.get(m).size(),
                                pct(e2e.get(m), 50) / 1e3, pct(comp.get(m), 50) / 1e3, pct(over.get(m), 50) / 1e3, pct(over.get(m), 99) / 1e3,
                                pct(mem.get(m), 50) / 1048576.0, pct(threads.get(m), 50) / 100.0));
                    }
                    ratios.append(String.format("N=%d: overhead (e2e - compute) p50 HTTP / local %.1fx, API / local %.1fx%n", n,
                            pct(over.get("http"), 50) / (double) Math.max(1, pct(over.get("local"), 50)),
                            pct(over.get("api"), 50) / (double) Math.max(1, pct(over.get("local"), 50))));
                }
                String out = table + "\n" + ratios + String.format("(%d rounds x %d pipelines per path and N, alternating; stage compute %d iterations;"
                        + " memory: %d concurrent pipelines whose stages hold 250 ms, median over the rounds)%n", rounds, reps, work, conc);
                System.out.println(out);
                Files.writeString(Path.of("target", "chain-pipeline.md"), out);
            });
        }
    }

    /**
     * Memory per concurrent call, as SAND measured it (what serving C concurrent pipelines adds):
     * per path, a fresh runtime, one pipeline to warm it, then C = 16 pipelines of 4 stages at once
     * (stages hold 250 ms); the runtime's peak RSS and thread count minus before, over C. The
     * workers the concurrency needs are made then (a warm pool reuses them: the pipeline table's
     * columns). The stand-in's own memory (in the test's JVM) is not counted.
     * {@code -Dtest='ChainBenchmark#memoryPerConcurrentPipelineFromCold'}; table to stdout and target/chain-memory.md.
     */
    @Test
    void memoryPerConcurrentPipelineFromCold() throws Exception {
        int conc = Integer.getInteger("chain.bench.pipeline.concurrent", 16), n = 4;
        String key = "bench:key";
        String jarB64 = Archives.jar(PIPELINE);
        java.net.http.HttpClient fwd = java.net.http.HttpClient.newBuilder().version(java.net.http.HttpClient.Version.HTTP_1_1).build();
        StringBuilder table = new StringBuilder("| path | concurrent pipelines (4 stages) | RSS per concurrent pipeline | threads per concurrent pipeline |\n|---|---|---|---|\n");
        for (String mode : new String[]{"local", "http", "api"}) {
            try (OpenWhiskApiStandIn api = new OpenWhiskApiStandIn(key)) {
                api.recording = false;
                with("java", env("CPUSLOT_SANDBOXES_PER_FUNCTION", Integer.toString(2 * conc + 4)), c -> {
                    api.forward = forwarder(fwd, c);
                    Path jar = c.dir.resolve("pipeline.jar");
                    Files.write(jar, Base64.getDecoder().decode(jarB64));
                    for (String[] f : new String[][]{{"stage", "Stage"}, {"pipe", "Pipe"}})
                        assertEquals(200, c.post("/register?name=" + f[0] + "&language=java&entryPoint=example." + f[1] + "&url=" + jar.toUri(), "").code());
                    pipe(c, api, key, mode, n, 3, 20_000, -1);
                    long[] per = memoryPerConcurrentPipeline(c, api, key, mode, n, 20_000, conc);
                    table.append(String.format("| %s | %d | %.2f MB | %.2f |%n", label(mode), conc, per[0] / 1048576.0, per[1] / 100.0));
                });
            }
        }
        System.out.println(table);
        Files.writeString(Path.of("target", "chain-memory.md"), table.toString());
    }

    /** The stand-in controller: an invocation's params to the runtime's invoke (POST /), its result back. */
    static java.util.function.BiFunction<String, String, OpenWhiskApiStandIn.Answer> forwarder(java.net.http.HttpClient fwd, ActionContainer c) {
        return (name, body) -> {
            try {
                JsonObject o = new JsonObject();
                o.addProperty("name", name);
                o.addProperty("arguments", body);
                var r = fwd.send(java.net.http.HttpRequest.newBuilder(java.net.URI.create("http://127.0.0.1:" + c.port() + "/"))
                        .POST(java.net.http.HttpRequest.BodyPublishers.ofString(o.toString())).build(),
                        java.net.http.HttpResponse.BodyHandlers.ofString());
                JsonObject got = com.google.gson.JsonParser.parseString(r.body()).getAsJsonObject();
                return r.statusCode() == 200 ? new OpenWhiskApiStandIn.Answer(200, got.get("result").toString(), 0)
                        : new OpenWhiskApiStandIn.Answer(502, r.body(), 0);
            } catch (Exception e) {
                return new OpenWhiskApiStandIn.Answer(500, "{\"error\":\"" + e + "\"}", 0);
            }
        };
    }

    static String label(String mode) {
        return switch (mode) {
            case "local" -> "local (Chain.call)";
            case "http" -> "runtime HTTP (POST /)";
            default -> "OpenWhisk API stand-in";
        };
    }

    static JsonObject pipe(ActionContainer c, OpenWhiskApiStandIn api, String key, String mode, int n, int reps, long work, long holdMs) throws Exception {
        JsonObject a = new JsonObject();
        a.addProperty("mode", mode);
        a.addProperty("n", n);
        a.addProperty("reps", reps);
        a.addProperty("work", work);
        if (holdMs >= 0) a.addProperty("hold_ms", holdMs);
        a.addProperty("http_url", "http://127.0.0.1:" + c.relayPort() + "/");
        a.addProperty("api_url", api.url() + "/api/v1/namespaces/guest/actions/stage?blocking=true&result=true");
        a.addProperty("auth", "Basic " + Base64.getEncoder().encodeToString(key.getBytes(java.nio.charset.StandardCharsets.UTF_8)));
        JsonObject o = new JsonObject();
        o.addProperty("name", "pipe");
        o.addProperty("arguments", a.toString());
        Reply rep = c.post("/", o.toString());
        assertEquals(200, rep.code(), String.valueOf(rep.raw()));
        return rep.body().getAsJsonObject("result");
    }

    /**
     * The runtime's peak RSS and live threads while {@code conc} pipelines run at once (their
     * stages hold 250 ms), minus before, over conc: {bytes, threads x 100}.
     */
    static long[] memoryPerConcurrentPipeline(ActionContainer c, OpenWhiskApiStandIn api, String key, String mode, int n, long work,
                                              int conc) throws Exception {
        long before = status(c.pid(), "VmRSS:") * 1024, threadsBefore = status(c.pid(), "Threads:");
        long[] peak = {before, threadsBefore};
        try (var ex = java.util.concurrent.Executors.newVirtualThreadPerTaskExecutor()) {
            List<java.util.concurrent.Future<JsonObject>> fs = new ArrayList<>();
            for (int i = 0; i < conc; i++) fs.add(ex.submit(() -> pipe(c, api, key, mode, n, 1, work, 250)));
            for (int i = 0; i < 5 * n; i++) { // the pipelines take n x 250 ms: sample through them
                Thread.sleep(50);
                peak[0] = Math.max(peak[0], status(c.pid(), "VmRSS:") * 1024);
                peak[1] = Math.max(peak[1], status(c.pid(), "Threads:"));
            }
            for (var f : fs) f.get(ActionContainer.REQUEST_TIMEOUT.toSeconds(), java.util.concurrent.TimeUnit.SECONDS);
        }
        return new long[]{(peak[0] - before) / conc, 100 * (peak[1] - threadsBefore) / conc};
    }

    /** A number from /proc/PID/status (VmRSS: in kB, Threads:). */
    static long status(long pid, String field) throws Exception {
        for (String l : Files.readAllLines(Path.of("/proc/" + pid + "/status")))
            if (l.startsWith(field)) return Long.parseLong(l.replaceAll("[^0-9]", ""));
        return 0;
    }

    static long pct(List<Long> v, int p) {
        List<Long> s = new ArrayList<>(v);
        Collections.sort(s);
        return s.get(Math.min(s.size() - 1, (int) Math.ceil(p / 100.0 * s.size()) - 1));
    }

    static String row(String name, List<Long> v) {
        return String.format("| %s | %d | %.1f us | %.1f us |%n", name, v.size(), pct(v, 50) / 1e3, pct(v, 99) / 1e3);
    }
}
