package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;

import java.io.PrintStream;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Predicate;
import java.util.regex.Pattern;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.exec.Runaways;
import dev.cpuslot.runtime.exec.CompilerSlot;
import dev.cpuslot.runtime.exec.FunctionPool;
import dev.cpuslot.runtime.exec.Load;
import dev.cpuslot.runtime.exec.Hosted;
import dev.cpuslot.runtime.exec.Function;
import dev.cpuslot.runtime.chain.PlatformPath;
import dev.cpuslot.runtime.chain.ConductorFunction;
import dev.cpuslot.runtime.chain.LocalBus;
import dev.cpuslot.runtime.chain.SequenceFunction;
import dev.cpuslot.runtime.lang.JavaFunction;
import dev.cpuslot.runtime.lang.PolyglotFunction;

/**
 * The platform-independent core: deploys and hosts functions, and runs an invocation (owner,
 * deadline, quota, a slot and a worker from the function's pool, metrics, the log line, the
 * reply's headers) the same way for every platform. Each platform's protocol (OpenWhisk,
 * Knative, Hydra) is an adapter over it, a class of its own that maps the platform's requests
 * to an {@link Invocation} and shapes its replies ({@link Platform}); the HTTP front routes
 * requests to the adapters.
 */
public final class FunctionRuntime implements AutoCloseable {
    public static final String SENTINEL = ActivationOutput.SENTINEL;

    private final Config cfg;
    private final Metrics metrics;
    private final Quota quota;
    private final SlotClient slots;
    private final PrintStream out, err;
    /** The container's one action (OpenWhisk's /init, Knative's init), or null before it. */
    private volatile FunctionPool action;
    /** The registered functions (Hydra's /register): the co-located set local chain calls reach. */
    private final Map<String, Hosted> hosted = new ConcurrentHashMap<>();
    private final LocalBus bus;
    /** The owner this runtime serves: CPUSLOT_OWNER, else the first one seen; "*" serves any. */
    private final java.util.concurrent.atomic.AtomicReference<String> owner = new java.util.concurrent.atomic.AtomicReference<>();
    private final Runaways runaways;
    /** The compiler threads' own slot (before any function's code runs: it lists HotSpot's compiler threads). */
    private final CompilerSlot compilerSlot;
    /** The path every activation takes, a platform's and a chain hop's. */
    private final Activation activation;
    private final Readiness readiness;

    public FunctionRuntime(Config cfg, Metrics metrics, SlotClient slots, PrintStream out, PrintStream err) {
        this.cfg = cfg;
        dev.cpuslot.runtime.guard.ThreadBudget.setMaxThreads(cfg.javaMaxThreads());
        this.metrics = metrics;
        describeMetrics(); // before any family is made: a family keeps the help it was made with
        this.quota = new Quota(cfg, metrics);
        this.slots = slots;
        this.out = out;
        this.err = err;
        this.runaways = new Runaways(slots, milliOrOff(cfg.runawayQuota(), "CPUSLOT_RUNAWAY_QUOTA"), cfg.runawayGraceMs(), metrics);
        this.compilerSlot = new CompilerSlot(slots, milliOrOff(cfg.compilerQuota(), "CPUSLOT_COMPILER_QUOTA"), metrics);
        // a thread of an ended activation stuck in JDK code leaves the slot its activation had
        dev.cpuslot.runtime.guard.Activations.onStray(runaways::stray);
        owner.set(cfg.owner());
        this.bus = new LocalBus(new LocalBus.Host() {
            @Override public Hosted find(String function) { return hosted.get(function); }
            @Override public FunctionPool.Outcome run(Hosted callee, JsonElement args, LocalBus.Hop hop, String mode) {
                return activation.hop(callee, args, hop, mode);
            }
        }, new PlatformPath(cfg.chainUrl(), cfg.chainUrls()), metrics, cfg.chainMaxDepth(), cfg.chainMaxAsync(), cfg.chainMaxPending());
        this.activation = new Activation(cfg, metrics, quota, bus, slots != null, this::checkOwner, out, err);
        metrics.gaugeFunction("cpuslot_sandboxes", m -> forEachPool((name, p) -> {
            m.add(p.busy(), name, "busy");
            m.add(p.idle(), name, "idle");
            m.add(p.max(), name, "max");
        }), "function", "state");
        // threads of ended activations that no interrupt or poll could end (JDK code that ignores both)
        metrics.gaugeFunction("cpuslot_stray_threads", m -> m.add(dev.cpuslot.runtime.guard.Activations.strayThreads()));
        if (slots != null) {
            slots.onBatchRead(activation::batchRead);
            metrics.counterFunction("cpuslot_slot_client_events_total", m -> slots.counters().forEach((k, v) -> m.add(v, k)), "event");
        }
        // the agent's socket was configured: connect (and warm the slot client) now, in the
        // background, and take no traffic until the agent serves this runtime (bounded)
        readiness = new Readiness(slots, cfg);
        ProcessGuard.install(readiness);
        readiness.start();
    }

