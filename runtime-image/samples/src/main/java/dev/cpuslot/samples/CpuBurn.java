package dev.cpuslot.samples;

import com.google.gson.JsonObject;

import java.util.ArrayList;
import java.util.List;

/**
 * CPU-bound for a fixed wall time, on one or more threads (the isolation experiments' workload):
 * {@code {"ms": 10000, "threads": 1}} (and {@code "name"}: its helper threads' name, numbered). Each thread spins doing integer work until the wall-clock
 * deadline; the reply says how long it was asked to run and ran, and how many loop iterations each
 * thread got through.
 * Threads the function starts inherit its CPU slot, so a 10-thread invocation gets the same
 * quota as a 1-thread one.
 */
public class CpuBurn {
    static long spin(long deadlineNanos) {
        long iterations = 0, x = 1;
        while (System.nanoTime() < deadlineNanos) {
            for (int i = 0; i < 10_000; i++) x = x * 6364136223846793005L + 1442695040888963407L;
            iterations++;
        }
        return iterations + (x == 42 ? 1 : 0); // keep x alive
    }

    public static JsonObject main(JsonObject args) throws InterruptedException {
        long ms = args.has("ms") ? args.get("ms").getAsLong() : 1000;
        int threads = args.has("threads") ? args.get("threads").getAsInt() : 1;
        if (ms < 0 || ms > 600_000) throw new IllegalArgumentException("ms must be within 0..600000");
        if (threads < 1 || threads > 64) throw new IllegalArgumentException("threads must be within 1..64");
        String name = args.has("name") ? args.get("name").getAsString() : "cpuburn-";
        long t0 = System.nanoTime();
        long deadline = t0 + ms * 1_000_000L;
        long[] its = new long[threads];
        List<Thread> helpers = new ArrayList<>();
        for (int i = 1; i < threads; i++) {
            int k = i;
            helpers.add(Thread.ofPlatform().name(name + k).start(() -> its[k] = spin(deadline)));
        }
        its[0] = spin(deadline);
        for (Thread t : helpers) t.join();
        long total = 0;
        for (long v : its) total += v;
        JsonObject o = new JsonObject();
        o.addProperty("ms", ms); // in a sequence, the next step burns as long
        o.addProperty("threads", threads);
        o.addProperty("wall_ms", (System.nanoTime() - t0) / 1e6);
        o.addProperty("iterations", total);
        return o;
    }
}
