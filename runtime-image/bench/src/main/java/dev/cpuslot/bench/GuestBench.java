package dev.cpuslot.bench;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
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
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Guest code through the runtime against its own language's usual runtime, side by side in one
 * run: function-shaped workloads (fib; a JSON round trip and transform; a regex extraction; group
 * and sort with a comparator on a number and a string, and in JavaScript the same with
 * {@code localeCompare}; string building and number formatting;
 * dict/object-heavy aggregation; hello-world, the runtime's own cost per call) in JavaScript
 * against {@code node} and in Python against {@code python3}.
 *
 * <pre>
 * java -cp bench.jar dev.cpuslot.bench.GuestBench --runtime-jar runtime/target/runtime-0.1.0-SNAPSHOT.jar \
 *      --image-dir image [--warm-seconds 20] [--last 10] [--runs 20] [--languages javascript,python]
 *      [--workloads fib,json,...,memory] [--before-jar OLD.jar [--before-image-dir DIR]] [--interpreted] [--variant NAME=-Dopt=v,-Dopt2=v]
 *      [--no-http] [--functions 20] [--pause-ms 1000]
 * </pre>
 *
 * The {@code memory} workload ({@link Density}) registers {@code --functions} hello-world functions
 * in one runtime per language (Java too, when {@code --languages} names it or not) and reports
 * memory per added function and a new function's first call ({@code --pause-ms} between
 * registrations, after {@code --warm-seconds} of calls to the first), beside one process per function.
 *
 * Per language and workload, every runtime under test ("after": the jar given, started as its image
 * starts it, image/jvm-options plus image/jvm-options-jit; "before": {@code --before-jar}, another
 * build, its {@code lib/} and {@code compiler/} beside it, started the same way, with the JVM options of
 * {@code --before-image-dir} when given; "interpreted":
 * without the JIT options; each {@code --variant}: the jar given with more JVM options) gets a fresh
 * process and an OpenWhisk /init of the function; the baseline is a fresh node or python3 process
 * that calls the same code's {@code main} once per line on its stdin, and (unless {@code --no-http}) another
 * fresh one that serves the same {@code main} as an action container does, POST /init (answered ok: the
 * code is loaded) then POST /run, by node's {@code http} or python3's single-threaded {@code http.server}. Then rounds: one /run to each
 * runtime, one call of the baseline and one /run to the served baseline, in turn, so that every one
 * of them runs under the same load at the same time, until at least {@code --runs} rounds and
 * {@code --warm-seconds} of them. Warm: the median of the last {@code --last} calls of each (the
 * runtime's and the served baseline's round trip of the same /run by the same client, HTTP included:
 * like for like, which for hello-world is all there is; the baseline's its own time around
 * {@code main}); every first answer must equal the baseline's result; first: the first /run after
 * /init, the served baseline's first /run after its start, the baseline's first call, each
 * {@code main}'s first call in its process. Graal runs as Java bytecode on a stock JDK and warms up
 * itself before guest code reaches its compiled speed, hundreds to thousands of calls. The load
 * average is printed with every row: on a shared machine only the ratios of one row compare.
 * A hang fails with the runtime's log.
 */
public final class GuestBench {
    private GuestBench() {}

    // HTTP/1.1: the default asks each request to upgrade to HTTP/2, and node's and python3's servers then close
    // the connection (a new one per call: 9-13 ms against 2 ms a call to node's http on a loaded host)
    private static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(Duration.ofSeconds(10)).build();
    private static final Duration TIMEOUT = Duration.ofSeconds(600);
    private static final Pattern LISTENING = Pattern.compile("listening on :(\\d+)");

    record Workload(String name, String title, String js, String py) {}

