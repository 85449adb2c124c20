package dev.cpuslot.samples;

import com.google.gson.JsonObject;

/** CPU-bound: naive recursive fibonacci of {@code n} (default 30). */
public class Fibonacci {
    static long fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

    public static JsonObject main(JsonObject args) {
        int n = args.has("n") ? args.get("n").getAsInt() : 30;
        if (n < 0 || n > 50) throw new IllegalArgumentException("n must be within 0..50");
        long t0 = System.nanoTime();
        long f = fib(n);
        JsonObject o = new JsonObject();
        o.addProperty("n", n);
        o.addProperty("fib", f);
        o.addProperty("compute_ms", (System.nanoTime() - t0) / 1e6);
        return o;
    }
}