    private void describeMetrics() {
        metrics.describe("cpuslot_invocations_total", "Invocations by platform, function and status.");
        metrics.describe("cpuslot_invocation_duration_seconds", "Invocation latency inside the runtime.");
        metrics.describe("cpuslot_invocations_in_flight", "Invocations running now.");
        metrics.describe("cpuslot_stray_threads", "Threads of ended Java activations still running (not blocked) 1 s after the end (each confined as a runaway).");
        metrics.describe("cpuslot_sandboxes", "Sandboxes (workers) per function by state.");
        metrics.describe("cpuslot_allocated_bytes_total", "Heap bytes a function's workers allocated in its activations (the threads they started not included).");
        metrics.describe("cpuslot_sandboxes_created_total", "Sandboxes created.");
        metrics.describe("cpuslot_sandboxes_abandoned_total", "Workers retired at a deadline.");
        metrics.describe("cpuslot_slot_outcomes_total", "Per-invocation slot outcome (affinity_hit, cache_hit, retuned, created, or noslot reason).");
        metrics.describe("cpuslot_slot_client_events_total", "Slot client counters (acquire, place, release, reclaim, noslot...).");
        metrics.describe("cpuslot_slot_acquire_seconds", "Time a worker took to acquire its slot (with placement), in seconds.");
        metrics.describe("cpuslot_slot_acquire_seconds_total", "Deprecated (cpuslot_slot_acquire_seconds_sum is the same): time workers spent acquiring slots, in seconds.");
        metrics.describe("cpuslot_slot_release_seconds_total", "Time workers spent releasing slots, in seconds.");
        metrics.describe("cpuslot_slot_cpu_seconds_total", "CPU time used in slots, from RELEASE_OK.");
        metrics.describe("cpuslot_slot_throttled_seconds_total", "Throttled time in slots, from RELEASE_OK.");
        metrics.describe("cpuslot_slot_reserved_seconds_total", "CPU time reserved by slot leases: the granted quota in cores times the time the lease was held (the same invocations as cpuslot_slot_cpu_seconds_total); idle ratio = 1 - cpu / reserved.");
        metrics.describe("cpuslot_slot_slept_seconds_total", "Time slot leases slept in synchronous chain calls (SLEEP to WAKE): while the agent could lend their quota.");
        metrics.describe("cpuslot_lend_invalid_total", "Lending settings (CPUSLOT_LEND, the cpu-lend annotation) that were not true or false, by source: the invocation was refused.");
        metrics.describe("cpuslot_quota_invalid_total", "Quota values that did not parse, by source.");
        metrics.describe("cpuslot_quota_capped_total", "Quota values above the cap, by source.");
        metrics.describe("cpuslot_bad_requests_total", "Requests refused before running anything.");
        metrics.describe("cpuslot_quota_no_api_key_total", "OpenWhisk invocations without an api_key (action created without provide-api-key) and no other quota source: the annotation cannot be read, they run without a slot.");
        metrics.describe("cpuslot_repeated_inits_total", "Knative requests that bundled the same init again (ignored; the activation ran).");
        metrics.describe("cpuslot_deadline_past_total", "Activations whose __OW_DEADLINE had already passed on arrival: run with the default timeout.");
        metrics.describe("cpuslot_deadline_unparsed_total", "Activations whose __OW_DEADLINE was not epoch milliseconds: run with the default timeout.");
        metrics.describe("cpuslot_annotation_lookups_total", "Reads of an OpenWhisk action's annotations through the API (once per action version, again after a failure's wait).");
        metrics.describe("cpuslot_annotation_pending_total", "Activations that ran without the annotations because their read had not answered yet.");
        metrics.describe("cpuslot_annotation_errors_total", "Reads of an action's annotations that failed (the activation used the next quota source).");
        metrics.describe("cpuslot_chain_calls_total", "Local chain calls by callee, mode (sync, async, sequence, conductor) and status (ok, error, timeout, bad_result, or the refusal: not_local, other_owner, depth, fan_out...).");
    }

