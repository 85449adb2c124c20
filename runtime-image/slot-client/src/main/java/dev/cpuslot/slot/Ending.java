package dev.cpuslot.slot;

import java.util.concurrent.CompletableFuture;

/**
 * How a lease ended ({@link SlotLease#end}): the invocation's usage now, or a future that
 * completes with it, and what is left for {@link #finish()} after the caller has its answer (the
 * one-way RELEASE, or the counters' read and the RELEASE). The decision of which, per path:
 * <ul>
 * <li>no slot (inactive lease): nothing to send, no usage;</li>
 * <li>usage later: nothing now; {@link #finish()} releases and completes {@link #later()};</li>
 * <li>usage now, a slot of the process's table (local leasing): given back now (one store; the
 *     next invocation finds it free);</li>
 * <li>usage now, a per-invocation lease with counter fds on a live connection: measured now
 *     ({@link SlotLease#stop()}), the one-way RELEASE (or the park of a lingering lease) in
 *     {@link #finish()};</li>
 * <li>usage now otherwise (no counters, the connection lost): released now, with the agent's
 *     answer.</li>
 * </ul>
 */
public final class Ending {
    /** What ends no lease: no usage, nothing left to finish. */
    public static final Ending NONE = new Ending(null, ReleaseOutcome.OK, null, Usage.NONE, false, null);

    /** Told once the usage of a lease is final, before {@link #later()} completes: a runtime's own accounting. */
    @FunctionalInterface
    public interface Listener {
        /**
         * {@code until}: when the lease stopped being measured (System.nanoTime); {@code nanos}: what
         * reading the usage and releasing took on the ending thread (not a RELEASE sent after an
         * answer that already had the usage).
         */
        void ended(SlotLease lease, Usage usage, long until, long nanos);
    }

    private final SlotLease lease;
    private final ReleaseOutcome outcome;
    private final Listener listener;
    private final Usage usage;
    /** A measured lease whose RELEASE waits for {@link #finish()}. */
    private final boolean releaseAfter;
    private final CompletableFuture<Usage> later;
    private boolean finished;

    private Ending(SlotLease lease, ReleaseOutcome outcome, Listener listener, Usage usage, boolean releaseAfter,
                   CompletableFuture<Usage> later) {
        this.lease = lease;
        this.outcome = outcome;
        this.listener = listener;
        this.usage = usage;
        this.releaseAfter = releaseAfter;
        this.later = later;
    }

    /**
     * An ending whose usage is {@code usage} (measured by {@link SlotLease#stop()}) and that sends
     * nothing: the caller ends the lease itself later (a runtime keeps a slot claimed while a
     * thread of the ended invocation still runs in it).
     */
    public static Ending measured(Usage usage) {
        return new Ending(null, ReleaseOutcome.OK, null, usage, false, null);
    }

    /** See {@link SlotLease#end}; the caller ended l first (a second end does not get here). */
    static Ending of(SlotLease l, ReleaseOutcome outcome, boolean usageNow, Listener listener) {
        if (l.active() && !usageNow) return new Ending(l, outcome, listener, Usage.NONE, false, new CompletableFuture<>());
        long r0 = System.nanoTime();
        Usage u = Usage.NONE;
        boolean after = false;
        if (l.active()) {
            if (l.local()) {
                u = l.release(outcome);
            } else {
                u = l.stop();
                after = u.measured();
                if (!after) u = l.release(outcome);
            }
        }
        if (listener != null) listener.ended(l, u, r0, System.nanoTime() - r0);
        return new Ending(l, outcome, listener, u, after, null);
    }

    /** The invocation's usage: final when {@link #later()} is null, else {@link Usage#NONE}. */
    public Usage usage() { return usage; }

    /** Completes with the invocation's usage in {@link #finish()}; null when {@link #usage()} is final. */
    public CompletableFuture<Usage> later() { return later; }

    /**
     * What waits for the caller's answer: the one-way RELEASE of a measured lease (a lingering
     * one is kept for its thread's next invocation), or the counters' read, the RELEASE and
     * {@link #later()}'s completion. Call it once the answer is out, before the thread acquires
     * again (lingering keeps the lease for it); a second call does nothing. Returns the final
     * usage. Never throws for agent problems.
     */
    public Usage finish() {
        if (finished) return later != null ? later.getNow(Usage.NONE) : usage;
        finished = true;
        if (later != null) {
            long r0 = System.nanoTime();
            Usage u = Usage.NONE;
            try {
                u = lease.release(outcome);
            } finally {
                try {
                    if (listener != null) listener.ended(lease, u, r0, System.nanoTime() - r0);
                } finally {
                    later.complete(u);
                }
            }
            return u;
        }
        if (releaseAfter) lease.release(outcome);
        return usage;
    }
}
