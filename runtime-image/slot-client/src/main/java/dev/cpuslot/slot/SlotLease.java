package dev.cpuslot.slot;

import java.util.concurrent.locks.ReentrantLock;

/**
 * One invocation's hold on a slot. Obtained from {@link SlotClient#acquire}; always ended with
 * {@link #end} (or released with {@link #release}). When {@link #active()} is false the
 * invocation runs without a slot (fail-open) and {@link #reason()} says why; ending or releasing
 * it then sends nothing and returns {@link Usage#NONE}.
 */
public final class SlotLease {
    final Leases leases;
    final String action;
    /** The invocation this handle is for (a reused lease gets a new handle for the new one). */
    final String invocation;
    final long quotaAsked;
    final int tid;
    /** The platform thread that acquired (a kernel tid can be reused by a later thread). */
    final Thread thread = Thread.currentThread();
    final String reason;
    final ReentrantLock lock = new ReentrantLock();

    // state below is guarded by lock
    Connection conn;             // connection the lease belongs to (null when none)
    long lease;                  // agent's lease id on conn
    long slot, quotaMilli, periodUs;
    int outcome, flags, place;
    boolean released, lost;
    /** The slot's counters read right after placement; null = release with a reply. */
    SlotCounters start;
    /** The counters read by {@link #stop()}; release uses them instead of reading again. */
    SlotCounters end;
    /** Lingering: the invocation is over, the agent's lease is kept for the thread's next one. */
    boolean parked;
    volatile long parkedAt;
    /** This invocation reused the thread's lingering lease: no message went to the agent. */
    boolean reused;
    /** A SLEEP went to the agent and no WAKE since (spec: "Lending"). */
    boolean sleeping;
    /** Set when the slot came from the process's slot table (local leasing): its path. */
    LocalLeases local;
    /** The table entry and the state the claim wrote (local leasing). */
    int entry = -1;
    long claim;
    /** Local leasing: the invocation wants its own usage (its counters are not batched). */
    boolean ownUsage;
    /** Local leasing: its usage went into a batch of several (SlotClient#onBatchRead). */
    volatile boolean batched;
    /** {@link #end} was called. */
    boolean ended;

    SlotLease(Leases leases, String action, String invocation, long quotaAsked, int tid, String reason) {
        this.leases = leases;
        this.action = action;
        this.invocation = invocation;
        this.quotaAsked = quotaAsked;
        this.tid = tid;
        this.reason = reason;
    }

    /** True when the invocation holds a slot (and, for SELF/DONE/NONE, sits in it). */
    public boolean active() { return reason == null; }

    /** Why there is no slot ({@code unreachable}, {@code budget}, {@code REJECTED}...), or null. */
    public String reason() { return reason; }

    public long slot() { return slot; }
    /** Quota granted (may be lower than asked when DEGRADED). */
    public long quotaMilli() { return quotaMilli; }
    public long quotaAsked() { return quotaAsked; }
    public long periodUs() { return periodUs; }
    /** ACQUIRE_OK outcome name: affinity_hit, cache_hit, retuned, created (or none). */
    public String outcome() { return Leases.outcomeName(outcome); }
    public boolean queued() { return (flags & Protocol.ACQ_FLAG_QUEUED) != 0; }
    public boolean degraded() { return (flags & Protocol.ACQ_FLAG_DEGRADED) != 0; }
    /** How the thread got into the slot: none, self, done. */
    public String place() { return Leases.placeName(place); }
    public int tid() { return tid; }
    public String action() { return action; }
    public String invocation() { return invocation; }
    /** True when the lease was lost (agent restarted and did not give it back). */
    /**
     * True when this invocation runs under the lease its thread kept from its previous invocation
     * (lingering, {@link SlotClient.Builder#linger}): nothing was sent to the agent.
     */
    public boolean reused() { return reused; }
    /** True when the slot came from the process's own slot table (local leasing, spec "Local leasing"). */
    public boolean local() { return local != null; }
    public boolean lost() { lock.lock(); try { return lost; } finally { lock.unlock(); } }

