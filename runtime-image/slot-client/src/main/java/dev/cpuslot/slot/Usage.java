package dev.cpuslot.slot;

/**
 * What a slot used while a lease was held (RELEASE_OK), for all threads in the slot.
 * {@link #measured()} is false when there was no slot or the agent could not report.
 */
public record Usage(boolean measured, long cpuNanos, long throttledNanos, long periods, long throttledPeriods) {
    public static final Usage NONE = new Usage(false, 0, 0, 0, 0);

    static Usage of(Protocol.ReleaseOk r) {
        return new Usage(true, r.cpuNanos(), r.throttledNanos(), r.periods(), r.throttledPeriods());
    }
}
