package dev.cpuslot.bench;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.jar.JarEntry;
import java.util.jar.JarOutputStream;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Memory per function, and a new function's first call, per language: one runtime (Hydra's
 * {@code /register}), one hello-world function registered and called, then {@code N} more, each
 * registered and called once; resident memory, Java heap in use and metaspace after a full GC,
 * before and after the {@code N}, divided by {@code N}. Before the {@code N}, the first function is
 * called for {@code warmSeconds}: the new functions arrive in a runtime that has been serving (its
 * HTTP path, pool and wrapper compiled), the case co-location is for, not in one that has answered
 * one call; a new function's first call is then set against its own warm call in that runtime.
 * Beside it, in the same run, the same function in its own process (node, python3, a JVM), called
 * once: what a function costs when each runs alone, and its cold start (process start to the first
 * call's answer).
 */
final class Density {
    private Density() {}

    static final String NAME = "memory";
    /** A function's warm call: the median of the last of this many calls of the last function added. */
    private static final int WARM_CALLS = 2000;

    static final String JAVA_HELLO = """
            import java.util.Map;
            public class Hello {
                public static Map<String, Object> main(Map<String, Object> args) { return Map.of("hello", "world"); }
                public static void main(String[] a) throws Exception { // the baseline: one call per line on stdin
                    var in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
                    while (in.readLine() != null) {
                        long s = System.nanoTime();
                        main(Map.of());
                        System.out.println((System.nanoTime() - s) / 1e6);
                    }
                }
            }
            """;

    static void run(List<GuestBench.Target> targets, List<String> languages, int n, long pauseMs, double warmSeconds, Path work) throws Exception {
        byte[] jar = helloJar(work);
        Path jarFile = work.resolve("hello.jar");
        Files.write(jarFile, jar);
        List<String> rows = new ArrayList<>(), firstRows = new ArrayList<>();
        List<String> langs = new ArrayList<>(languages);
        if (!langs.contains("java")) langs.add(0, "java");
        for (String lang : langs) {
            String load0 = GuestBench.loadAverage();
            // the baseline: the function alone in its own process, started and called once
            double[] base = baseline(lang, jarFile, work);
            for (GuestBench.Target t : targets) {
                GuestBench.Runtime rt = GuestBench.Runtime.start(t.opts(), t.jar(), lang, work);
                try {
                    register(rt, lang, "f0", jar);
                    invoke(rt, "f0");
                    for (long until = System.nanoTime() + (long) (warmSeconds * 1e9); System.nanoTime() - until < 0; ) invoke(rt, "f0");
                    double[] m0 = memory(rt);
                    double[] reg = new double[n], call = new double[n];
                    for (int i = 1; i <= n; i++) {
                        Thread.sleep(pauseMs); // functions arrive one at a time, not all at once
                        long s = System.nanoTime();
                        register(rt, lang, "f" + i, jar);
                        long r = System.nanoTime();
                        invoke(rt, "f" + i);
                        reg[i - 1] = (r - s) / 1e6;
                        call[i - 1] = (System.nanoTime() - r) / 1e6;
                    }
                    double[] m1 = memory(rt);
                    double next = pct(timedCalls(rt, "f" + n, 10), 50);
                    // the same function warm in the same runtime, for the first call's ratio
                    double[] warm = timedCalls(rt, "f" + n, WARM_CALLS);
                    double warmP50 = pct(java.util.Arrays.copyOfRange(warm, WARM_CALLS / 2, WARM_CALLS), 50);
                    rows.add(String.format(Locale.ROOT, "| %s | %s | %.0f | %.0f | %.2f | %.2f | %.3f | %.2f | %.1f (%s) | %.1fx | %s-%s |",
                            lang, t.label(), m0[0], m1[0], (m1[0] - m0[0]) / n, (m1[1] - m0[1]) / n, (m1[2] - m0[2]) / n, (m1[3] - m0[3]) / n,
                            base[0], what(lang), (m1[0] - m0[0]) / n / base[0], load0, GuestBench.loadAverage()));
                    firstRows.add(String.format(Locale.ROOT, "| %s | %s | %s | %s | %s | %s | %s | %s | %.0fx | %s (%s) | %s |",
                            lang, t.label(), GuestBench.fmt(pct(reg, 50)), GuestBench.fmt(pct(reg, 90)), GuestBench.fmt(pct(call, 50)),
                            GuestBench.fmt(pct(call, 90)), GuestBench.fmt(next), GuestBench.fmt(warmP50), pct(call, 50) / warmP50,
                            GuestBench.fmt(base[1]), what(lang), GuestBench.fmt(base[2])));
                } finally {
                    rt.stop();
                }
            }
        }
        System.out.println();
        System.out.println("# memory per function: one runtime (Hydra /register), RSS with one hello-world function registered and called,"
                + " then with " + n + " more, each called once; per added function: RSS, Java heap in use and metaspace after a full GC (MB), and threads;"
                + " the baseline: the same function alone in a fresh process, RSS after one call");
        System.out.println("| language | runtime | RSS 1 function MB | RSS " + (n + 1) + " functions MB | RSS per added function MB | heap per added function MB"
                + " | metaspace per added function MB | threads per added function | baseline process RSS MB | per function / baseline process | load |");
        System.out.println("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        rows.forEach(System.out::println);
        System.out.println();
        System.out.println("# a new function's first call (ms), in a runtime that served the first function for " + warmSeconds + " s: /register (code checked, its context made) and the first call after it, p50 and p90 over the "
                + n + " added functions, " + pauseMs + " ms apart; next 10: the last one's median of its next 10 calls, right after a full GC; warm: its median of the last " + WARM_CALLS / 2 + " of " + WARM_CALLS + " calls after those, through the same client; the baseline: process start to the first call's answer, and its warm call");
        System.out.println("| language | runtime | /register p50 | /register p90 | first call p50 | first call p90 | next 10 calls p50 | warm call p50 | first call p50 / warm | baseline cold start | baseline warm call |");
        System.out.println("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        firstRows.forEach(System.out::println);
    }

    static String what(String lang) {
        return switch (lang) {
            case "javascript" -> "node";
            case "python" -> "python3";
            default -> "java";
        };
    }

    /** The function alone in a fresh process: {RSS MB after one call, process start to the first answer ms, a warm call ms}. */
    static double[] baseline(String lang, Path jar, Path work) throws Exception {
        String code = hello(lang);
        long t0 = System.nanoTime();
        Process p;
        if (lang.equals("java")) {
            p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp", jar.toString(), "Hello")
                    .redirectErrorStream(true).start();
        } else {
            GuestBench.Baseline b = new GuestBench.Baseline(lang, GuestBench.harness(lang, code, work));
            p = b.proc;
        }
        try (var in = new java.io.BufferedReader(new java.io.InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
             var out = new java.io.OutputStreamWriter(p.getOutputStream(), StandardCharsets.UTF_8)) {
            out.write("\n");
            out.flush();
            String l = in.readLine();
            double cold = (System.nanoTime() - t0) / 1e6;
            if (l == null) throw new IllegalStateException(what(lang) + " exited before its first call");
            double[] w = new double[10];
            for (int k = 0; k < w.length; k++) {
                out.write("\n");
                out.flush();
                w[k] = Double.parseDouble(in.readLine());
            }
            return new double[]{rss(p.pid()) / 1024.0, cold, pct(w, 50)};
        } finally {
            p.destroyForcibly();
            p.waitFor(30, TimeUnit.SECONDS);
        }
    }

    static String hello(String lang) {
        return switch (lang) {
            case "javascript" -> "function main(args) { return { hello: 'world' }; }\n";
            case "python" -> "def main(args):\n    return {'hello': 'world'}\n";
            default -> JAVA_HELLO;
        };
    }

    static void register(GuestBench.Runtime rt, String lang, String name, byte[] jar) throws Exception {
        byte[] body = lang.equals("java") ? jar : hello(lang).getBytes(StandardCharsets.UTF_8);
        String q = "/register?name=" + name + "&language=" + lang + "&entryPoint=" + (lang.equals("java") ? "Hello" : "main");
        send(rt, q, HttpRequest.BodyPublishers.ofByteArray(body));
    }

    /** n calls of a function, each one's round trip in ms. */
    static double[] timedCalls(GuestBench.Runtime rt, String name, int n) throws Exception {
        double[] t = new double[n];
        for (int k = 0; k < n; k++) {
            long s = System.nanoTime();
            invoke(rt, name);
            t[k] = (System.nanoTime() - s) / 1e6;
        }
        return t;
    }

    static void invoke(GuestBench.Runtime rt, String name) throws Exception {
        send(rt, "/", HttpRequest.BodyPublishers.ofString("{\"name\":" + GuestBench.quote(name) + ",\"arguments\":\"{}\"}"));
    }

    private static void send(GuestBench.Runtime rt, String path, HttpRequest.BodyPublisher body) throws Exception {
        HttpResponse<String> r = GuestBench.send(rt.port, path, body);
        if (r.statusCode() != 200)
            throw new IllegalStateException(path + ": " + r.statusCode() + " " + r.body() + "\nruntime log:\n" + Files.readString(rt.log));
    }

    private static final Pattern HEAP = Pattern.compile("heap .*used (\\d+)K");

    /** {RSS, heap in use, metaspace in use} in MB, after a full GC (jcmd), and the process's threads. */
    static double[] memory(GuestBench.Runtime rt) throws Exception {
        jcmd(rt.proc.pid(), "GC.run");
        String info = jcmd(rt.proc.pid(), "GC.heap_info");
        Matcher h = HEAP.matcher(info);
        if (!h.find()) throw new IllegalStateException("jcmd GC.heap_info said: " + info);
        return new double[]{rss(rt.proc.pid()) / 1024.0, Long.parseLong(h.group(1)) / 1024.0, metaspaceKb(rt.proc.pid()) / 1024.0, threads(rt.proc.pid())};
    }

    /** Metaspace in use (KB): jstat -gc's MU column. */
    static double metaspaceKb(long pid) throws Exception {
        Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "jstat").toString(), "-gc", Long.toString(pid))
                .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        p.waitFor(300, TimeUnit.SECONDS);
        String[] lines = out.strip().split("\n");
        if (lines.length >= 2) {
            List<String> head = List.of(lines[0].trim().split("\\s+"));
            String[] v = lines[1].trim().split("\\s+");
            int i = head.indexOf("MU");
            if (i >= 0 && i < v.length) return Double.parseDouble(v[i]);
        }
        throw new IllegalStateException("jstat -gc said: " + out);
    }

    static String jcmd(long pid, String what) throws Exception {
        Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "jcmd").toString(), Long.toString(pid), what)
                .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(300, TimeUnit.SECONDS) || p.exitValue() != 0) throw new IllegalStateException("jcmd " + what + " failed: " + out);
        return out;
    }

    static long rss(long pid) throws IOException {
        return status(pid, "VmRSS:");
    }

    /** Threads of the process: each has a stack and kernel state of its own, whatever it runs. */
    static long threads(long pid) throws IOException {
        return status(pid, "Threads:");
    }

    private static long status(long pid, String field) throws IOException {
        for (String l : Files.readAllLines(Path.of("/proc/" + pid + "/status")))
            if (l.startsWith(field)) return Long.parseLong(l.replaceAll("\\D", ""));
        throw new IllegalStateException("no " + field + " for " + pid);
    }

    static double pct(double[] v, int p) {
        double[] s = v.clone();
        java.util.Arrays.sort(s);
        return s[Math.min(s.length - 1, (int) Math.ceil(p / 100.0 * s.length) - 1)];
    }

    /** Hello.class in a jar, compiled here (the bench runs on a JDK). */
    static byte[] helloJar(Path work) throws Exception {
        Path src = work.resolve("Hello.java");
        Files.writeString(src, JAVA_HELLO);
        var javac = javax.tools.ToolProvider.getSystemJavaCompiler();
        if (javac == null || javac.run(null, null, null, "--release", "21", "-d", work.toString(), src.toString()) != 0)
            throw new IllegalStateException("cannot compile the Java hello-world (needs a JDK)");
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        try (JarOutputStream j = new JarOutputStream(b)) {
            j.putNextEntry(new JarEntry("Hello.class"));
            j.write(Files.readAllBytes(work.resolve("Hello.class")));
            j.closeEntry();
        }
        return b.toByteArray();
    }
}
