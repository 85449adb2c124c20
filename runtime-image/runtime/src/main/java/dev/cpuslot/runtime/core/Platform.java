package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;

import java.util.Map;

/**
 * What the core asks of the platform an activation came from; each platform's adapter answers
 * for its own. Everything else about an invocation is the same on every platform.
 */
public interface Platform {
    /** The platform's name in metrics: openwhisk, knative, hydra. */
    String name();

    /** OpenWhisk's log sentinels close the activation's output (the invoker reads up to them). */
    boolean sentinels();

    /** The reply body of an activation that returned a dictionary (or an array). */
    JsonElement body(Result r);

    /** The activation has no quota (0): said here before it runs without a slot. */
    default void noQuota(Map<String, String> env, String action) {}
}
