package dev.cpuslot.conformance;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.util.ArrayList;
import java.util.List;

import static dev.cpuslot.conformance.ActionContainer.*;
import static dev.cpuslot.conformance.JavaContainmentTest.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Heap pressure from one function is bounded and attributed, against the runtime as its image
 * starts it (a small heap, so that it fills in a few calls): a function that keeps a little under
 * its share of the heap in its statics at every call is stopped with its own typed error before
 * the heap is full, a bystander answers throughout, and every activation's allocation is in its
 * log line. (The numbers, a bystander's hello quiet and while one function misbehaves:
 * {@link HeapPressureBenchmark}.)
 */
@DisplayName("Heap pressure from one function")
class HeapPressureTest {
    /** Keeps a tenth of the heap (below the guard's share, an eighth) in a static at every call, in 1 MiB arrays. */
    static final String HOG = """
                long want = Runtime.getRuntime().maxMemory() / 10;
                for (long got = 0; got < want; got += 1 << 20) HOLD.add(new long[1 << 17]);
                args.addProperty("held", HOLD.size());
                return args;
                }
                static final List<long[]> HOLD = new ArrayList<>();
                static {""";
    static final String HELLO = "JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;";

    /**
     * Each call keeps less than the share one activation may allocate under pressure, so the
     * per-activation rule alone never stops it: the heap filled call after call until the JVM's own
     * "Java heap space" hit whichever thread allocated next (the hog, a bystander, or a runtime
     * thread, which exits the process). Now what a function allocated since the heap was last half
     * empty counts over its activations: its next call fails with the guard's OutOfMemoryError,
     * and so do the ones after it while the heap stays full, the bystander is served throughout.
     */
    @Test
    void aFunctionKeepingJustUnderItsShareAtEveryCallIsStoppedBeforeTheHeapIsFull() throws Exception {
        String hog = probe(HOG), hello = probe(HELLO);
        with("java", env("JAVA_TOOL_OPTIONS", "-Xmx256m"), c -> {
            assertEquals(200, register(c, "hog", jarFile(c, "hog", hog), null).code());
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            List<String> hogReplies = new ArrayList<>();
            int stoppedAt = -1;
            for (int i = 0; i < 14 && stoppedAt < 0; i++) {
                Reply h = invoke(c, "hog");
                hogReplies.add(h.code() + " " + h.raw());
                if (h.code() != 200) {
                    assertEquals(502, h.code(), String.valueOf(h.raw()));
                    assertTrue(h.raw().toString().contains("OutOfMemoryError") && h.raw().toString().contains("its share"),
                            "the hog's call " + i + " should fail with the guard's OutOfMemoryError, not the JVM's: " + hogReplies);
                    stoppedAt = i;
                }
                Reply b = invoke(c, "hello");
                assertEquals(200, b.code(), "the bystander after the hog's call " + i + ": " + b.raw() + "; the hog's replies: " + hogReplies);
            }
            assertTrue(stoppedAt > 0, "the hog was never stopped (14 calls of a tenth of the heap each): " + hogReplies);
            // bounded: while the heap stays full, its next call fails too, and the runtime serves
            Reply again = invoke(c, "hog");
            assertEquals(502, again.code(), "the hog's next call while the heap is nearly full: " + again.raw());
            assertTrue(again.raw().toString().contains("its share"), String.valueOf(again.raw()));
            for (int i = 0; i < 5; i++) assertEquals(200, invoke(c, "hello").code(), "the bystander after the hog was stopped");
            assertAlive(c);
            // attributed: each activation's log line says what its worker allocated
            Thread.sleep(500); // the log writer is asynchronous; no bound on its content below
            String log = Files.readString(c.runtimeLog);
            long hogAlloc = maxAlloc(log, "hog"), helloAlloc = maxAlloc(log, "hello");
            assertTrue(hogAlloc >= 20L << 20, // a tenth of 256 MiB
                    "the hog's activations' alloc_bytes (largest " + hogAlloc + ") in the runtime's log");
            assertTrue(helloAlloc > 0 && helloAlloc < hogAlloc / 10, "the bystander's alloc_bytes (largest " + helloAlloc + ")");
        });
    }

    /** The largest alloc_bytes of the function's activation lines in the runtime's log (-1: none). */
    static long maxAlloc(String log, String function) {
        long max = -1;
        for (String l : log.split("\n")) {
            if (!l.contains("action=" + function + " ")) continue;
            var m = java.util.regex.Pattern.compile("alloc_bytes=(\\d+)").matcher(l);
            if (m.find()) max = Math.max(max, Long.parseLong(m.group(1)));
        }
        return max;
    }
}
