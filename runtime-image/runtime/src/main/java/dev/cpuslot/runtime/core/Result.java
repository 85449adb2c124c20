package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;

/**
 * An activation that returned, as its platform's reply body is made of it ({@link Platform#body}):
 * the function's value, how long it ran, and the slot's report for a body that carries it.
 */
public record Result(JsonElement value, long runNanos, Quota.Resolved quota, SlotLease lease, Usage usage) {
    /** The slot's report ({@link SlotReport#json}): what the {@code X-Cpuslot-*} headers say. */
    public JsonObject report() { return SlotReport.json(quota, lease, usage); }
}
