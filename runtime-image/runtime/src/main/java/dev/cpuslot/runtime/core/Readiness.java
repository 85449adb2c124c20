package dev.cpuslot.runtime.core;

import dev.cpuslot.slot.SlotClient;

import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;

/**
 * Whether the runtime takes traffic yet. A new pod's runtime starts before the node agent serves
 * it (the agent sees the container running, finds its cgroup, makes its slots, then creates the
 * socket), and a platform sends the first request as soon as the port answers: that request's
 * acquire then had to connect and say HELLO within the 50 ms budget, and ran without a slot.
 * So the runtime is ready once the agent answered its HELLO (the pool is made by then), or once
 * CPUSLOT_READY_WAIT has passed since start (fail-open, logged), and at once when it does not
 * connect at start (no CPUSLOT_SOCKET, slots or warm-up off). Until then it keeps connecting in
 * the background. Knative's probe reads {@link #notReady()} (GET /ready); OpenWhisk's /init and
 * Hydra's /register wait in {@link #await()}.
 */
final class Readiness {
    private static final long FIRST_RETRY_NS = 50_000_000L, MAX_RETRY_NS = 1_000_000_000L;

    private final SlotClient slots;
    private final String socket;
    /** When the wait began and ends; 0 when the runtime does not wait at all. */
    private final long start = System.nanoTime(), deadline;
    private final long waitMs;
    /** Connect at start (in the background) without waiting: CPUSLOT_READY_WAIT=0. */
    private final boolean connectOnce;
    private final CountDownLatch settled = new CountDownLatch(1);

    Readiness(SlotClient slots, Config cfg) {
        this.slots = slots;
        this.socket = cfg.agentSocket();
        boolean connects = slots != null && cfg.warmup() && cfg.connectAtStart();
        boolean waits = connects && cfg.readyWaitMs() > 0;
        this.connectOnce = connects && !waits;
        this.waitMs = waits ? cfg.readyWaitMs() : 0;
        this.deadline = waits ? start + TimeUnit.MILLISECONDS.toNanos(waitMs) : 0;
        if (!waits) settled.countDown();
    }

    /** Starts connecting to the agent in the background, when the runtime connects at start. */
    void start() {
        if (connectOnce) slots.warmUp();
        else if (settled.getCount() > 0) dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("cpuslot-ready", this::connect);
    }

    /** Why the runtime cannot go on (a runtime thread ended: {@link ProcessGuard}), or null. */
    private volatile String broken;

    /** Not ready from now on: the process is about to exit. */
    void broken(String why) { broken = why; }

    /** Null when ready, else why not (one line). */
    String notReady() {
        String b = broken;
        if (b != null) return b;
        if (settled.getCount() == 0 || slots.served()) return null;
        long leftMs = (deadline - System.nanoTime()) / 1_000_000;
        if (leftMs <= 0) return null;
        return "not served by the cpuslot agent yet (" + why() + "); ready without it in " + leftMs + " ms at most";
    }

    /** Waits until ready (at most the rest of CPUSLOT_READY_WAIT); true when the agent serves the runtime. */
    boolean await() {
        try {
            settled.await(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return slots != null && slots.served();
    }

    /** The last connect or HELLO error, naming the socket. */
    private String why() {
        String e = slots.lastWarmUpError();
        if (e == null) return socket + ": no answer yet";
        return e.contains(socket) ? e : socket + ": " + e;
    }

    /** Warms the slot client up until the agent answers HELLO or the wait is over, backing off between tries. */
    private void connect() {
        long pause = FIRST_RETRY_NS;
        try {
            while (true) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    Log.warn("not served by the cpuslot agent within CPUSLOT_READY_WAIT (" + waitMs + " ms; " + why()
                            + "); ready without it: invocations run without a slot (fail-open) and connect when they need one");
                    return;
                }
                if (slots.warmUp(Duration.ofNanos(left))) {
                    Log.info("served by the cpuslot agent " + (System.nanoTime() - start) / 1_000_000 + " ms after start; ready");
                    return;
                }
                TimeUnit.NANOSECONDS.sleep(Math.min(pause, Math.max(0, deadline - System.nanoTime())));
                pause = Math.min(2 * pause, MAX_RETRY_NS);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            settled.countDown();
        }
    }
}
