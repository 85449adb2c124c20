package dev.cpuslot.samples;

import com.google.gson.JsonObject;

/**
 * Leaves an executor behind, never shut down: its thread ({@code idle-executor}) waits on the
 * queue for good, alive but blocked, after the function returns. The workload of a thread that
 * outlives its activation without using CPU.
 */
public class IdleExecutor {
    public static JsonObject main(JsonObject args) throws Exception {
        var pool = java.util.concurrent.Executors.newFixedThreadPool(1, r -> new Thread(r, "idle-executor"));
        pool.submit(() -> 1).get();
        return new JsonObject();
    }
}