    static final List<Workload> WORKLOADS = List.of(
            new Workload("fib", "fib (30 JS, 25 Python)", """
                    function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
                    function main(args) { return { fib: fib(30) }; }
                    """, """
                    def fib(n):
                        return n if n < 2 else fib(n - 1) + fib(n - 2)
                    def main(args):
                        return {'fib': fib(25)}
                    """),
            new Workload("json", "JSON round trip and transform", """
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
            new Workload("regex", "regex extraction", """
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
                    """),
            new Workload("sort", "group and sort (number, then string)", """
                    var CATS = ['books', 'games', 'music', 'tools', 'garden', 'toys', 'food'];
                    function main(args) {
                      var rows = [];
                      for (var i = 0; i < 3000; i++)
                        rows.push({ id: i, cat: CATS[(i * 3) % 7], name: 'item-' + ((i * 7919) % 3000), score: (i * 37) % 101 });
                      var groups = {};
                      for (var r of rows) (groups[r.cat] || (groups[r.cat] = [])).push(r);
                      var top = {}, n = 0;
                      for (var k of Object.keys(groups).sort()) {
                        var g = groups[k].sort(function (a, b) { return b.score - a.score || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0); });
                        top[k] = g.slice(0, 3).map(function (r) { return r.name + '=' + r.score; });
                        n += g.length;
                      }
                      return { n: n, top: top };
                    }
                    """, """
                    CATS = ['books', 'games', 'music', 'tools', 'garden', 'toys', 'food']
                    def main(args):
                        rows = [{'id': i, 'cat': CATS[(i * 3) % 7], 'name': 'item-%d' % ((i * 7919) % 3000),
                                 'score': (i * 37) % 101} for i in range(3000)]
                        groups = {}
                        for r in rows:
                            groups.setdefault(r['cat'], []).append(r)
                        top, n = {}, 0
                        for k in sorted(groups):
                            g = sorted(groups[k], key=lambda r: (-r['score'], r['name']))
                            top[k] = ['%s=%d' % (r['name'], r['score']) for r in g[:3]]
                            n += len(g)
                        return {'n': n, 'top': top}
                    """),
            // sort with the comparator most JavaScript code writes for strings (JavaScript only: Python
            // sorts by code point unless told a locale)
            new Workload("collate", "group and sort (number, then localeCompare)", """
                    var CATS = ['books', 'games', 'music', 'tools', 'garden', 'toys', 'food'];
                    function main(args) {
                      var rows = [];
                      for (var i = 0; i < 3000; i++)
                        rows.push({ id: i, cat: CATS[(i * 3) % 7], name: 'item-' + ((i * 7919) % 3000), score: (i * 37) % 101 });
                      var groups = {};
                      for (var r of rows) (groups[r.cat] || (groups[r.cat] = [])).push(r);
                      var top = {}, n = 0;
                      for (var k of Object.keys(groups).sort()) {
                        var g = groups[k].sort(function (a, b) { return b.score - a.score || a.name.localeCompare(b.name); });
                        top[k] = g.slice(0, 3).map(function (r) { return r.name + '=' + r.score; });
                        n += g.length;
                      }
                      return { n: n, top: top };
                    }
                    """, null),
            new Workload("format", "string building and number formatting", """
                    function main(args) {
                      var lines = [];
                      for (var i = 0; i < 5000; i++) {
                        var v = i * 1.37 + 0.005;
                        lines.push(`row ${String(i).padStart(5, '0')}: ${v.toFixed(2)} EUR ${(i / 50).toFixed(1)}% 0x${((i * 2654435761) % 4294967296).toString(16)}`);
                      }
                      var s = lines.join('\\n');
                      return { len: s.length, last: lines[lines.length - 1] };
                    }
                    """, """
                    def main(args):
                        lines = []
                        for i in range(5000):
                            v = i * 1.37 + 0.005
                            lines.append(f"row {i:05d}: {v:.2f} EUR {i / 50:.1f}% 0x{(i * 2654435761) % 4294967296:x}")
                        s = '\\n'.join(lines)
                        return {'len': len(s), 'last': lines[-1]}
                    """),
            new Workload("aggregate", "dict/object-heavy aggregation", """
                    var REGIONS = ['north', 'south', 'east', 'west'];
                    function main(args) {
                      var stats = {};
                      for (var i = 0; i < 20000; i++) {
                        var key = REGIONS[i % 4] + '/p' + ((i * 31) % 50);
                        var s = stats[key];
                        if (s === undefined) s = stats[key] = { count: 0, total: 0, max: 0, users: {} };
                        var amount = ((i * 7919) % 1000) / 10;
                        s.count++;
                        s.total += amount;
                        if (amount > s.max) s.max = amount;
                        var u = 'u' + (i % 300);
                        s.users[u] = (s.users[u] || 0) + 1;
                      }
                      var out = [];
                      for (var k in stats) {
                        var t = stats[k];
                        out.push({ key: k, count: t.count, avg: Math.round(t.total / t.count * 100) / 100, max: t.max, users: Object.keys(t.users).length });
                      }
                      return { keys: out.length, first: out[0] };
                    }
                    """, """
                    REGIONS = ['north', 'south', 'east', 'west']
                    def main(args):
                        stats = {}
                        for i in range(20000):
                            key = REGIONS[i % 4] + '/p' + str((i * 31) % 50)
                            s = stats.get(key)
                            if s is None:
                                s = stats[key] = {'count': 0, 'total': 0, 'max': 0, 'users': {}}
                            amount = ((i * 7919) % 1000) / 10
                            s['count'] += 1
                            s['total'] += amount
                            if amount > s['max']:
                                s['max'] = amount
                            u = 'u' + str(i % 300)
                            s['users'][u] = s['users'].get(u, 0) + 1
                        out = [{'key': k, 'count': t['count'], 'avg': round(t['total'] / t['count'] * 100) / 100, 'max': t['max'],
                                'users': len(t['users'])} for k, t in stats.items()]
                        return {'keys': len(out), 'first': out[0]}
                    """),
            new Workload("hello", "hello (the runtime's own cost per call)",
                    "function main(args) { return { hello: 'world' }; }\n",
                    "def main(args):\n    return {'hello': 'world'}\n"));

    /** A runtime under test: a jar and its JVM options. */
    record Target(String label, Path jar, List<String> opts, String what) {}

    public static void main(String[] args) throws Exception {
        Path jar = null, before = null, imageDir = Path.of("image"), beforeImageDir = null;
        int runs = 20, last = 10;
        double warmSeconds = 20;
        boolean interpreted = false, http = true;
        List<String> languages = List.of("javascript", "python");
        List<String> workloads = new ArrayList<>(WORKLOADS.stream().map(Workload::name).toList());
        workloads.add(Density.NAME);
        int functions = 20;
        long pauseMs = 1000;
        Map<String, List<String>> variants = new LinkedHashMap<>();
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--runtime-jar" -> jar = Path.of(args[++i]);
                case "--image-dir" -> imageDir = Path.of(args[++i]);
                case "--runs" -> runs = Integer.parseInt(args[++i]);
                case "--last" -> last = Integer.parseInt(args[++i]);
                case "--warm-seconds" -> warmSeconds = Double.parseDouble(args[++i]);
                case "--languages" -> languages = List.of(args[++i].split(","));
                case "--workloads" -> workloads = List.of(args[++i].split(","));
                case "--functions" -> functions = Integer.parseInt(args[++i]);
                case "--pause-ms" -> pauseMs = Long.parseLong(args[++i]);
                case "--before-jar" -> before = Path.of(args[++i]);
                case "--before-image-dir" -> beforeImageDir = Path.of(args[++i]);
                case "--interpreted" -> interpreted = true;
                case "--no-http" -> http = false;
                case "--variant" -> {
                    String v = args[++i];
                    int eq = v.indexOf('=');
                    if (eq < 1) throw new IllegalArgumentException("--variant NAME=-Dopt=v,-Dopt2=v");
                    variants.put(v.substring(0, eq), List.of(v.substring(eq + 1).split(",")));
                }
                default -> {
                    System.err.println("usage: GuestBench --runtime-jar JAR [--image-dir DIR] [--warm-seconds S] [--last N] [--runs M]"
                            + " [--languages javascript,python] [--workloads " + String.join(",", workloads) + "] [--before-jar OLD.jar [--before-image-dir DIR]]"
                            + " [--interpreted] [--variant NAME=-Dopt=v,...] [--no-http] [--functions N] [--pause-ms MS]");
                    System.exit(2);
                }
            }
        }
        if (jar == null || last < 1 || runs < last) throw new IllegalArgumentException("need --runtime-jar, and 1 <= --last <= --runs");
        for (String w : workloads)
            if (!w.equals(Density.NAME) && WORKLOADS.stream().noneMatch(x -> x.name.equals(w))) throw new IllegalArgumentException("no workload " + w);
        List<Target> targets = new ArrayList<>();
        targets.add(new Target("after", jar, jitOptions(imageDir, jar), jar.toString()));
        if (before != null) targets.add(new Target("before", before, jitOptions(beforeImageDir == null ? imageDir : beforeImageDir, before), before.toString()));
        if (interpreted) targets.add(new Target("interpreted", jar, options(imageDir.resolve("jvm-options"), jar), "without image/jvm-options-jit"));
        for (var v : variants.entrySet()) {
            List<String> o = jitOptions(imageDir, jar);
            o.addAll(v.getValue());
            targets.add(new Target(v.getKey(), jar, o, "after with " + String.join(" ", v.getValue())));
        }
        Path work = Files.createTempDirectory("guest-bench");
        boolean density = workloads.contains(Density.NAME) && functions > 0;
        List<String> chosen = workloads;
        if (WORKLOADS.stream().noneMatch(w -> chosen.contains(w.name))) { // memory only
            if (density) Density.run(targets, languages, functions, pauseMs, warmSeconds, work);
            printResent();
            return;
        }

        System.out.printf(Locale.ROOT, "# warm: median of the last %d calls (ms) after at least %d rounds and %.0f s of them; every runtime"
                + " through /run, started as its image starts it; %s; baseline: main's own time in process%s; every answer"
                + " checked equal to the baseline's; load average (1 min) at a row's start and end; %d cores%n",
                last, runs, warmSeconds, targets.stream().map(t -> t.label + " = " + t.what).toList(),
                http ? "; via HTTP: the same main served as an action container serves it, by node's http or python3's http.server"
                        + " in a process of its own, the round trip of the same /run by the same client (hello: the per-call cost of each)" : "",
                java.lang.Runtime.getRuntime().availableProcessors());
        StringBuilder warmHead = new StringBuilder("| language | workload | baseline ms |"), warmSep = new StringBuilder("|---|---|---:|");
        StringBuilder firstHead = new StringBuilder("| language | workload | baseline first ms |"), firstSep = new StringBuilder("|---|---|---:|");
        if (http) {
            warmHead.append(" baseline via HTTP ms |");
            warmSep.append("---:|");
            firstHead.append(" via HTTP start ms | via HTTP /init ms | via HTTP first /run ms | via HTTP first / warm |");
            firstSep.append("---:|---:|---:|---:|");
        }
        for (Target t : targets) {
            warmHead.append(" ").append(t.label).append(" ms | ").append(t.label).append(" / baseline |");
            warmSep.append("---:|---:|");
            firstHead.append(" ").append(t.label).append(" /init ms | ").append(t.label).append(" first /run ms | ").append(t.label).append(" first / warm |");
            firstSep.append("---:|---:|---:|");
            if (http) {
                warmHead.append(" ").append(t.label).append(" / via HTTP |");
                warmSep.append("---:|");
                firstHead.append(" ").append(t.label).append(" first / via HTTP first |");
                firstSep.append("---:|");
            }
        }
        System.out.println(warmHead.append(" load |"));
        System.out.println(warmSep.append("---|"));
        List<String> firstRows = new ArrayList<>(), startRows = new ArrayList<>(), cpuRows = new ArrayList<>();
        for (String lang : languages) {
            boolean js = lang.equals("javascript");
            for (Workload w : WORKLOADS) {
                if (!workloads.contains(w.name) || lang.equals("java")) continue;
                String code = js ? w.js : w.py, load0 = loadAverage();
                if (code == null) continue;
                List<Runtime> rts = new ArrayList<>();
                Path harness = harness(lang, code, work);
                try (Baseline base = new Baseline(lang, harness); HttpBaseline served = http ? new HttpBaseline(lang, harness, work) : null) {
                    // one cold start at a time: a runtime's start and /init do not overlap another's
                    // (whose prewarm would otherwise run meanwhile and count in the first one's /init)
                    for (Target t : targets) {
                        Runtime rt = Runtime.start(t.opts, t.jar, lang, work);
                        rts.add(rt);
                        rt.init(code);
                    }
                    List<List<Double>> times = new ArrayList<>();
                    List<Double> baseTimes = new ArrayList<>(), baseHttp = new ArrayList<>();
                    for (int i = 0; i < rts.size(); i++) times.add(new ArrayList<>());
                    long until = System.nanoTime() + (long) (warmSeconds * 1e9);
                    for (int round = 0; round < runs || System.nanoTime() - until < 0; round++) {
                        for (int i = 0; i < rts.size(); i++) {
                            times.get(i).add(rts.get(i).run());
                            rts.get(i).sampleCpu(last);
                        }
                        baseTimes.add(base.call());
                        if (served != null) baseHttp.add(served.run());
                        if (round > 0) continue;
                        // every first call was main's first in its process; the answers are checked after them
                        String expected = canonical(base.result());
                        Map<String, String> answers = new LinkedHashMap<>();
                        for (int i = 0; i < rts.size(); i++) answers.put(targets.get(i).label, rts.get(i).lastResult);
                        if (served != null) answers.put(base.what + " via HTTP", served.lastResult);
                        for (var a : answers.entrySet())
                            if (!canonical(a.getValue()).equals(expected))
                                throw new IllegalStateException(a.getKey() + "'s " + lang + " " + w.name + " answered " + a.getValue() + ", " + base.what + " " + expected);
                    }
                    double b = median(baseTimes, last), bh = http ? median(baseHttp, last) : Double.NaN;
                    StringBuilder row = new StringBuilder(String.format(Locale.ROOT, "| %s | %s | %s (%s) |", lang, w.name, fmt(b), base.what));
                    StringBuilder first = new StringBuilder(String.format(Locale.ROOT, "| %s | %s | %s |", lang, w.name, fmt(baseTimes.get(0))));
                    if (served != null) {
                        row.append(String.format(Locale.ROOT, " %s |", fmt(bh)));
                        first.append(String.format(Locale.ROOT, " %.0f | %s | %s | %s |", served.startMs, fmt(served.initMs), fmt(baseHttp.get(0)), ratio(baseHttp.get(0) / bh)));
                    }
                    for (int i = 0; i < rts.size(); i++) {
                        double m = median(times.get(i), last), f = times.get(i).get(0);
                        // hello's main does nothing: its time in process is no baseline for a call through HTTP
                        row.append(String.format(Locale.ROOT, " %s | %s |", fmt(m), w.name.equals("hello") ? "" : String.format(Locale.ROOT, "%.2fx", m / b)));
                        first.append(String.format(Locale.ROOT, " %.0f | %s | %s |", rts.get(i).initMs, fmt(f), ratio(f / m)));
                        if (served != null) {
                            row.append(String.format(Locale.ROOT, " %.2fx |", m / bh));
                            first.append(String.format(Locale.ROOT, " %s |", ratio(f / baseHttp.get(0))));
                        }
                        if (w.name.equals("hello")) {
                            Runtime rt = rts.get(i);
                            startRows.add(String.format(Locale.ROOT, "| %s | %s | %.0f | %.0f | %.1f | %.0f |", lang, targets.get(i).label,
                                    rt.startMs, rt.initMs, f, rt.rssMb()));
                        }
                    }
                    System.out.println(row.append(String.format(Locale.ROOT, " %s-%s, %d rounds |", load0, loadAverage(), baseTimes.size())));
                    firstRows.add(first.toString());
                    for (int i = 0; i < rts.size(); i++) {
                        double[] c = rts.get(i).cpuPerCall();
                        cpuRows.add(String.format(Locale.ROOT, "| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |", lang, w.name, targets.get(i).label,
                                c[0], c[1], c[2], c[3], c[4], c[0] + c[1] + c[2] + c[3] + c[4]));
                    }
                } finally {
                    for (Runtime rt : rts) rt.stop();
                }
            }
        }
        System.out.println();
        System.out.println("# first call: /init, then the first /run after it (ms), and its ratio to the warm call; the baseline's first call in a fresh process"
                + (http ? "; via HTTP: a fresh process's start to listening, its /init (the code is in already), its first /run (ms), and its ratio to its warm call" : ""));
        System.out.println(firstHead);
        System.out.println(firstSep);
        firstRows.forEach(System.out::println);
        System.out.println();
        System.out.println("# where the runtime's CPU went over the last calls (ms of CPU per /run, from /proc's per-thread times, 10 ms ticks):"
                + " the worker thread that runs the function, Truffle's compiler threads, HotSpot's C1/C2, GC, the rest (HTTP, the JVM)");
        System.out.println("| language | workload | runtime | worker | Truffle compiler | HotSpot JIT | GC | other | process |");
        System.out.println("|---|---|---|---:|---:|---:|---:|---:|---:|");
        cpuRows.forEach(System.out::println);
        if (!startRows.isEmpty()) {
            System.out.println();
            System.out.println("# hello-world, a fresh runtime each (cold): start-up to listening, /init, first /run (ms), RSS after the warm calls (MB)");
            System.out.println("| language | runtime | start-up | /init | first /run | RSS MB |");
            System.out.println("|---|---|---:|---:|---:|---:|");
            startRows.forEach(System.out::println);
        }
        if (density) Density.run(targets, languages, functions, pauseMs, warmSeconds, work);
        printResent();
    }

    /** JSON without the whitespace outside strings (python3's json.dumps puts a space after ',' and ':'). */
    static String canonical(String json) {
        StringBuilder b = new StringBuilder();
        boolean str = false, esc = false;
        for (char c : json.strip().toCharArray()) {
            if (str) {
                b.append(c);
                if (esc) esc = false;
                else if (c == '\\') esc = true;
                else if (c == '"') str = false;
            } else if (!Character.isWhitespace(c)) {
                b.append(c);
                if (c == '"') str = true;
            }
        }
        return b.toString();
    }

    static String fmt(double ms) {
        return ms >= 100 ? String.format(Locale.ROOT, "%.0f", ms) : ms >= 1 ? String.format(Locale.ROOT, "%.2f", ms) : String.format(Locale.ROOT, "%.3f", ms);
    }

    /** A first call's ratio: whole above 10, one decimal below (a first call can be shorter than the warm median on a loaded machine). */
    static String ratio(double r) {
        return String.format(Locale.ROOT, r >= 10 ? "%.0fx" : "%.1fx", r);
    }

    static String loadAverage() {
        try {
            return Files.readString(Path.of("/proc/loadavg")).split(" ")[0];
        } catch (IOException e) {
            return "?";
        }
    }

    /** The image's JVM options with the JIT's (image/jvm-options, then image/jvm-options-jit). */
    static List<String> jitOptions(Path imageDir, Path jar) throws IOException {
        List<String> o = options(imageDir.resolve("jvm-options"), jar);
        o.addAll(options(imageDir.resolve("jvm-options-jit"), jar));
        return o;
    }

    /** An options file as the image has it, with the image's /opt/cpuslot/ read as the jar's directory. */
    static List<String> options(Path file, Path jar) throws IOException {
        String home = jar.toAbsolutePath().getParent() + "/";
        List<String> out = new ArrayList<>();
        for (String l : Files.readAllLines(file)) if (!l.isBlank()) out.add(l.strip().replace("/opt/cpuslot/", home));
        return out;
    }

    /** The median of the last {@code last} values. */
    static double median(List<Double> t, int last) {
        double[] tail = t.subList(t.size() - last, t.size()).stream().mapToDouble(Double::doubleValue).sorted().toArray();
        return tail.length % 2 == 1 ? tail[tail.length / 2] : (tail[tail.length / 2 - 1] + tail[tail.length / 2]) / 2;
    }

    /** A function's code with the baseline's harness appended (a resource beside this class: baseline.js, baseline.py), in a file of its own. */
    static Path harness(String lang, String code, Path work) throws IOException {
        boolean js = lang.equals("javascript");
        String name = js ? "baseline.js" : "baseline.py";
        try (var r = GuestBench.class.getResourceAsStream(name)) {
            if (r == null) throw new IOException("no resource " + name + " beside GuestBench");
            Path f = Files.createTempFile(work, "baseline", js ? ".js" : ".py");
            Files.writeString(f, code + "\n" + new String(r.readAllBytes(), StandardCharsets.UTF_8));
            return f;
        }
    }

    static String baselineCommand(String lang) {
        return lang.equals("javascript") ? "node" : "python3";
    }

    /** The same code in node or python3, its main called once per line on stdin; each call's own time (ms) on stdout. */
    static final class Baseline implements AutoCloseable {
        final Process proc;
        final Writer in;
        final BufferedReader out;
        final String what;

        Baseline(String lang, Path harness) throws IOException {
            what = baselineCommand(lang);
            proc = new ProcessBuilder(what, harness.toString()).redirectErrorStream(true).start();
            in = new OutputStreamWriter(proc.getOutputStream(), StandardCharsets.UTF_8);
            out = new BufferedReader(new InputStreamReader(proc.getInputStream(), StandardCharsets.UTF_8));
        }

        double call() throws IOException {
            return Double.parseDouble(send(""));
        }

        /** main's result, as the language's own JSON serializer writes it. */
        String result() throws IOException {
            return send("r");
        }

        private String send(String line) throws IOException {
            in.write(line + "\n");
            in.flush();
            String l = out.readLine();
            if (l != null && (!line.isEmpty() || l.matches("[0-9.eE+-]+"))) return l;
            throw new IllegalStateException(what + " failed: " + l + "\n" + new String(proc.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
        }

        @Override
        public void close() {
            proc.destroyForcibly();
        }
    }

    /**
     * The same code served as an action container serves it, by node's http module or python3's
     * http.server (single-threaded) in a fresh process of its own: POST /run with the request /run
     * of the runtime gets, so that a call's round trip (ms, the same client) compares like with like,
     * and the first /run is main's first call in that process.
     */
    static final class HttpBaseline implements AutoCloseable {
        final Process proc;
        final Path log;
        final int port;
        final double startMs, initMs;
        String lastResult;

        HttpBaseline(String lang, Path harness, Path work) throws Exception {
            log = Files.createTempFile(work, "baseline-http", ".log");
            long t0 = System.nanoTime();
            // stdin empty: a harness that does not serve ends instead of waiting for calls there
            proc = new ProcessBuilder(baselineCommand(lang), harness.toString(), "http").redirectInput(ProcessBuilder.Redirect.from(new java.io.File("/dev/null")))
                    .redirectErrorStream(true).redirectOutput(log.toFile()).start();
            port = awaitPort(proc, log, baselineCommand(lang) + " serving " + harness.getFileName());
            startMs = (System.nanoTime() - t0) / 1e6;
            // an /init first, as the runtime gets (the code is in already): the first /run then finds the connection made
            long t1 = System.nanoTime();
            post(port, "/init", "{\"value\":{}}", log);
            initMs = (System.nanoTime() - t1) / 1e6;
        }

        /** One /run; its round trip in ms. */
        double run() throws Exception {
            long s = System.nanoTime();
            lastResult = post(port, "/run", RUN_BODY, log);
            return (System.nanoTime() - s) / 1e6;
        }

        @Override
        public void close() {
            proc.destroyForcibly();
        }
    }

    /** The body of every /run: the runtime's and the HTTP baseline's. */
    static final String RUN_BODY = "{\"value\":{}}";

    /** The port of "listening on :PORT" in a process's log, waited for up to TIMEOUT; the log in the error if it exits or never listens. */
    static int awaitPort(Process p, Path log, String what) throws Exception {
        long until = System.nanoTime() + TIMEOUT.toNanos();
        while (System.nanoTime() - until < 0) {
            Matcher m = LISTENING.matcher(Files.readString(log));
            if (m.find()) return Integer.parseInt(m.group(1));
            if (!p.isAlive()) throw new IllegalStateException(what + " exited: " + Files.readString(log));
            Thread.sleep(5);
        }
        p.destroyForcibly();
        throw new IllegalStateException(what + " did not listen within " + TIMEOUT + ": " + Files.readString(log));
    }

    /** A POST's answer; anything but 200 fails with the answer and the server's log. */
    static String post(int port, String path, String body, Path log) throws Exception {
        HttpResponse<String> r = send(port, path, HttpRequest.BodyPublishers.ofString(body));
        if (r.statusCode() != 200)
            throw new IllegalStateException(path + ": " + r.statusCode() + " " + r.body() + "\nlog:\n" + Files.readString(log));
        return r.body();
    }

    /** Requests sent twice: their answer went to the JDK client's pool ({@link #send}). */
    static final java.util.concurrent.atomic.AtomicInteger RESENT = new java.util.concurrent.atomic.AtomicInteger();

    /** At the end of a run: how many requests were sent again, if any. */
    private static void printResent() {
        if (RESENT.get() > 0) System.out.printf("%n# requests sent again after the JDK client lost their answer to its pool: %d%n", RESENT.get());
    }

    /**
     * POSTs {@code body} to {@code path} on localhost. The JDK client's HTTP/1.1 pool can still hand
     * a reused connection's answer to its idle watcher ("Data received while in pool", JDK-8357639;
     * once in a Density run of 2026-12-01, on Temurin 25.0.3): the server has answered, the client
     * has lost it. Such a request is sent again, once, and counted (printed at the end of a run).
     */
    static HttpResponse<String> send(int port, String path, HttpRequest.BodyPublisher body) throws Exception {
        HttpRequest req = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path)).timeout(TIMEOUT).POST(body).build();
        try {
            return HTTP.send(req, HttpResponse.BodyHandlers.ofString());
        } catch (java.io.IOException e) {
            if (!lostToPool(e)) throw e;
            RESENT.incrementAndGet();
            return HTTP.send(req, HttpResponse.BodyHandlers.ofString());
        }
    }

    private static boolean lostToPool(Throwable e) {
        for (; e != null; e = e.getCause()) if ("Data received while in pool".equals(e.getMessage())) return true;
        return false;
    }

    /** One runtime process, as the image starts it, for one action. */
    static final class Runtime {
        final Process proc;
        final Path log;
        final int port;
        final double startMs;
        double initMs;

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
            int port = awaitPort(p, log, "the runtime");
            return new Runtime(p, log, port, (System.nanoTime() - t0) / 1e6);
        }

        void init(String code) throws Exception {
            long t0 = System.nanoTime();
            post(port, "/init", "{\"value\":{\"name\":\"bench\",\"main\":\"main\",\"code\":" + quote(code) + "}}", log);
            initMs = (System.nanoTime() - t0) / 1e6;
        }

        /** The last /run's answer. */
        String lastResult;

        /** One /run; its round trip in ms. */
        double run() throws Exception {
            long s = System.nanoTime();
            lastResult = post(port, "/run", RUN_BODY, log);
            return (System.nanoTime() - s) / 1e6;
        }

        /** Per-thread CPU samples (ms by group: worker, Truffle compiler, HotSpot JIT, GC, other), one per round, the last few. */
        private final java.util.ArrayDeque<double[]> cpu = new java.util.ArrayDeque<>();

        void sampleCpu(int last) {
            double[] g = new double[5];
            try (var tasks = Files.list(Path.of("/proc/" + proc.pid() + "/task"))) {
                for (Path t : (Iterable<Path>) tasks::iterator) {
                    try {
                        String comm = Files.readString(t.resolve("comm")).strip(), stat = Files.readString(t.resolve("stat"));
                        String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
                        double ms = (Long.parseLong(f[11]) + Long.parseLong(f[12])) * 10.0; // utime + stime, 100 ticks a second
                        int k = comm.startsWith("fn-") ? 0 : comm.startsWith("TruffleCompiler") ? 1 : comm.startsWith("C1 Compiler") || comm.startsWith("C2 Compiler") ? 2
                                : comm.startsWith("GC ") || comm.startsWith("G1 ") || comm.startsWith("VM Periodic") ? 3 : 4;
                        g[k] += ms;
                    } catch (IOException | RuntimeException gone) { // a thread that ended meanwhile
                    }
                }
            } catch (IOException e) {
                return;
            }
            cpu.addLast(g);
            while (cpu.size() > last + 1) cpu.removeFirst();
        }

        /** CPU ms per call by group over the sampled calls (threads that ended in between are missing from the later sample). */
        double[] cpuPerCall() {
            double[] a = cpu.peekFirst(), b = cpu.peekLast(), r = new double[5];
            if (a == null || cpu.size() < 2) return r;
            for (int k = 0; k < 5; k++) r[k] = Math.max(0, b[k] - a[k]) / (cpu.size() - 1);
            return r;
        }

        double rssMb() throws IOException {
            for (String l : Files.readAllLines(Path.of("/proc/" + proc.pid() + "/status")))
                if (l.startsWith("VmRSS:")) return Long.parseLong(l.replaceAll("\\D", "")) / 1024.0;
            return Double.NaN;
        }

        void stop() throws InterruptedException {
            proc.destroy();
            if (!proc.waitFor(30, java.util.concurrent.TimeUnit.SECONDS)) proc.destroyForcibly();
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
