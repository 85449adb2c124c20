package dev.cpuslot.runtime.exec;

import com.google.gson.JsonElement;

import java.util.Map;

/** A deployed function: knows how to make sandboxes for its workers. */
public interface Function extends AutoCloseable {
    String name();

    /** java, javascript or python. */
    String language();

    /** Init-time environment (OpenWhisk /init env, Hydra register params). */
    Map<String, String> initEnv();

    /** A fresh sandbox, made on (and used only by) one worker thread. */
    Sandbox newSandbox() throws Exception;

    @Override
    default void close() {}

    /** One worker's isolated execution context. Not thread-safe: one invocation at a time. */
    interface Sandbox {
        /**
         * Runs the function. Returns its JSON result (any JSON; the caller checks the shape).
         * @param env the invocation's environment (__OW_* values and the init env)
         */
        JsonElement invoke(JsonElement args, Map<String, String> env) throws Exception;

        /**
         * Readies the calling worker thread before its first invocation, off any request's path
         * (a polyglot context's state for this thread). Nothing by default.
         */
        default void prepareThread() {}

        /** Interrupts a running invocation from another thread (deadline). */
        void cancel(Thread worker);

        /** True when the sandbox cannot be reused after cancel/failure. */
        default boolean poisoned() { return false; }

        void close();
    }

    /** An error in the function's code (thrown, bad return), reported to the caller. */
    final class FunctionError extends Exception {
        public FunctionError(String msg, Throwable cause) { super(msg, cause); }
    }
}
