package dev.cpuslot.bench;

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
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Guest code through the runtime against its own language's usual runtime, side by side in one
 * run: warm compute-bound functions (fib, a JSON transform, a regex workload) in JavaScript
 * against {@code node} and in Python against {@code python3}, and a hello-world action's start-up,
 * /init and first /run, each with the runtime started as its image starts it (image/jvm-options
 * plus image/jvm-options-jit: "compiled") and without the JIT options ("interpreted", the runtime
 * before guest code was compiled). Every action gets a fresh runtime process (one /init each).
 *
 * <pre>
 * java -cp bench.jar dev.cpuslot.bench.GuestBench --runtime-jar runtime/target/runtime-0.1.0-SNAPSHOT.jar \
 *      --image-dir image [--runs 40] [--last 10] [--warm-seconds 20] [--languages javascript,python] [--before-jar OLD.jar]
 * </pre>
 *
 * {@code --before-jar} adds hello-world rows for another build of the runtime (the one before a
 * change; its {@code lib/} and {@code compiler/} beside it), started the same way, in the same run.
 *
 * Warm: the median of the last {@code --last} calls (through /run for the runtime, a loop in one
 * process for node and python3), made after at least {@code --runs} calls and {@code --warm-seconds}
 * of calls: Graal runs as Java bytecode on a stock JDK and warms up itself before guest code reaches
 * its compiled speed, hundreds to thousands of calls. A hang fails with the runtime's log.
 */
public final class GuestBench {
    private GuestBench() {}

    private static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
    private static final Duration TIMEOUT = Duration.ofSeconds(600);
    private static final Pattern LISTENING = Pattern.compile("listening on :(\\d+)");

    record Workload(String name, String js, String py) {}

    static final List<Workload> WORKLOADS = List.of(
            new Workload("fib", """
                    function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
                    function main(args) { return { fib: fib(30) }; }
                    """, """
                    def fib(n):
                        return n if n < 2 else fib(n - 1) + fib(n - 2)
                    def main(args):
                        return {'fib': fib(25)}
                    """),
            new Workload("json", """
                    function main(args) {
                      var items = [];
                      for (var i = 0; i < 2000; i++)
                        items.push({ id: i, name: 'item' + i, tags: ['a' + (i % 7), 'b' + (i % 11)], price: (i * 37) % 1000 / 10 });
                      var doc = JSON.parse(JSON.stringify({ items: items }));
                      var out = doc.items.filter(function (x) { return x.price > 20; }).map(function (x) {
                        return { id: x.id, label: x.name.toUpperCase() + ':' + x.tags.join('|'), cents: Math.round(x.price * 100) };
                      });
                      return { n: out.length, len: JSON.stringify(out).length };
                    }
                    """, """
                    import json
                    def main(args):
                        items = [{'id': i, 'name': 'item%d' % i, 'tags': ['a%d' % (i % 7), 'b%d' % (i % 11)],
                                  'price': (i * 37) % 1000 / 10} for i in range(2000)]
                        doc = json.loads(json.dumps({'items': items}))
                        out = [{'id': x['id'], 'label': x['name'].upper() + ':' + '|'.join(x['tags']),
                                'cents': round(x['price'] * 100)} for x in doc['items'] if x['price'] > 20]
                        return {'n': len(out), 'len': len(json.dumps(out))}
                    """),
            new Workload("regex", """
                    var words = ['alpha', 'beta', 'gamma', 'delta', 'user', 'mail', 'example', 'host'];
                    var text = (function () {
                      var p = [];
                      for (var i = 0; i < 5000; i++) {
                        p.push(words[i % 8] + i);
                        if (i % 10 == 0) p.push(words[(i * 3) % 8] + '.' + i + '@' + words[(i * 5) % 8] + '.org');
                        if (i % 13 == 0) p.push('2024-' + (1 + i % 12) + '-' + (1 + i % 28));
                      }
                      return p.join(' ');
                    })();
                    function main(args) {
                      var emails = text.match(/[a-z0-9.]+@[a-z]+\\.(?:org|com)/g) || [];
                      var dates = 0, re = /(\\d{4})-(\\d{1,2})-(\\d{1,2})/g, m;
                      while ((m = re.exec(text)) !== null) dates += Number(m[2]);
                      var replaced = text.replace(/\\b([a-z]+)(\\d+)\\b/g, '$2$1');
                      return { emails: emails.length, dates: dates, len: replaced.length };
                    }
                    """, """
                    import re
                    words = ['alpha', 'beta', 'gamma', 'delta', 'user', 'mail', 'example', 'host']
                    p = []
                    for i in range(5000):
                        p.append(words[i % 8] + str(i))
                        if i % 10 == 0: p.append(words[(i * 3) % 8] + '.' + str(i) + '@' + words[(i * 5) % 8] + '.org')
                        if i % 13 == 0: p.append('2024-' + str(1 + i % 12) + '-' + str(1 + i % 28))
                    text = ' '.join(p)
                    EMAIL = re.compile(r'[a-z0-9.]+@[a-z]+\\.(?:org|com)')
                    DATE = re.compile(r'(\\d{4})-(\\d{1,2})-(\\d{1,2})')
                    WORD = re.compile(r'\\b([a-z]+)(\\d+)\\b')
                    def main(args):
                        emails = EMAIL.findall(text)
                        dates = sum(int(m.group(2)) for m in DATE.finditer(text))
                        replaced = WORD.sub(r'\\2\\1', text)
                        return {'emails': len(emails), 'dates': dates, 'len': len(replaced)}
                    """));

