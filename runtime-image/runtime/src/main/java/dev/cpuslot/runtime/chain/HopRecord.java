package dev.cpuslot.runtime.chain;

import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.runtime.base.Log;

/**
 * What the platform sees of one hop of a chain (docs/chaining.md#what-the-platform-sees): one
 * line in the caller's activation log (the output OpenWhisk keeps up to the caller's sentinel as
 * its activation's logs; Knative's pod log) and in the runtime's log. Made of plain values when
 * the hop ends; rendered to text later ({@link #toString}), by the runtime's log thread and when
 * the caller's log is written out: off the hop's critical path.
 *
 * @param path     local, openwhisk or knative
 * @param status   ok, error, timeout, bad_result, platform, or started (an asynchronous hop, at its start)
 * @param slot     the hop's slot, {@link #NONE} without one (then outcome is null)
 * @param cpuNanos the hop's CPU from its slot's counters, {@link #NONE} when not measured
 */
public record HopRecord(String activationId, String action, String status, String mode, int depth, String path, String caller,
                 long quotaMilli, String quotaSource, long slot, String outcome, boolean localLease,
                 long cpuNanos, long throttledNanos, long durationNanos, String error) {
    public static final long NONE = -1;

    /** An asynchronous hop as it starts: the caller's log has it (its end comes after the caller's, in the runtime's log). */
    static HopRecord started(String activationId, String action, int depth, String path, String caller) {
        return new HopRecord(activationId, action, "started", "async", depth, path, caller, 0, null, NONE, null, false, NONE, NONE, NONE, null);
    }

    /** Into the caller's activation log (null: none, e.g. an asynchronous hop's thread) and the runtime's log. */
    public void report(ActivationOutput.Capture callerLog) {
        if (callerLog != null) callerLog.record(this);
        Log.later(this);
    }

    @Override
    public String toString() {
        StringBuilder b = new StringBuilder(192).append("cpuslot: activation=").append(activationId == null ? "-" : activationId)
                .append(" action=").append(action).append(" status=").append(status).append(" chain=").append(mode)
                .append(" depth=").append(depth).append(" path=").append(path).append(" caller=").append(caller == null ? "-" : caller);
        if (quotaSource != null) b.append(" quota=").append(quotaMilli).append("m source=").append(quotaSource);
        if (path.equals("local") && !status.equals("started")) {
            b.append(" slot=");
            if (slot == NONE) b.append("none");
            else b.append(slot).append(" outcome=").append(outcome).append(localLease ? " local" : "");
            b.append(" cpu_ns=").append(cpuNanos == NONE ? "-" : Long.toString(cpuNanos));
            if (throttledNanos != NONE) b.append(" throttled_ns=").append(throttledNanos);
        }
        if (error != null) b.append(" error=").append(error.replace('\n', ' ').replace('\r', ' '));
        if (durationNanos != NONE) b.append(" duration_ms=").append(Log.ms(durationNanos));
        return b.toString();
    }
}
