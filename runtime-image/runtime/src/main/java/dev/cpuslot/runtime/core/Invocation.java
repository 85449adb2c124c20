package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

/**
 * One activation, as a platform's adapter hands it to the core to run.
 *
 * @param activation the activation's fields (OpenWhisk's {@code activation_id}, {@code namespace},
 *                   {@code deadline}...): the function sees each as {@code __OW_<FIELD>}
 * @param value      the function's arguments
 * @param function   a registered (Hydra) function's name, else null: the container's action
 * @param usageAsked the answer must carry the invocation's CPU usage: the slot's counters are read
 *                   before the reply (else after it, off the invocation's critical path)
 */
public record Invocation(Platform platform, String function, JsonObject activation, JsonElement value,
                  String quotaHeader, boolean usageAsked) {}
