package dev.cpuslot.runtime;

import dev.cpuslot.runtime.guard.XmlParsers;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.Native;
import dev.cpuslot.slot.SlotClient;

import java.time.Duration;
import java.util.concurrent.atomic.AtomicBoolean;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.lang.PolyglotFunction;
import dev.cpuslot.runtime.lang.PolyglotCache;
import dev.cpuslot.runtime.core.FunctionRuntime;
import dev.cpuslot.runtime.front.HttpFront;

/** Entry point: {@code java --enable-native-access=ALL-UNNAMED -jar runtime.jar}. */
public final class Main {
    private Main() {}

    public static void main(String[] args) throws Exception {
        Config cfg = Config.fromEnv();
        // the tenant's streams: each activation's output its own block (UTF-8 whatever the locale)
        ActivationOutput.install(cfg.activationLogBytes());
        if (!cfg.javaTrusted()) XmlParsers.secureXml(); // no function's parser reads external entities
        Log.format(cfg.logFormat());
        Log.configure(cfg.log(), cfg.logMaxBytes());
        PolyglotCache.useBesideJar(); // before the first engine (the prewarm's)
        SlotClient slots = null;
        if (cfg.slotsEnabled()) {
            if (!Native.available()) {
                Log.warn("slot client unavailable (" + Native.loadError() + "); running without slots");
            } else {
                slots = SlotClient.builder().socket(cfg.agentSocket()).clientName("cpuslot-runtime-java")
                        .acquireBudget(Duration.ofMillis(cfg.acquireBudgetMs()))
                        .firstAcquireBudget(Duration.ofMillis(cfg.firstAcquireBudgetMs())).failClosed(cfg.failClosed())
                        .linger(Duration.ofMillis(Math.max(0, cfg.lingerMs())))
                        .local(cfg.local()).localIdle(Duration.ofMillis(cfg.localIdleMs()))
                        .threads(dev.cpuslot.runtime.guard.RuntimeThreads.factory("cpuslot-slot")).build();
            }
        }
        // an image of one kind: load its language while the container waits for /init
        if (cfg.language() != null && !cfg.language().equals("java")) {
            String lang = cfg.language();
            dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("prewarm-" + lang, () -> {
                try {
                    PolyglotFunction.prewarm(lang, cfg.compilerWarmupMs());
                } catch (RuntimeException e) {
                    Log.warn("prewarming " + lang + " failed: " + e);
                }
            });
        }
        FunctionRuntime rt = new FunctionRuntime(cfg, new Metrics(), slots, System.out, System.err);
        HttpFront front = new HttpFront(rt, cfg.port(), cfg.metricsPort());
        front.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            front.close();
            rt.close();
        }));
        drainOnSigterm(front, cfg.drainTimeoutMs());
        Log.info("listening on :" + front.port() + " (metrics :" + front.metricsPort() + "), slots "
                + (slots == null ? "off" : "via " + cfg.agentSocket() + (cfg.failClosed() ? " fail-closed" : " fail-open")
                + (cfg.local() ? ", local leasing (held slots idle " + cfg.localIdleMs() + " ms go back)" : ", no local leasing")
                + (cfg.lingerMs() > 0 ? ", leases linger " + cfg.lingerMs() + " ms" : ", no lingering")));
    }

    /** Exit code after SIGTERM when the drain timeout ended with invocations still running (as a JVM ended by the signal). */
    static final int EXIT_DRAIN_TIMED_OUT = 143;

    /**
     * SIGTERM (a pod deleted, a rollout, a scale-down) drains instead of ending the JVM at once,
     * which would cut off every running invocation: not ready and no new requests (503), the
     * running ones answered within CPUSLOT_DRAIN_TIMEOUT, then exit 0 (143 when that ran out).
     * The shutdown hook closes the server and the runtime on the way out.
     */
    private static void drainOnSigterm(HttpFront front, long timeoutMs) {
        AtomicBoolean once = new AtomicBoolean();
        // the JDK runs each signal's handler on a new thread: this one may block until the drain is done
        sun.misc.Signal.handle(new sun.misc.Signal("TERM"), sig -> {
            if (!once.compareAndSet(false, true)) return;
            long t0 = System.nanoTime();
            Log.info("SIGTERM: draining (" + front.running() + " requests running, at most " + timeoutMs + " ms); not ready, new requests get 503");
            boolean drained;
            try {
                drained = front.drain(timeoutMs);
            } catch (InterruptedException e) {
                drained = false;
            }
            long ms = (System.nanoTime() - t0) / 1_000_000;
            if (drained) Log.info("drained in " + ms + " ms; exiting");
            else Log.warn("CPUSLOT_DRAIN_TIMEOUT (" + timeoutMs + " ms) passed with " + front.running() + " requests still running; exiting");
            System.exit(drained ? 0 : EXIT_DRAIN_TIMED_OUT);
        });
    }
}
