package dev.cpuslot.chain;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

/**
 * Local chaining for Java functions (docs/chaining.md): call another function of the same owner
 * hosted in the same runtime, in process. The callee runs on its own worker, in its own CPU slot
 * at its own quota, and never past the caller's deadline. Errors are {@link ChainException}s.
 *
 * <pre>{@code
 * JsonElement r = Chain.call("resize", args);   // waits for the callee's result
 * Chain.callAsync("audit", args);                // fire and forget
 * }</pre>
 *
 * Calls are made from the activation's own thread (the one that runs {@code main}); a thread the
 * function started has no chain ({@link ChainException.Kind#NO_CONTEXT}).
 */
public final class Chain {
    private Chain() {}

    /** What the runtime binds to an activation's thread. */
    public interface Bus {
        JsonElement call(String function, JsonElement args);

        void callAsync(String function, JsonElement args);
    }

    /**
     * The running activation's bus, per thread. The runtime binds it when an activation starts and
     * unbinds it when it ends; a function that binds one of its own only changes its own calls.
     */
    private static final ThreadLocal<Bus> CURRENT = new ThreadLocal<>();

    /** For the runtime: binds (null: unbinds) the calling thread's bus. */
    public static void bind(Bus bus) {
        if (bus == null) CURRENT.remove();
        else CURRENT.set(bus);
    }

    /** Runs {@code function} with {@code args} and returns its result (a JSON object or array). */
    public static JsonElement call(String function, JsonElement args) {
        return bus(function).call(function, args == null ? new JsonObject() : args);
    }

    /** Starts {@code function} with {@code args} and returns at once; its result and errors go to its own log line and metrics. */
    public static void callAsync(String function, JsonElement args) {
        bus(function).callAsync(function, args == null ? new JsonObject() : args);
    }

    private static Bus bus(String function) {
        Bus b = CURRENT.get();
        if (b == null) throw new ChainException(ChainException.Kind.NO_CONTEXT, function,
                "no chain on this thread: call from the thread that runs the activation's main");
        return b;
    }
}
