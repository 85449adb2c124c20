package dev.cpuslot.chain;

/** A chain call that did not give a result; {@link #kind()} says why. Unchecked: uncaught, it fails the caller. */
public final class ChainException extends RuntimeException {
    public enum Kind {
        /** No function of that name in this runtime, and no platform path to call it through (docs/chaining.md). */
        NOT_LOCAL,
        /** The name is not one the platform accepts (an OpenWhisk entity name, a Knative service name): nothing was sent. */
        BAD_NAME,
        /** The platform's path refused or failed the call (the OpenWhisk API's or the service's HTTP status, unreachable). */
        PLATFORM,
        /** The callee belongs to another owner. */
        OTHER_OWNER,
        /** The chain is as deep as the runtime allows (CPUSLOT_CHAIN_MAX_DEPTH). */
        DEPTH,
        /** Too many asynchronous calls from this activation (CPUSLOT_CHAIN_MAX_ASYNC), or in the runtime (CPUSLOT_CHAIN_MAX_PENDING). */
        FAN_OUT,
        /** The callee failed: threw, returned no object, or could not start (through the platform: its own error). */
        FAILED,
        /** The callee did not finish before its own time limit or its caller's deadline. */
        TIMEOUT,
        /** No chain on this thread (not an activation's thread), or bad arguments. */
        NO_CONTEXT
    }

    private final Kind kind;
    private final String callee, detail;

    public ChainException(Kind kind, String callee, String detail) {
        super("chain call to '" + callee + "' " + kind + ": " + detail);
        this.kind = kind;
        this.callee = callee;
        this.detail = detail;
    }

    /** Why, without the callee and kind the message starts with. */
    public String detail() { return detail; }

    public Kind kind() { return kind; }

    public String callee() { return callee; }
}
