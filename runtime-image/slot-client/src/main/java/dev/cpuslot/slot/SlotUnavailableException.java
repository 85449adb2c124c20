package dev.cpuslot.slot;

/** Thrown by {@link SlotClient#acquire} in fail-closed mode when no slot could be had. */
public final class SlotUnavailableException extends RuntimeException {
    private final String reason;
    public SlotUnavailableException(String reason, String detail) {
        super(reason + (detail == null ? "" : ": " + detail));
        this.reason = reason;
    }
    /** Short machine-readable reason, the same as the {@code noslot.*} counter name suffix. */
    public String reason() { return reason; }
}
