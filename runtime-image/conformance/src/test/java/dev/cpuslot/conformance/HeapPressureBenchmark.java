package dev.cpuslot.conformance;

import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

import static dev.cpuslot.conformance.ActionContainer.*;
import static dev.cpuslot.conformance.JavaContainmentTest.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * A bystander's hello while one function misbehaves with the heap, in one runtime as its image
 * starts it (with a heap of {@code -Dheap.bench.xmx}, 256m, as a container's memory limit would
 * set it): quiet, during a {@code System.gc()} storm (5 s), during an allocation storm (garbage,
 * 5 s), while a hog keeps a tenth of the heap at every call until the guard stops it, and after
 * that with the hog's heap still held. Reports the bystander's p50/p99 in each phase and their
 * ratio to the quiet one, and what the runtime's log attributes to each function (alloc_bytes).
 * Not a test (no bound is asserted): run it by name, {@code ./build.sh -DskipTests package &&
 * ./build.sh -pl conformance -am -Dtest=HeapPressureBenchmark -Dsurefire.failIfNoSpecifiedTests=false
 * test}; the table goes to stdout and to target/heap-pressure.md.
 */
class HeapPressureBenchmark {
    static final String GC_STORM = """
            long until = System.nanoTime() + 5_000_000_000L;
            int n = 0;
            while (System.nanoTime() < until) { System.gc(); n++; }
            args.addProperty("calls", n);
            return args;""";
    static final String ALLOC_STORM = """
            long until = System.nanoTime() + 5_000_000_000L;
            long n = 0;
            Object keep = null;
            while (System.nanoTime() < until) { keep = new byte[64 << 10]; n++; }
            args.addProperty("arrays", n);
            args.addProperty("last", ((byte[]) keep).length);
            return args;""";

    @Test
    void bystanderHelloWhileOneFunctionMisbehaves() throws Exception {
        String xmx = System.getProperty("heap.bench.xmx", "256m");
        int quietCalls = Integer.getInteger("heap.bench.quiet", 200);
        String hello = probe(HeapPressureTest.HELLO), gc = probe(GC_STORM), storm = probe(ALLOC_STORM), hog = probe(HeapPressureTest.HOG);
        with("java", env("JAVA_TOOL_OPTIONS", "-Xmx" + xmx), c -> {
            for (String[] f : new String[][]{{"hello", hello}, {"gc", gc}, {"storm", storm}, {"hog", hog}})
                assertEquals(200, register(c, f[0], jarFile(c, f[0], f[1]), null).code());
            for (int i = 0; i < 2000; i++) hello(c, null); // warm up (the JIT)
            List<String> rows = new ArrayList<>();
            List<Long> quiet = new ArrayList<>();
            for (String f : new String[]{"gc", "storm"}) {
                quiet = quiet(c, quietCalls, rows); // just before: the machine's load changes
                List<Long> during = new ArrayList<>();
                CompletableFuture<Reply> r = background(c, f);
                while (!r.isDone()) hello(c, during);
                Reply done = r.get(120, TimeUnit.SECONDS);
                rows.add(row(f.equals("gc") ? "System.gc() storm, 5 s" : "allocation storm (64 KiB garbage arrays), 5 s", during, quiet,
                        done.code() + " " + done.raw()));
            }
            // the hog: called again and again until the guard has refused it twice
            quiet = quiet(c, quietCalls, rows);
            List<Long> during = new ArrayList<>();
            List<String> hogReplies = new ArrayList<>();
            int[] refused = {0};
            BooleanSupplier more = () -> refused[0] < 2 && hogReplies.size() < 30;
            while (more.getAsBoolean()) {
                CompletableFuture<Reply> r = background(c, "hog");
                while (!r.isDone()) hello(c, during);
                Reply h = r.get(120, TimeUnit.SECONDS);
                hogReplies.add(String.valueOf(h.code()));
                if (h.code() != 200) refused[0]++;
                hello(c, during);
            }
            rows.add(row("a hog keeping a tenth of the heap at every call, until stopped", during, quiet, "hog replies " + hogReplies));
            List<Long> after = new ArrayList<>();
            for (int i = 0; i < quietCalls; i++) hello(c, after);
            rows.add(row("after: the hog's heap held (stopped)", after, quiet, ""));
            Thread.sleep(500); // the log writer is asynchronous
            String log = Files.readString(c.runtimeLog);
            StringBuilder t = new StringBuilder("bystander hello (Hydra POST /, HTTP round trip from this process), -Xmx" + xmx
                    + "; each phase's ratios are to the quiet row just before it\n\n"
                    + "| while | calls | p50 | p99 | p50 / quiet | p99 / quiet | the misbehaving call |\n|---|---|---|---|---|---|---|\n");
            rows.forEach(t::append);
            t.append("\nlargest alloc_bytes of one activation in the runtime's log:");
            for (String f : new String[]{"hello", "gc", "storm", "hog"})
                t.append(String.format(" %s %.1f MiB;", f, HeapPressureTest.maxAlloc(log, f) / 1048576.0));
            t.append('\n');
            System.out.println(t);
            Files.writeString(Path.of("target", "heap-pressure.md"), t);
        });
    }

    static List<Long> quiet(ActionContainer c, int calls, List<String> rows) throws Exception {
        List<Long> quiet = new ArrayList<>();
        for (int i = 0; i < calls; i++) hello(c, quiet);
        rows.add(row("quiet", quiet, quiet, ""));
        return quiet;
    }

    static CompletableFuture<Reply> background(ActionContainer c, String f) {
        return CompletableFuture.supplyAsync(() -> {
            try {
                return invoke(c, f);
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        });
    }

    static void hello(ActionContainer c, List<Long> into) throws Exception {
        long t0 = System.nanoTime();
        Reply r = invoke(c, "hello");
        long ns = System.nanoTime() - t0;
        assertEquals(200, r.code(), "the bystander: " + r.raw());
        if (into != null) into.add(ns);
    }

    static String row(String what, List<Long> v, List<Long> quiet, String note) {
        return String.format("| %s | %d | %.2f ms | %.2f ms | %.2fx | %.2fx | %s |%n", what, v.size(),
                ChainBenchmark.pct(v, 50) / 1e6, ChainBenchmark.pct(v, 99) / 1e6,
                ChainBenchmark.pct(v, 50) / (double) ChainBenchmark.pct(quiet, 50),
                ChainBenchmark.pct(v, 99) / (double) ChainBenchmark.pct(quiet, 99),
                note.length() > 160 ? note.substring(0, 160) + "..." : note);
    }
}
