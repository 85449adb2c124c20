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
                    a.addProperty("port", c.port());
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

    static long pct(List<Long> v, int p) {
        List<Long> s = new ArrayList<>(v);
        Collections.sort(s);
        return s.get(Math.min(s.size() - 1, (int) Math.ceil(p / 100.0 * s.size()) - 1));
    }

    static String row(String name, List<Long> v) {
        return String.format("| %s | %d | %.1f us | %.1f us |%n", name, v.size(), pct(v, 50) / 1e3, pct(v, 99) / 1e3);
    }
}