    private void forEachPool(java.util.function.BiConsumer<String, FunctionPool> f) {
        FunctionPool p = action;
        if (p != null) f.accept(p.function().name(), p);
        hosted.forEach((name, h) -> f.accept(name, h.pool()));
    }

    public Metrics metrics() { return metrics; }
    public SlotClient slots() { return slots; }

    public Config config() { return cfg; }
    /** The tenant's stderr: where OpenWhisk's runtimes print a refused request. */
    public PrintStream err() { return err; }

    // ---- deployment -------------------------------------------------------------------------

    static final Pattern PY_DEF = Pattern.compile("(?m)^\\s*def\\s+\\w+\\s*\\(");

    static String detectLanguage(String code) {
        return PY_DEF.matcher(code).find() && !code.contains("function ") ? "python" : "javascript";
    }

    private Function create(String name, String language, byte[] binary, String text, String main, Map<String, String> initEnv,
                            long timeoutMs) throws Exception {
        // its code's top level runs as it loads: within the function's time limit and in a slot at
        // its quota, as a call
        return Load.within(name, timeoutMs > 0 ? timeoutMs : cfg.defaultTimeoutMs(), cfg.runawayGraceMs(), runaways,
                loadSlot(name, initEnv), () -> load(name, language, binary, text, main, initEnv));
    }

    private static final java.util.concurrent.atomic.AtomicLong LOADS = new java.util.concurrent.atomic.AtomicLong();

    /**
     * A load's slot: at the quota its calls get when nothing per call says otherwise (its init
     * CPUSLOT_QUOTA, else the pod's default; an init value that does not parse: the default, and
     * its calls are refused as before), none when that is 0 or there is no agent.
     */
    private Load.Slot loadSlot(String name, Map<String, String> initEnv) {
        if (slots == null) return null;
        long milli;
        try {
            milli = quota.resolve(null, null, Map.of(), initEnv == null ? null : initEnv.get(Config.INIT_QUOTA_ENV)).milli();
        } catch (Quota.InvalidQuotaException e) {
            try {
                milli = quota.resolve(null, null, Map.of(), null).milli();
            } catch (Quota.InvalidQuotaException alsoBad) {
                milli = 0;
            }
        }
        if (milli <= 0) return null;
        long q = milli;
        activation.loading(name);
        return new Load.Slot() {
            @Override
            public SlotLease take() {
                slots.prepareThread();
                SlotLease l;
                try {
                    // its own usage at its release (not batched with the calls after it)
                    l = slots.acquire(q, name, "load-" + LOADS.incrementAndGet(), true);
                } catch (RuntimeException e) { // fail-closed: no code of the function's runs in no slot
                    throw new IllegalStateException("no CPU slot for the function's load: " + e.getMessage(), e);
                }
                if (!l.active()) Log.warn("the load of " + name + " runs without a slot: " + l.reason());
                return l;
            }

            @Override
            public void used(dev.cpuslot.slot.Usage u) { activation.loaded(name, u); }
        };
    }

    private Function load(String name, String language, byte[] binary, String text, String main, Map<String, String> initEnv)
            throws Exception {
        if (binary != null) {
            boolean zip = binary.length > 3 && binary[0] == 'P' && binary[1] == 'K';
            if (language != null && !language.equals("java")) return PolyglotFunction.fromZip(name, language, binary, main, initEnv);
            if (!zip) throw new IllegalArgumentException("binary code must be a jar");
            return new JavaFunction(name, binary, main, initEnv, cfg.javaTrusted());
        }
        if (text == null || text.isEmpty()) throw new IllegalArgumentException("Missing main/no code to execute.");
        String lang = language != null ? language : detectLanguage(text);
        if (lang.equals("java")) throw new IllegalArgumentException("java code must be a jar (binary)");
        return new PolyglotFunction(name, lang, text, main, initEnv);
    }

