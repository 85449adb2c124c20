package dev.cpuslot.runtime.core;

import com.google.gson.JsonObject;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;

import java.util.Map;

/**
 * What a reply says of its invocation's quota, slot and CPU usage: the {@code X-Cpuslot-*}
 * headers every platform's reply carries, and the same facts as the JSON object a Hydra reply
 * carries in its body when asked.
 */
public final class SlotReport {
    private SlotReport() {}

    static void headers(Map<String, String> h, Quota.Resolved q, SlotLease l, Usage u) {
        h.put("X-Cpuslot-Quota-Milli", Long.toString(q.milli()));
        h.put("X-Cpuslot-Quota-Source", q.source());
        if (l != null) {
            if (l.active()) {
                h.put("X-Cpuslot-Slot", Long.toString(l.slot()));
                h.put("X-Cpuslot-Outcome", l.outcome());
                if (l.reused()) h.put("X-Cpuslot-Reused", "true");
                if (l.local()) h.put("X-Cpuslot-Local", "true");
            } else {
                h.put("X-Cpuslot-Noslot", l.reason());
            }
        }
        if (u != null && u.measured()) {
            h.put("X-Cpuslot-Cpu-Ns", Long.toString(u.cpuNanos()));
            h.put("X-Cpuslot-Throttled-Ns", Long.toString(u.throttledNanos()));
        }
    }

    public static JsonObject json(Quota.Resolved q, SlotLease l, Usage u) {
        JsonObject o = new JsonObject();
        o.addProperty("quota_milli", q.milli());
        o.addProperty("quota_source", q.source());
        if (l != null && l.active()) {
            o.addProperty("slot", l.slot());
            o.addProperty("outcome", l.outcome());
            o.addProperty("place", l.place());
            if (l.reused()) o.addProperty("reused", true);
            if (l.local()) o.addProperty("local", true);
        } else if (l != null) {
            o.addProperty("noslot", l.reason());
        }
        if (u != null && u.measured()) {
            o.addProperty("cpu_ns", u.cpuNanos());
            o.addProperty("throttled_ns", u.throttledNanos());
            o.addProperty("periods", u.periods());
            o.addProperty("throttled_periods", u.throttledPeriods());
        }
        return o;
    }

    /** The slot outcome an invocation is counted under (cpuslot_slot_outcomes_total). */
    static String outcome(Quota.Resolved q, SlotLease l) {
        return q.milli() == 0 ? "no_quota" : l == null ? "none" : l.active() ? l.outcome() : "noslot_" + l.reason();
    }
}