    /**
     * True after a release that returned no usage of its own because the invocation's counters
     * are read with other invocations' of its slot (local leasing): its CPU is counted in that
     * batch's usage ({@link SlotClient#onBatchRead}).
     */
    public boolean batched() { return batched; }

    /**
     * Ends the measurement now and returns what the slot used so far, without talking to the
     * agent, when the release will be one-way (counter fds held, no reconnect since); otherwise
     * {@link Usage#NONE} and {@link #release} measures as usual. Lets a runtime answer its
     * caller first and send the (one-way) RELEASE afterwards, off the invocation's path.
     */
    public Usage stop() {
        if (!active()) return Usage.NONE;
        return leases.stop(this);
    }

    /**
     * Gives the slot back and returns what it used (after {@link #stop()}: what it used until
     * then). Idempotent: a second call returns
     * {@link Usage#NONE}. May be called from any thread. Never throws for agent problems.
     * With lingering on, {@link ReleaseOutcome#OK} keeps the agent's lease for the thread's next
     * invocation (see {@link SlotClient.Builder#linger}); the usage returned is this invocation's.
     */
    public Usage release(ReleaseOutcome outcome) {
        if (!active()) return Usage.NONE;
        return leases.release(this, outcome, true);
    }

    /**
     * As {@link #release}, for a thread that makes no further invocation (one that ends with
     * this lease, such as a function's load): the slot is given back now, never kept lingering
     * for a next invocation of the thread.
     */
    public Usage releaseLast(ReleaseOutcome outcome) {
        if (!active()) return Usage.NONE;
        return leases.release(this, outcome, false);
    }

    /**
     * Ends the invocation's lease with its outcome: its usage now ({@code usageNow}: the caller's
     * answer carries it) or later (a future that completes after the answer), and, for
     * {@link Ending#finish()} once the answer is out, what is left to send: on each path the
     * calls of {@link #stop()} and {@link #release} that path needs, no more ({@link Ending} lists
     * them). {@code listener} (may be null) is told the final usage before anyone else. A second end
     * gives the slot back now if the first did not yet (its finish then sends nothing) and returns
     * {@link Ending#NONE}. May be called from any thread. Never throws for agent problems.
     */
    public Ending end(ReleaseOutcome outcome, boolean usageNow, Ending.Listener listener) {
        boolean first;
        lock.lock();
        try {
            first = !ended;
            ended = true;
        } finally {
            lock.unlock();
        }
        if (first) return Ending.of(this, outcome, usageNow, listener);
        release(outcome);
        return Ending.NONE;
    }

    /**
     * Tells the agent this invocation waits (blocks on a downstream call or I/O) and uses no CPU
     * until {@link #wake()}: its quota may be lent to new invocations of the container
     * (spec: "Lending"). One one-way message on the lease's own connection, and only when the
     * agent announced LEND: otherwise, or for an inactive, released or sleeping lease, nothing
     * is sent. True when the lease sleeps now (call {@link #wake()} then). Never throws.
     */
    public boolean sleep() {
        if (!active()) return false;
        return leases.sleepOrWake(this, true);
    }

    /**
     * Tells the agent the invocation runs again: its quota counts in full at once. Only after a
     * {@link #sleep()} that returned true; otherwise nothing is sent. A release wakes a sleeping
     * lease first. Never throws.
     */
    public void wake() {
        if (!active()) return;
        leases.sleepOrWake(this, false);
    }

    /** True between a {@link #sleep()} that went to the agent and the next {@link #wake()}. */
    public boolean sleeping() { lock.lock(); try { return sleeping; } finally { lock.unlock(); } }

    @Override
    public String toString() {
        return active()
                ? "SlotLease{slot=" + slot + ", quota=" + quotaMilli + "m, outcome=" + outcome() + ", place=" + place() + "}"
                : "SlotLease{no slot: " + reason + "}";
    }
}
