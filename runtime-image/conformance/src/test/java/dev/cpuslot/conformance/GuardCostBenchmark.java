package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * What containing a Java function costs, side by side in one run: the same action in a
 * runtime as its image starts it (the guard on: bytecode checked and rewritten at /init, a poll
 * at every backward branch, file paths checked) and in one with {@code CPUSLOT_JAVA_TRUSTED=true}
 * (the trusted mode: no refusals, no polls, no path checks), both alive at once and invoked in
 * alternating rounds. Reports the first invocation (/init and the first /run), warm hello /run
 * p50/p99 (HTTP round trip from this process), a CPU-bound loop /run p50 (the polls' cost), a
 * file write and read in the function's own directory (the path checks' cost), and the runtime's
 * resident memory after the rounds. Not a test (no bound is asserted): run it by name,
 * {@code ./build.sh -DskipTests package && ./build.sh -pl conformance -am -Dtest=GuardCostBenchmark
 * -Dsurefire.failIfNoSpecifiedTests=false -Dguard.bench.rounds=10 test}; the table goes to stdout
 * and to target/guard-cost.md. With {@code -Dguard.bench.baseline.jar=JAR} the second runtime is
 * another build's (guarded too), for this build against that one; {@code print} times an
 * activation that prints 21 lines (its output held and written as one block).
 */
class GuardCostBenchmark {
    static final String ACTION = """
            String what = args.has("what") ? args.get("what").getAsString() : "hello";
            switch (what) {
                case "loop" -> {
                    long s = 0;
                    for (int i = 0; i < 20_000_000; i++) s += i ^ (s >>> 3);
                    args.addProperty("s", s);
                }
                case "file" -> {
                    Path f = Path.of(System.getProperty("java.io.tmpdir"), "f.txt");
                    for (int i = 0; i < 100; i++) {
                        Files.writeString(f, "x" + i);
                        args.addProperty("r", Files.readString(f));
                    }
                }
                case "idle" -> java.util.concurrent.Executors.newFixedThreadPool(1).submit(() -> { }); // an idle thread stays
                case "print" -> {
                    for (int i = 0; i < 20; i++) System.out.println("line " + i + " of this activation's log");
                    System.err.println("and one on stderr");
                }
                default -> args.addProperty("greeting", "hello");
            }
            return args;""";

    @Test
    void guardedAgainstTrusted() throws Exception {
        int rounds = Integer.getInteger("guard.bench.rounds", 10), calls = Integer.getInteger("guard.bench.calls", 50);
        String jar = JavaContainmentTest.probe(ACTION);
        // -Dguard.bench.baseline.jar=JAR: against another build's runtime (guarded too) instead of the trusted mode
        String baseline = System.getProperty("guard.bench.baseline.jar", "");
        Map<String, String> otherEnv = baseline.isEmpty() ? env("CPUSLOT_JAVA_TRUSTED", "true") : Map.of();
        String otherJar = baseline.isEmpty() ? System.getProperty("cpuslot.runtime.jar") : baseline;
        with("java", guarded -> with("java", otherEnv, otherJar, trusted -> {
            ActionContainer[] cs = {guarded, trusted};
            String[] names = {"guarded (as the image starts it)", baseline.isEmpty() ? "trusted (CPUSLOT_JAVA_TRUSTED=true)" : "baseline (" + baseline + ")"};
            long[] first = new long[2];
            for (int k : new int[]{1, 0}) { // trusted first: the guarded side gets the warmer machine
                long t0 = System.nanoTime();
                assertEquals(200, cs[k].init(JavaContainmentTest.init(jar)).code());
                assertEquals(200, cs[k].run(runPayload(new JsonObject())).code());
                first[k] = System.nanoTime() - t0;
            }
            List<List<Long>> hello = List.of(new ArrayList<>(), new ArrayList<>()), loop = List.of(new ArrayList<>(), new ArrayList<>()),
                    file = List.of(new ArrayList<>(), new ArrayList<>()), print = List.of(new ArrayList<>(), new ArrayList<>());
            for (int r = -2; r < rounds; r++) { // rounds -2 and -1 warm up, not counted
                for (int k : r % 2 == 0 ? new int[]{0, 1} : new int[]{1, 0}) {
                    for (int i = 0; i < calls; i++) time(cs[k], "hello", r < 0 ? null : hello.get(k));
                    time(cs[k], "loop", r < 0 ? null : loop.get(k));
                    time(cs[k], "file", r < 0 ? null : file.get(k));
                    for (int i = 0; i < calls / 5; i++) time(cs[k], "print", r < 0 ? null : print.get(k));
                }
            }
            // an ended activation's idle executor thread stays alive: the guard keeps the poll on while it lives
            List<List<Long>> held = List.of(new ArrayList<>(), new ArrayList<>());
            for (ActionContainer c : cs) time(c, "idle", null);
            for (int r = -1; r < rounds; r++) {
                for (int k : r % 2 == 0 ? new int[]{0, 1} : new int[]{1, 0}) time(cs[k], "loop", r < 0 ? null : held.get(k));
            }
            StringBuilder t = new StringBuilder("| runtime | first /init + /run | hello p50 | hello p99 | loop p50 | loop p50, a thread of an ended activation alive | file p50 | print p50 | RSS after |\n|---|---|---|---|---|---|---|---|---|\n");
            for (int k = 0; k < 2; k++) {
                t.append(String.format("| %s | %.0f ms | %.2f ms | %.2f ms | %.1f ms | %.1f ms | %.2f ms | %.2f ms | %d MiB |%n", names[k], first[k] / 1e6,
                        ChainBenchmark.pct(hello.get(k), 50) / 1e6, ChainBenchmark.pct(hello.get(k), 99) / 1e6,
                        ChainBenchmark.pct(loop.get(k), 50) / 1e6, ChainBenchmark.pct(held.get(k), 50) / 1e6, ChainBenchmark.pct(file.get(k), 50) / 1e6,
                        ChainBenchmark.pct(print.get(k), 50) / 1e6, rssMiB(cs[k].pid())));
            }
            t.append(String.format("%nratio guarded / %s: first %.2fx, hello p50 %.2fx, p99 %.2fx, loop p50 %.2fx (with a thread of an ended activation alive %.2fx), file p50 %.2fx, print p50 %.2fx (%d rounds, %d hello calls each, alternating)%n",
                    baseline.isEmpty() ? "trusted" : "baseline", first[0] / (double) first[1], ratio(hello, 50), ratio(hello, 99),
                    ratio(loop, 50), ratio(held, 50), ratio(file, 50), ratio(print, 50), rounds, calls));
            System.out.println(t);
            Files.writeString(Path.of("target", "guard-cost.md"), t);
        }));
    }

    static void time(ActionContainer c, String what, List<Long> into) throws Exception {
        JsonObject a = new JsonObject();
        a.addProperty("what", what);
        long t0 = System.nanoTime();
        Reply r = c.run(runPayload(a));
        long ns = System.nanoTime() - t0;
        assertEquals(200, r.code(), what + ": " + r.raw());
        if (into != null) into.add(ns);
    }

    static double ratio(List<List<Long>> v, int p) {
        return ChainBenchmark.pct(v.get(0), p) / (double) ChainBenchmark.pct(v.get(1), p);
    }

    static long rssMiB(long pid) throws Exception {
        for (String l : Files.readAllLines(Path.of("/proc/" + pid + "/status"))) {
            if (l.startsWith("VmRSS:")) return Long.parseLong(l.replaceAll("\\D", "")) / 1024;
        }
        return -1;
    }
}