    /**
     * OpenWhisk's and Knative's init: the container's action from its code ({@code binary}: a jar
     * or a zip of guest code, else {@code text}), in a pool of {@code sandboxes} (0: the runtime's
     * CPUSLOT_SANDBOXES), a conductor when its init env declares one or, with {@code annotations},
     * its OpenWhisk annotation says so. Returns its language.
     */
    public String deploy(String name, String language, byte[] binary, String text, String main, Map<String, String> initEnv,
                         int sandboxes, boolean annotations) throws Exception {
        Function f = create(name, language, binary, text, main, initEnv, 0);
        action = pool(f, sandboxes > 0 ? sandboxes : cfg.sandboxesPerFunction(), annotations ? conductorAnnotation() : null);
        return f.language();
    }

    /** Whether the container's action was deployed (its init). */
    public boolean initialized() { return action != null; }

    /** The owner of the function registered under name, or null when there is none. */
    public String ownerOf(String name) {
        Hosted h = hosted.get(name);
        return h == null ? null : h.owner();
    }

    /**
     * Hydra's /register: the function from its code (as {@link #deploy}), or a declared sequence
     * of {@code steps} when not null, in a pool of the runtime's size, registered under name for
     * owner with its time limit (0: the default). It replaces the owner's function of that name,
     * whose pool is closed; a function of another owner stays and this throws.
     */
    public void register(String name, String owner, long timeoutMs, String steps, String language, byte[] binary, String text,
                         String main, Map<String, String> initEnv) throws Exception {
        Function f = steps != null ? sequence(name, steps, initEnv) : create(name, language, binary, text, main, initEnv, timeoutMs);
        FunctionPool pool = pool(f);
        Hosted old;
        try {
            old = host(name, new Hosted(pool, owner, timeoutMs));
        } catch (OtherOwnerException e) { // registered by another owner meanwhile
            pool.close();
            throw e;
        }
        if (old != null) old.pool().close();
    }

    /** Hydra's /deregister: the owner's function of that name removed and its pool closed; false when there is none. */
    public boolean deregister(String name, String owner) throws OtherOwnerException {
        Hosted h = unhost(name, owner);
        if (h == null) return false;
        h.pool().close();
        return true;
    }

    /** Thrown when a name is another owner's: no owner replaces or removes another's function. */
    public static final class OtherOwnerException extends Exception {
        OtherOwnerException(String name, String what) {
            super(what + " refused: the function " + name + " belongs to another owner");
        }
    }

    /**
     * Registers h under name (atomically with the owner check): the function of the same owner it
     * replaces, or null; a function of another owner stays and this throws.
     */
    private Hosted host(String name, Hosted h) throws OtherOwnerException {
        Hosted[] old = new Hosted[1];
        Hosted now = hosted.compute(name, (k, o) -> {
            old[0] = o;
            return o == null || o.owner().equals(h.owner()) ? h : o;
        });
        if (now != h) throw new OtherOwnerException(name, "/register of " + name);
        return old[0];
    }

    /** The function of {@code owner} that was registered under name, or null when there is none; another owner's stays and this throws. */
    private Hosted unhost(String name, String owner) throws OtherOwnerException {
        Hosted[] old = new Hosted[1];
        Hosted now = hosted.computeIfPresent(name, (k, o) -> {
            old[0] = o;
            return o.owner().equals(owner) ? null : o;
        });
        if (now != null) throw new OtherOwnerException(name, "/deregister of " + name);
        return old[0];
    }

    /** The init env (or /register parameter) that declares a function a conductor. */
    public static final String CONDUCTOR_ENV = ConductorFunction.ENV;

    /** A declared sequence ({@code steps=a,b,c}): no code of its own, each step a chain call (local first, then the platform's). */
    private Function sequence(String name, String steps, Map<String, String> env) {
        return new SequenceFunction(name, LocalBus.parseSteps(steps), env, bus);
    }

    /** A pool of the runtime's size (CPUSLOT_SANDBOXES) for f; a conductor only when its init env declares one. */
    private FunctionPool pool(Function f) { return pool(f, cfg.sandboxesPerFunction(), null); }

    /**
     * A pool of {@code sandboxes} for f, run as a conductor when its init env declares one or
     * {@code annotated} (OpenWhisk's conductor annotation, see {@link #conductorAnnotation}) says so.
     */
    private FunctionPool pool(Function f, int sandboxes, Predicate<Map<String, String>> annotated) {
        FunctionPool p = new FunctionPool(ConductorFunction.wrap(f, bus, annotated), sandboxes, cfg.workerIdleMs(), slots, metrics, runaways);
        p.prestart(); // the first call finds its worker ready
        return p;
    }