    static final Workload HELLO = new Workload("hello",
            "function main(args) { return { hello: 'world' }; }\n",
            "def main(args):\n    return {'hello': 'world'}\n");

    public static void main(String[] args) throws Exception {
        Path jar = null, before = null, imageDir = Path.of("image");
        int runs = 40, last = 10;
        double warmSeconds = 20;
        List<String> languages = List.of("javascript", "python");
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--runtime-jar" -> jar = Path.of(args[++i]);
                case "--image-dir" -> imageDir = Path.of(args[++i]);
                case "--runs" -> runs = Integer.parseInt(args[++i]);
                case "--last" -> last = Integer.parseInt(args[++i]);
                case "--warm-seconds" -> warmSeconds = Double.parseDouble(args[++i]);
                case "--languages" -> languages = List.of(args[++i].split(","));
                case "--before-jar" -> before = Path.of(args[++i]);
                default -> {
                    System.err.println("usage: GuestBench --runtime-jar JAR [--image-dir DIR] [--runs M] [--last N] [--warm-seconds S] [--languages javascript,python] [--before-jar OLD.jar]");
                    System.exit(2);
                }
            }
        }
        if (jar == null || last < 1 || runs < last) throw new IllegalArgumentException("need --runtime-jar, and 1 <= --last <= --runs");
        List<String> base = options(imageDir.resolve("jvm-options"), jar), jit = new ArrayList<>(base);
        jit.addAll(options(imageDir.resolve("jvm-options-jit"), jar));
        Path work = Files.createTempDirectory("guest-bench");

        System.out.printf(Locale.ROOT, "# warm: median of the last %d calls, ms, after at least %d calls and %.0f s of calls (Graal, the JIT, warms up"
                + " itself first on a JDK); runtime = /run through the runtime started as its image starts it%n", last, runs, warmSeconds);
        System.out.println("| language | workload | runtime compiled | runtime interpreted | baseline | compiled / baseline | interpreted / baseline |");
        System.out.println("|---|---|---:|---:|---:|---:|---:|");
        List<String> startRows = new ArrayList<>();
        for (String lang : languages) {
            boolean js = lang.equals("javascript");
            for (Workload w : WORKLOADS) {
                String code = js ? w.js : w.py;
                double compiled = warm(Runtime.start(jit, jar, lang, work).measure(code, runs, warmSeconds), last);
                double interpreted = warm(Runtime.start(base, jar, lang, work).measure(code, runs, warmSeconds), last);
                double baseline = warm(baseline(lang, code, runs, warmSeconds, work), last);
                System.out.printf(Locale.ROOT, "| %s | %s | %.2f | %.2f | %.2f (%s) | %.2fx | %.1fx |%n", lang, w.name, compiled, interpreted,
                        baseline, js ? "node" : "python3", compiled / baseline, interpreted / baseline);
            }
            List<Path> jars = before == null ? List.of(jar) : List.of(jar, before);
            for (Path j : jars) {
                List<String> b = options(imageDir.resolve("jvm-options"), j), c = new ArrayList<>(b);
                c.addAll(options(imageDir.resolve("jvm-options-jit"), j));
                for (boolean compiledMode : new boolean[]{true, false}) {
                    Runtime rt = Runtime.start(compiledMode ? c : b, j, lang, work);
                    double[] t = rt.measure(js ? HELLO.js : HELLO.py, 1, 0);
                    startRows.add(String.format(Locale.ROOT, "| %s | %s%s | %.0f | %.0f | %.1f | %.0f |", lang, compiledMode ? "compiled" : "interpreted",
                            j == before ? " (before)" : "", rt.startMs, rt.initMs, t[0], rt.rssMb));
                }
            }
        }
        System.out.println();
        System.out.println("# hello-world, a fresh runtime each (cold): start-up to listening, /init, first /run (ms), RSS after (MB)");
        System.out.println("| language | runtime | start-up | /init | first /run | RSS MB |");
        System.out.println("|---|---|---:|---:|---:|---:|");
        startRows.forEach(System.out::println);
    }

    /** An options file as the image has it, with the image's /opt/cpuslot/ read as the jar's directory. */
    static List<String> options(Path file, Path jar) throws IOException {
        String home = jar.toAbsolutePath().getParent() + "/";
        List<String> out = new ArrayList<>();
        for (String l : Files.readAllLines(file)) if (!l.isBlank()) out.add(l.strip().replace("/opt/cpuslot/", home));
        return out;
    }

    static double warm(double[] t, int last) {
        double[] tail = Arrays.copyOfRange(t, t.length - last, t.length);
        Arrays.sort(tail);
        return tail.length % 2 == 1 ? tail[tail.length / 2] : (tail[tail.length / 2 - 1] + tail[tail.length / 2]) / 2;
    }

    /** The same code in node or python3, called in a loop at least {@code runs} times and {@code seconds}; each call's ms. */
    static double[] baseline(String lang, String code, int runs, double seconds, Path work) throws Exception {
        boolean js = lang.equals("javascript");
        long ns = (long) (seconds * 1e9);
        String harness = js
                ? code + "\nconst __t = [], __0 = process.hrtime.bigint(); for (let i = 0; i < " + runs + " || process.hrtime.bigint() - __0 < " + ns
                  + "n; i++) { const s = process.hrtime.bigint(); main({}); __t.push(Number(process.hrtime.bigint() - s) / 1e6); } console.log(__t.join(' '));\n"
                : code + "\nimport time as __time\n__t = []\n__0 = __time.perf_counter_ns()\n__i = 0\nwhile __i < " + runs
                  + " or __time.perf_counter_ns() - __0 < " + ns + ":\n    __i += 1\n    __s = __time.perf_counter_ns()\n    main({})\n"
                  + "    __t.append((__time.perf_counter_ns() - __s) / 1e6)\nprint(' '.join(str(x) for x in __t))\n";
        Path f = work.resolve("baseline" + (js ? ".js" : ".py"));
        Files.writeString(f, harness);
        Process p = new ProcessBuilder(js ? "node" : "python3", f.toString()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
        if (p.waitFor() != 0) throw new IllegalStateException((js ? "node" : "python3") + " failed: " + out);
        return Arrays.stream(out.split("\\s+")).mapToDouble(Double::parseDouble).toArray();
    }

    /** One runtime process, as the image starts it, for one action. */
    static final class Runtime {
        final Process proc;
        final Path log;
        final int port;
        final double startMs;
        double initMs, rssMb;

        private Runtime(Process proc, Path log, int port, double startMs) {
            this.proc = proc;
            this.log = log;
            this.port = port;
            this.startMs = startMs;
        }

        static Runtime start(List<String> opts, Path jar, String kind, Path work) throws Exception {
            List<String> cmd = new ArrayList<>();
            cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
            cmd.addAll(opts);
            cmd.add("-jar");
            cmd.add(jar.toString());
            Path log = Files.createTempFile(work, "runtime", ".log");
            ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile());
            var e = pb.environment();
            e.clear(); // a container's environment
            e.put("PATH", "/usr/bin:/bin");
            e.put("PORT", "0");
            e.put("CPUSLOT_METRICS_PORT", "-1");
            e.put("CPUSLOT_LANGUAGE", kind);
            e.put("CPUSLOT_LOG", "stderr");
            long t0 = System.nanoTime();
            Process p = pb.start();
            long until = t0 + TIMEOUT.toNanos();
            while (System.nanoTime() < until) {
                Matcher m = LISTENING.matcher(Files.readString(log));
                if (m.find()) return new Runtime(p, log, Integer.parseInt(m.group(1)), (System.nanoTime() - t0) / 1e6);
                if (!p.isAlive()) throw new IllegalStateException("the runtime exited: " + Files.readString(log));
                Thread.sleep(5);
            }
            p.destroyForcibly();
            throw new IllegalStateException("the runtime did not listen within " + TIMEOUT + ": " + Files.readString(log));
        }

        /** /init of the code, then /run calls (ms each), at least {@code runs} and {@code seconds}; the process is stopped after. */
        double[] measure(String code, int runs, double seconds) throws Exception {
            try {
                long t0 = System.nanoTime();
                post("/init", "{\"value\":{\"name\":\"bench\",\"main\":\"main\",\"code\":" + quote(code) + "}}");
                initMs = (System.nanoTime() - t0) / 1e6;
                List<Double> t = new ArrayList<>();
                long t1 = System.nanoTime(), until = t1 + (long) (seconds * 1e9);
                while (t.size() < runs || System.nanoTime() - until < 0) {
                    long s = System.nanoTime();
                    post("/run", "{\"value\":{}}");
                    t.add((System.nanoTime() - s) / 1e6);
                }
                for (String l : Files.readAllLines(Path.of("/proc/" + proc.pid() + "/status")))
                    if (l.startsWith("VmRSS:")) rssMb = Long.parseLong(l.replaceAll("\\D", "")) / 1024.0;
                return t.stream().mapToDouble(Double::doubleValue).toArray();
            } finally {
                proc.destroy();
                if (!proc.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)) proc.destroyForcibly();
            }
        }

        private void post(String path, String body) throws Exception {
            HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path)).timeout(TIMEOUT)
                    .POST(HttpRequest.BodyPublishers.ofString(body)).build(), HttpResponse.BodyHandlers.ofString());
            if (r.statusCode() != 200)
                throw new IllegalStateException(path + ": " + r.statusCode() + " " + r.body() + "\nruntime log:\n" + Files.readString(log));
        }
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\t' -> b.append("\\t");
                default -> { if (c < 0x20) b.append(String.format("\\u%04x", (int) c)); else b.append(c); }
            }
        }
        return b.append('"').toString();
    }
}
