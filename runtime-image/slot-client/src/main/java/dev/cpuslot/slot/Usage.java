package dev.cpuslot.slot;

/**
 * What a slot used while a lease was held (RELEASE_OK), for all threads in the slot.
 * {@link #measured()} is false when there was no slot, the agent could not report, or (local
 * leasing) the invocation's counters were read together with other invocations' of its slot:
 * that batch's usage, {@link #invocations()} of them, goes to {@link SlotClient#onBatchRead}.
 */
public record Usage(boolean measured, long cpuNanos, long throttledNanos, long periods, long throttledPeriods,
                    long invocations) {
    public static final Usage NONE = new Usage(false, 0, 0, 0, 0);

    /** One invocation's usage (none when not measured). */
    public Usage(boolean measured, long cpuNanos, long throttledNanos, long periods, long throttledPeriods) {
        this(measured, cpuNanos, throttledNanos, periods, throttledPeriods, measured ? 1 : 0);
    }

    /** True when this is one invocation's own figure (not a batch of several). */
    public boolean own() { return measured && invocations == 1; }

    static Usage of(Protocol.ReleaseOk r) {
        return new Usage(true, r.cpuNanos(), r.throttledNanos(), r.periods(), r.throttledPeriods());
    }
}