    /** OpenWhisk: the action's conductor annotation, read as its cpu-quota annotation is; null when annotations are not read. */
    private Predicate<Map<String, String>> conductorAnnotation() {
        return cfg.annotationLookup() ? quota::conductor : null;
    }

    /**
     * Gets the slot client ready for the first invocation (connect + HELLO, FFM calls and code
     * paths linked) once a function is initialised: first waits until the runtime is ready (the
     * agent serves it, at most the rest of CPUSLOT_READY_WAIT), then for the warm-up at most
     * CPUSLOT_WARMUP_WAIT (default 1 s), then the warm-up goes on in the background. An
     * unreachable agent changes nothing: invocations connect lazily, fail-open as before.
     */
    public void warmSlots(String why) {
        if (slots == null || !cfg.warmup()) return;
        long t0 = System.nanoTime();
        readiness.await();
        boolean ok = slots.warmUp(Duration.ofMillis(cfg.warmupWaitMs()));
        long ms = (System.nanoTime() - t0) / 1_000_000;
        if (!ok) Log.info("slot client not connected to the agent after " + why + " (waited " + ms
                + " ms); invocations connect when they need a slot");
    }

    /** GET /ready (Knative's readinessProbe): 200 once the agent serves the runtime or the wait is over, else 503 and why. */
    public Reply ready() {
        String why = readiness.notReady();
        return why == null ? Reply.ok() : Reply.error(503, why);
    }

    // ---- tenancy ------------------------------------------------------------------------------

    /**
     * A runtime serves one owner (OpenWhisk or Knative namespace, Hydra owner): the configured
     * one, else the first one it sees. Another owner's request gets 403; null means go on.
     */
    public Reply checkOwner(String who, String what) {
        String w = who == null ? "" : who.trim();
        if ("*".equals(owner.get())) return null;
        if (owner.compareAndSet(null, w)) {
            Log.info("this runtime serves owner '" + w + "' (" + what + "); requests of other owners are refused");
            return null;
        }
        String o = owner.get();
        if (o.equals(w)) return null;
        metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "other_owner"));
        String msg = "this runtime serves owner '" + o + "': " + what + " of owner '" + w
                + "' refused (one owner per runtime; CPUSLOT_OWNER=* lets a runtime serve several)";
        Log.warn(msg);
        return Reply.error(403, msg);
    }

    // ---- running ------------------------------------------------------------------------------

    /**
     * Runs one activation that an adapter mapped from its platform's request, and renders the
     * reply: the platform's body ({@link Platform#body}) or the shared error, the slot's headers
     * ({@link Activation}, the path a chain hop takes too).
     */
    public Reply run(Invocation inv) {
        String name = inv.function();
        Hosted h = name == null ? null : hosted.get(name);
        FunctionPool p = name == null ? action : h == null ? null : h.pool();
        if (p != null) return activation.platform(inv, p, h);
        if (name == null) {
            sentinels();
            return Reply.error(502, "Cannot invoke an uninitialized action.");
        }
        metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "unknown_function"));
        return Reply.error(404, "no function named " + name);
    }

    /**
     * OpenWhisk's /init: starts the read of the deployed action's annotations with its env's
     * __OW_* fields; the read, for the init to wait for (null when there is none).
     */
    public CompletableFuture<?> prefetchAnnotations() {
        FunctionPool p = action;
        return p == null ? null : quota.prefetch(activation.environment(p.function(), new JsonObject()));
    }

    /** Waits for a read prefetchAnnotations started, within the read's budget: whether it answered. */
    public boolean awaitAnnotations(CompletableFuture<?> read) {
        return quota.awaitRead(read);
    }

    /** OpenWhisk's sentinels on the tenant's streams, for a failure that ran no activation. */
    public void sentinels() {
        ActivationOutput.sentinels(out, err);
    }

    /** A quota setting in millicores; 0 (off) when unset, blank or "0". */
    private static long milliOrOff(String v, String setting) {
        try {
            return v == null || v.isBlank() || v.trim().equals("0") ? 0 : Quota.parseMilli(v);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(setting + ": " + e.getMessage());
        }
    }

    @Override
    public void close() {
        compilerSlot.close();
        FunctionPool p = action;
        if (p != null) p.close();
        hosted.values().forEach(h -> h.pool().close());
        if (slots != null) slots.close();
    }
}
