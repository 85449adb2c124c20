package dev.cpuslot.runtime.exec;

import dev.cpuslot.slot.SlotLease;

/**
 * An invocation's place in a chain, as the worker that runs it sees it: what the worker tells the
 * chain around the function's run, on the worker's own thread. The chain (the local bus) implements
 * it; the worker pool knows nothing else of chains.
 */
public interface Hop {
    /** The invocation starts on this thread with {@code lease} (null: none): its chain calls sleep on it. */
    void enter(SlotLease lease);

    /**
     * The invocation ended on this thread, after {@code allocatedBytes} of heap (-1: not measured);
     * returns how long its lease slept in its synchronous chain calls, in nanoseconds.
     */
    long exit(long allocatedBytes);
}
