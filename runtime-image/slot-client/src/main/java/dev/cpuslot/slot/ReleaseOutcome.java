package dev.cpuslot.slot;

/** How an invocation ended, as sent in RELEASE. */
public enum ReleaseOutcome {
    OK(Protocol.RELEASE_OK_OUTCOME), FAILED(Protocol.RELEASE_FAILED), TIMEOUT(Protocol.RELEASE_TIMEOUT),
    PLACEMENT_FAILED(Protocol.RELEASE_PLACEMENT_FAILED);

    final int code;
    ReleaseOutcome(int code) { this.code = code; }
    public int code() { return code; }
}
