package dev.cpuslot.runtime;

import dev.cpuslot.runtime.guard.ActionGuard;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.Native;
import dev.cpuslot.slot.SlotClient;

import java.time.Duration;

/** Entry point: {@code java --enable-native-access=ALL-UNNAMED -jar runtime.jar}. */
public final class Main {
    private Main() {}

    public static void main(String[] args) throws Exception {
        Config cfg = Config.fromEnv();
        // the tenant's streams: each activation's output its own block (UTF-8 whatever the locale)
        ActivationOutput.install(cfg.activationLogBytes());
        if (!cfg.javaTrusted()) ActionGuard.secureXml(); // no function's parser reads external entities
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
                        .local(cfg.local()).localIdle(Duration.ofMillis(cfg.localIdleMs())).build();
            }
        }
        // an image of one kind: load its language while the container waits for /init
        if (cfg.language() != null && !cfg.language().equals("java")) {
            String lang = cfg.language();
            Thread.ofPlatform().daemon().name("prewarm-" + lang).start(() -> {
                try {
                    PolyglotFunction.prewarm(lang);
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
        Log.info("listening on :" + front.port() + " (metrics :" + front.metricsPort() + "), slots "
                + (slots == null ? "off" : "via " + cfg.agentSocket() + (cfg.failClosed() ? " fail-closed" : " fail-open")
                + (cfg.local() ? ", local leasing (held slots idle " + cfg.localIdleMs() + " ms go back)" : ", no local leasing")
                + (cfg.lingerMs() > 0 ? ", leases linger " + cfg.lingerMs() + " ms" : ", no lingering")));
    }
}
