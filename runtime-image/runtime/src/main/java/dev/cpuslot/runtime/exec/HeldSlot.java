package dev.cpuslot.runtime.exec;

import dev.cpuslot.runtime.guard.RuntimeThreads;
import dev.cpuslot.slot.Ending;
import dev.cpuslot.slot.ReleaseOutcome;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;

import java.util.function.BooleanSupplier;

/** A slot kept claimed after its invocation ended, while a thread of that invocation runs on in it. */
final class HeldSlot {
    private HeldSlot() {}

    /**
     * A thread of the ended invocation runs on in its slot (a thread it started that ends at its
     * next poll, a stray until it is moved out, a worker past its deadline): the invocation's
     * usage is what the slot used until now (returned), and the slot stays claimed, given to no
     * other invocation, while {@code inSlot} holds; then the lease is ended. Nobody waits for it.
     */
    static Usage hold(SlotLease lease, ReleaseOutcome outcome, Ending.Listener listener, BooleanSupplier inSlot) {
        Usage now = lease.stop();
        RuntimeThreads.startRuntimeThread("slot-held-" + lease.slot(), () -> {
            try {
                while (inSlot.getAsBoolean()) Thread.sleep(20);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            } finally {
                lease.end(outcome, true, listener).finish();
            }
        });
        return now;
    }
}
