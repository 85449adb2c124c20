package dev.cpuslot.runtime;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;

import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Pattern;

/**
 * The platform-independent core: deploys functions and runs invocations, and renders each
 * platform's reply. HTTP lives in {@link HttpFront}.
 */
public final class FunctionRuntime implements AutoCloseable {
    public static final String SENTINEL = ActivationOutput.SENTINEL;
    static final String OW_ACTION = "__ow_action";

    /** An HTTP-agnostic reply. */
    /**
     * An HTTP-agnostic reply. {@code after}: work for after the reply is sent (the activation's
     * log line and usage metrics), or null.
     */
    public record Reply(int status, JsonElement body, Map<String, String> headers, Runnable after) {
        public Reply(int status, JsonElement body, Map<String, String> headers) { this(status, body, headers, null); }
        static Reply ok(JsonElement b) { return new Reply(200, b, Map.of()); }
        static Reply error(int status, String msg) {
            JsonObject o = new JsonObject();
            o.addProperty("error", msg);
            return new Reply(status, o, Map.of());
        }
    }

    private final Config cfg;
    private final Metrics metrics;
    private final Quota quota;
    private final SlotClient slots;
    private final PrintStream out, err;
    /** Hydra's registered functions: the co-located set local chain calls reach. */
    private final Map<String, LocalBus.Hosted> hydra = new ConcurrentHashMap<>();
    private final LocalBus bus;
    private volatile FunctionPool owPool;
    /** The init that made owPool (its value object), to recognise a repeated Knative init. */
    private volatile JsonObject owInitValue;
    /** Actions already warned about: no api_key in /run, so no annotation lookup (warned once each). */
    private final Map<String, Boolean> warnedNoApiKey = new ConcurrentHashMap<>();
    private final Object initLock = new Object();
    /** The owner this runtime serves: CPUSLOT_OWNER, else the first one seen; "*" serves any. */
    private final java.util.concurrent.atomic.AtomicReference<String> owner = new java.util.concurrent.atomic.AtomicReference<>();
    private final Runaways runaways;
    private final AtomicLong inFlight;
    private final Lazy<HttpClient> http = new Lazy<>(() -> HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10))
            .followRedirects(HttpClient.Redirect.NORMAL).build());

    public FunctionRuntime(Config cfg, Metrics metrics, SlotClient slots, PrintStream out, PrintStream err) {
        this.cfg = cfg;
        dev.cpuslot.runtime.guard.ActionGuard.setMaxThreads(cfg.javaMaxThreads());
        this.metrics = metrics;
        this.quota = new Quota(cfg, metrics);
        this.slots = slots;
        this.out = out;
        this.err = err;
        long runawayMilli;
        try {
            runawayMilli = cfg.runawayQuota() == null || cfg.runawayQuota().isBlank() || cfg.runawayQuota().trim().equals("0")
                    ? 0 : Quota.parseMilli(cfg.runawayQuota());
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException("CPUSLOT_RUNAWAY_QUOTA: " + e.getMessage());
        }
        this.runaways = new Runaways(slots, runawayMilli, cfg.runawayGraceMs(), metrics);
        owner.set(cfg.owner());
        this.bus = new LocalBus(new LocalBus.Host() {
            @Override public LocalBus.Hosted find(String function) { return hydra.get(function); }
            @Override public FunctionPool.Outcome run(LocalBus.Hosted callee, JsonElement args, LocalBus.Hop hop, String mode) {
                return runHop(callee, args, hop, mode);
            }
        }, new PlatformPath(cfg.chainUrl(), cfg.chainUrls()), metrics, cfg.chainMaxDepth(), cfg.chainMaxAsync(), cfg.chainMaxPending());
        describeMetrics();
        inFlight = metrics.gauge("cpuslot_invocations_in_flight", "");
        metrics.gaugeFunction("cpuslot_sandboxes", () -> {
            Map<String, Long> m = new LinkedHashMap<>();
            forEachPool((name, p) -> {
                m.put(Metrics.labels("function", name, "state", "busy"), (long) p.busy());
                m.put(Metrics.labels("function", name, "state", "idle"), (long) p.idle());
                m.put(Metrics.labels("function", name, "state", "max"), (long) p.max());
            });
            return m;
        });
        if (slots != null) {
            metrics.gaugeFunction("cpuslot_slot_client_events_total", () -> {
                Map<String, Long> m = new LinkedHashMap<>();
                slots.counters().forEach((k, v) -> m.put(Metrics.labels("event", k), v));
                return m;
            });
        }
    }

    private void describeMetrics() {
        metrics.describe("cpuslot_invocations_total", "counter", "Invocations by platform, function and status.");
        metrics.describe("cpuslot_invocation_duration_seconds", "histogram", "Invocation latency inside the runtime.");
        metrics.describe("cpuslot_invocations_in_flight", "gauge", "Invocations running now.");
        metrics.describe("cpuslot_sandboxes", "gauge", "Sandboxes (workers) per function by state.");
        metrics.describe("cpuslot_sandboxes_created_total", "counter", "Sandboxes created.");
        metrics.describe("cpuslot_sandboxes_abandoned_total", "counter", "Workers retired at a deadline.");
        metrics.describe("cpuslot_slot_outcomes_total", "counter", "Per-invocation slot outcome (affinity_hit, cache_hit, retuned, created, or noslot reason).");
        metrics.describe("cpuslot_slot_client_events_total", "counter", "Slot client counters (acquire, place, release, reclaim, noslot...).");
        metrics.describe("cpuslot_slot_acquire_seconds_total", "counter", "Time workers spent acquiring slots (with placement), in seconds; divide by acquisitions for the mean.");
        metrics.describe("cpuslot_slot_release_seconds_total", "counter", "Time workers spent releasing slots, in seconds.");
        metrics.describe("cpuslot_slot_cpu_seconds_total", "counter", "CPU time used in slots, from RELEASE_OK.");
        metrics.describe("cpuslot_slot_throttled_seconds_total", "counter", "Throttled time in slots, from RELEASE_OK.");
        metrics.describe("cpuslot_quota_invalid_total", "counter", "Quota values that did not parse, by source.");
        metrics.describe("cpuslot_quota_capped_total", "counter", "Quota values above the cap, by source.");
        metrics.describe("cpuslot_bad_requests_total", "counter", "Requests refused before running anything.");
        metrics.describe("cpuslot_quota_no_api_key_total", "counter", "OpenWhisk invocations without an api_key (action created without provide-api-key) and no other quota source: the annotation cannot be read, they run without a slot.");
        metrics.describe("cpuslot_repeated_inits_total", "counter", "Knative requests that bundled the same init again (ignored; the activation ran).");
        metrics.describe("cpuslot_deadline_past_total", "counter", "Activations whose __OW_DEADLINE had already passed on arrival: run with the default timeout.");
        metrics.describe("cpuslot_deadline_unparsed_total", "counter", "Activations whose __OW_DEADLINE was not epoch milliseconds: run with the default timeout.");
        metrics.describe("cpuslot_chain_calls_total", "counter", "Local chain calls by callee, mode (sync, async) and status (ok, error, timeout, bad_result, or the refusal: not_local, other_owner, depth, fan_out...).");
    }

    private void forEachPool(java.util.function.BiConsumer<String, FunctionPool> f) {
        FunctionPool p = owPool;
        if (p != null) f.accept(p.function().name(), p);
        hydra.forEach((name, h) -> f.accept(name, h.pool()));
    }

    public Metrics metrics() { return metrics; }
    public SlotClient slots() { return slots; }

    // ---- deployment -------------------------------------------------------------------------

    static final Pattern PY_DEF = Pattern.compile("(?m)^\\s*def\\s+\\w+\\s*\\(");

    static String detectLanguage(String code) {
        return PY_DEF.matcher(code).find() && !code.contains("function ") ? "python" : "javascript";
    }

    Function create(String name, String language, byte[] binary, String text, String main, Map<String, String> initEnv)
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

    private FunctionPool pool(Function f) {
        return new FunctionPool(ConductorFunction.wrap(f, bus, null), cfg.sandboxesPerFunction(), cfg.workerIdleMs(), slots, metrics, runaways);
    }

    /**
     * OpenWhisk sends one activation at a time to a container unless the action allows
     * concurrency, and then says so with {@code __OW_ALLOW_CONCURRENT} (container environment, or
     * the action's /init env). Concurrent: sandboxes grow on demand up to CPUSLOT_OW_MAX_CONCURRENCY
     * (per action: /init env CPUSLOT_SANDBOXES, at most that). Otherwise one sandbox, and an
     * overlapping /run is refused as OpenWhisk's runtimes refuse it.
     */
    private FunctionPool owPool(Function f) {
        int max = owConcurrent ? cfg.owMaxConcurrency() : 1;
        String per = f.initEnv().get(Config.INIT_SANDBOXES_ENV);
        if (owConcurrent && per != null && !per.isBlank()) {
            try {
                max = Math.max(1, Math.min(max, Integer.parseInt(per.trim())));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(Config.INIT_SANDBOXES_ENV + " is not a number: " + per);
            }
        }
        // OpenWhisk: the action's conductor annotation, read as its cpu-quota annotation is
        return new FunctionPool(ConductorFunction.wrap(f, bus, cfg.annotationLookup() ? quota::conductor : null), max,
                cfg.workerIdleMs(), slots, metrics, runaways);
    }

    private volatile boolean owConcurrent;
    private final java.util.concurrent.atomic.AtomicBoolean owRunning = new java.util.concurrent.atomic.AtomicBoolean();

    // ---- OpenWhisk ----------------------------------------------------------------------------

    /**
     * Gets the slot client ready for the first invocation (connect + HELLO, FFM calls and code
     * paths linked) once a function is initialised: waits for it at most CPUSLOT_WARMUP_WAIT
     * (default 1 s), then the warm-up goes on in the background. An unreachable agent changes
     * nothing: invocations connect lazily, fail-open as before.
     */
    void warmSlots(String why) {
        if (slots == null || !cfg.warmup()) return;
        long t0 = System.nanoTime();
        boolean ok = slots.warmUp(Duration.ofMillis(cfg.warmupWaitMs()));
        long ms = (System.nanoTime() - t0) / 1_000_000;
        if (!ok) Log.info("slot client not connected to the agent after " + why + " (waited " + ms
                + " ms); invocations connect when they need a slot");
    }

    /** OpenWhisk {@code POST /init}. */
    public Reply owInit(JsonObject body) {
        Reply r = owInitLocked(body, true);
        if (r.status() == 200) warmSlots("/init");
        return r;
    }

    private Reply owInitLocked(JsonObject body, boolean openwhisk) {
        synchronized (initLock) {
            if (owPool != null) {
                err.println("Cannot initialize the action more than once.");
                metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "reinit"));
                return Reply.error(403, "Cannot initialize the action more than once.");
            }
            JsonObject v = body != null && body.has("value") && body.get("value").isJsonObject() ? body.getAsJsonObject("value") : null;
            if (v == null || !v.has("code") || v.get("code").isJsonNull()) {
                return Reply.error(403, "Missing main/no code to execute.");
            }
            try {
                Map<String, String> env = new LinkedHashMap<>();
                if (v.has("env") && v.get("env").isJsonObject()) {
                    for (Map.Entry<String, JsonElement> e : v.getAsJsonObject("env").entrySet())
                        // as OpenWhisk exports init parameters: strings as is, null as "", the rest as JSON
                        env.put(e.getKey(), e.getValue().isJsonNull() ? "" : e.getValue().isJsonPrimitive() ? e.getValue().getAsString() : e.getValue().toString());
                }
                String main = str(v, "main", "main");
                boolean binary = v.has("binary") && v.get("binary").isJsonPrimitive() && v.get("binary").getAsBoolean();
                String code = v.get("code").getAsString();
                byte[] bin = null;
                if (binary) {
                    try {
                        bin = Base64.getMimeDecoder().decode(code);
                    } catch (IllegalArgumentException e) {
                        return Reply.error(502, "Unable to decode the base64 code: " + e.getMessage());
                    }
                }
                // the image's kind fixes the language; the generic image takes it from the action's env, or guesses
                String lang = cfg.language() != null ? cfg.language() : env.get("CPUSLOT_LANGUAGE");
                String name = str(v, "name", OW_ACTION);
                if (name.isBlank()) name = OW_ACTION;
                Function f = create(name, lang, bin, binary ? null : code, main, env);
                if (openwhisk) {
                    owConcurrent = cfg.owConcurrent() || "true".equalsIgnoreCase(env.getOrDefault("__OW_ALLOW_CONCURRENT", "").trim());
                    owPool = owPool(f);
                } else {
                    owPool = pool(f);
                }
                owInitValue = v.deepCopy();
                Log.info("initialised " + owPool.function().language() + " action " + name + " (main " + main + ")");
                JsonObject ok = new JsonObject();
                ok.addProperty("ok", true);
                return Reply.ok(ok);
            } catch (Exception e) {
                String msg = e instanceof IllegalArgumentException ? e.getMessage() : "An error has occurred (see logs for details): " + e;
                err.println(msg);
                Log.info("init failed: " + msg);
                metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "init_failed"));
                sentinels();
                return Reply.error(502, msg);
            }
        }
    }

    /** OpenWhisk {@code POST /run}. */
    public Reply owRun(JsonObject body, String quotaHeader, String platform) { return owRun(body, quotaHeader, platform, false); }

    /** @param usageAsked the request asked for its CPU usage in the answer ({@link Config#USAGE_HEADER}) */
    public Reply owRun(JsonObject body, String quotaHeader, String platform, boolean usageAsked) {
        FunctionPool p = owPool;
        if (p == null) {
            sentinels();
            return Reply.error(502, "Cannot invoke an uninitialized action.");
        }
        JsonElement value = body.has("value") ? body.get("value") : new JsonObject();
        JsonObject activation = new JsonObject();
        for (Map.Entry<String, JsonElement> e : body.entrySet()) if (!e.getKey().equals("value")) activation.add(e.getKey(), e.getValue());
        if (owConcurrent) return run(p, activation, value, quotaHeader, platform, true, false, usageAsked, null);
        // one activation at a time, as OpenWhisk's runtimes without __OW_ALLOW_CONCURRENT
        if (!owRunning.compareAndSet(false, true)) {
            metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "not_concurrent"));
            err.println("Internal system error: System not ready, status is running.");
            err.flush();
            return Reply.error(403, "System not ready, status is running.");
        }
        try {
            return run(p, activation, value, quotaHeader, platform, true, false, usageAsked, null);
        } finally {
            owRunning.set(false);
        }
    }

    /** Knative single entrypoint {@code POST /}: {@code init}, {@code activation}+{@code value}, or both. */
    public Reply knative(JsonObject body, String quotaHeader) { return knative(body, quotaHeader, false); }

    /** @param usageAsked the request asked for its CPU usage in the answer ({@link Config#USAGE_HEADER}) */
    public Reply knative(JsonObject body, String quotaHeader, boolean usageAsked) {
        if (body.has("init")) {
            boolean run = body.has("activation") || body.has("value");
            Reply r;
            synchronized (initLock) {
                JsonElement init = body.get("init");
                if (owPool != null && init.isJsonObject() && sameCode(owInitValue, init.getAsJsonObject())) {
                    // Knative sends the init with every request (and to every pod scale-out adds):
                    // the same code again is not a second init; run the activation
                    metrics.inc("cpuslot_repeated_inits_total", "");
                    r = null;
                } else if (owPool != null) {
                    err.println("Cannot initialize the action more than once: this runtime already runs different code.");
                    metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "reinit_different"));
                    return Reply.error(403, "Cannot initialize the action more than once: this runtime already runs different code.");
                } else {
                    JsonObject initBody = new JsonObject();
                    initBody.add("value", init);
                    r = owInitLocked(initBody, false);
                }
            }
            if (r != null && r.status() == 200) warmSlots("init");
            if (r == null && !run) {
                JsonObject ok = new JsonObject();
                ok.addProperty("ok", true);
                return Reply.ok(ok);
            }
            if (r != null && (r.status() != 200 || !run)) return r;
        }
        FunctionPool p = owPool;
        if (p == null) {
            sentinels();
            return Reply.error(502, "Cannot invoke an uninitialized action.");
        }
        JsonObject activation = body.has("activation") && body.get("activation").isJsonObject() ? body.getAsJsonObject("activation") : new JsonObject();
        JsonElement value = body.has("value") ? body.get("value") : new JsonObject();
        return run(p, activation, value, quotaHeader, "knative", true, false, usageAsked, null);
    }

    /** Same function: code, binary, main and env of an init value (the name is not compared). */
    static boolean sameCode(JsonObject a, JsonObject b) {
        if (a == null || b == null) return false;
        for (String k : new String[] {"code", "binary", "main", "env"}) {
            JsonElement x = a.get(k), y = b.get(k);
            boolean xNull = x == null || x.isJsonNull(), yNull = y == null || y.isJsonNull();
            if (xNull != yNull || (!xNull && !x.equals(y))) return false;
        }
        return true;
    }

    // ---- Graalvisor / Hydra -------------------------------------------------------------------

    /** {@code /register?name=&url=&entryPoint=&language=&sandbox=[&quota=]}; code from the body or url. */
    public Reply hydraRegister(Map<String, String> q, byte[] body) {
        String name = q.get("name");
        if (name == null || name.isBlank()) return Reply.error(400, "missing name");
        String language = q.getOrDefault("language", "java").toLowerCase(Locale.ROOT);
        String entry = q.get("entryPoint");
        Reply refused = checkOwner(q.get("owner"), "/register of " + name);
        if (refused != null) return refused;
        try {
            byte[] code = q.containsKey("steps") ? null : body != null && body.length > 0 ? body : fetch(q.get("url"));
            Map<String, String> env = new LinkedHashMap<>();
            if (q.containsKey("quota")) env.put(Config.INIT_QUOTA_ENV, q.get("quota"));
            if (q.containsKey("sandbox")) env.put("CPUSLOT_SANDBOX", q.get("sandbox"));
            if (q.containsKey("conductor")) env.put(ConductorFunction.ENV, q.get("conductor"));
            // steps=a,b,c: a sequence of functions (local first, then the platform's), no code of its own
            Function f = q.containsKey("steps") ? new SequenceFunction(name, LocalBus.parseSteps(q.get("steps")), env, bus)
                    : language.equals("java")
                    ? create(name, "java", code, null, entry == null ? "main" : entry, env)
                    : create(name, language, null, new String(code, StandardCharsets.UTF_8), entry, env);
            long timeoutMs = 0;
            if (q.containsKey("timeout")) {
                try {
                    timeoutMs = Long.parseLong(q.get("timeout").trim());
                } catch (NumberFormatException e) {
                    timeoutMs = -1;
                }
                if (timeoutMs <= 0) throw new IllegalArgumentException("timeout is not a number of milliseconds above 0: " + q.get("timeout"));
            }
            String who = q.get("owner") == null ? "" : q.get("owner").trim();
            LocalBus.Hosted old = hydra.put(name, new LocalBus.Hosted(pool(f), who, timeoutMs));
            if (old != null) old.pool().close();
            Log.info("registered " + language + " function " + name);
            warmSlots("/register");
            JsonObject o = new JsonObject();
            o.addProperty("registered", name);
            return Reply.ok(o);
        } catch (Exception e) {
            metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "register_failed"));
            return Reply.error(400, "cannot register " + name + ": " + e.getMessage());
        }
    }

    private byte[] fetch(String url) throws Exception {
        if (url == null || url.isBlank()) throw new IllegalArgumentException("missing url (or code in the body)");
        URI u = URI.create(url);
        if ("file".equals(u.getScheme())) return Files.readAllBytes(Path.of(u));
        HttpResponse<byte[]> r = http.get().send(HttpRequest.newBuilder(u).timeout(Duration.ofSeconds(60)).GET().build(),
                HttpResponse.BodyHandlers.ofByteArray());
        if (r.statusCode() != 200) throw new IllegalStateException("HTTP " + r.statusCode() + " from " + url);
        return r.body();
    }

    public Reply hydraDeregister(String name) {
        LocalBus.Hosted h = name == null ? null : hydra.remove(name);
        if (h == null) return Reply.error(404, "no function named " + name);
        h.pool().close();
        JsonObject o = new JsonObject();
        o.addProperty("deregistered", name);
        return Reply.ok(o);
    }

    /** Hydra invoke: {@code {"name", "arguments": "<JSON string>"}} -> {@code {"result", "process time (us)"}}. */
    public Reply hydraInvoke(JsonObject body, String quotaHeader, boolean report) { return hydraInvoke(body, quotaHeader, report, false); }

    /** @param usageAsked the request asked for its CPU usage in the answer ({@link Config#USAGE_HEADER}) */
    public Reply hydraInvoke(JsonObject body, String quotaHeader, boolean report, boolean usageAsked) {
        String name = body.get("name").isJsonPrimitive() ? body.get("name").getAsString() : null;
        LocalBus.Hosted h = name == null ? null : hydra.get(name);
        FunctionPool p = h == null ? null : h.pool();
        if (p == null) {
            metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "unknown_function"));
            return Reply.error(404, "no function named " + name);
        }
        JsonElement args = body.get("arguments");
        if (args != null && args.isJsonPrimitive() && args.getAsJsonPrimitive().isString()) {
            try {
                String s = args.getAsString();
                args = s.isBlank() ? new JsonObject() : JsonParser.parseString(s);
            } catch (RuntimeException e) {
                metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "malformed_arguments"));
                return Reply.error(400, "arguments are not JSON: " + e.getMessage());
            }
        }
        if (args == null || args.isJsonNull()) args = new JsonObject();
        JsonObject activation = new JsonObject();
        activation.addProperty("action_name", name);
        return run(p, activation, args, quotaHeader, "hydra", false, report || cfg.reportInBody(),
                usageAsked || report || cfg.reportInBody(), h);
    }

    // ---- tenancy ------------------------------------------------------------------------------

    /**
     * A runtime serves one owner (OpenWhisk or Knative namespace, Hydra owner): the configured
     * one, else the first one it sees. Another owner's request gets 403; null means go on.
     */
    Reply checkOwner(String who, String what) {
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
     * @param usageAsked the answer must carry the invocation's CPU usage: the slot's counters are
     *                   read before the reply (else after it, off the invocation's critical path)
     * @param hosted a Hydra function (its owner and time limit), else null
     */
    private Reply run(FunctionPool p, JsonObject activation, JsonElement value, String quotaHeader, String platform,
                      boolean sentinels, boolean reportInBody, boolean usageAsked, LocalBus.Hosted hosted) {
        long t0 = System.nanoTime();
        Function fn = p.function();
        JsonElement ns = activation.get("namespace");
        if (!platform.equals("hydra") && ns != null && ns.isJsonPrimitive()) {
            Reply refused = checkOwner(ns.getAsString(), "an activation");
            if (refused != null) return finish(platform, fn, t0, refused, sentinels, "other_owner");
        }
        Map<String, String> env = new LinkedHashMap<>(fn.initEnv());
        for (Map.Entry<String, JsonElement> e : activation.entrySet()) {
            JsonElement v = e.getValue();
            env.put("__OW_" + e.getKey().toUpperCase(Locale.ROOT), v.isJsonNull() ? "" : v.isJsonPrimitive() ? v.getAsString() : v.toString());
        }
        if (cfg.apiHost() != null) env.putIfAbsent("__OW_API_HOST", cfg.apiHost());
        String activationId = env.getOrDefault("__OW_ACTIVATION_ID", UUID.randomUUID().toString().replace("-", ""));
        String action = env.getOrDefault("__OW_ACTION_NAME", fn.name());
        int depth = 0; // the chain's depth, when a caller's chain sent this activation through the platform
        if (value.isJsonObject() && value.getAsJsonObject().has(PlatformPath.DEPTH_PARAM)) {
            value = value.deepCopy();
            try {
                depth = bus.arrivedDepth(value);
            } catch (IllegalArgumentException e) {
                return finish(platform, fn, t0, Reply.error(400, e.getMessage()), sentinels, "bad_request");
            }
        }

        long timeoutNs = TimeUnit.MILLISECONDS.toNanos(hosted != null && hosted.timeoutMs() > 0 ? hosted.timeoutMs() : cfg.defaultTimeoutMs());
        String dl = env.get("__OW_DEADLINE");
        if (dl != null && !dl.isBlank() && cfg.enforceDeadline()) {
            // The invoker enforces the action's time limit; the runtime cancels at the deadline
            // too, to free the sandbox and slot. A deadline already past (a skewed clock, a test
            // value) is passed on to the action and the default timeout applies.
            try {
                long left = (long) Double.parseDouble(dl) - System.currentTimeMillis();
                if (left > 0) timeoutNs = TimeUnit.MILLISECONDS.toNanos(left);
                else metrics.inc("cpuslot_deadline_past_total", "");
            } catch (NumberFormatException e) {
                metrics.inc("cpuslot_deadline_unparsed_total", "");
            }
        }

        Quota.Resolved q;
        try {
            q = quota.resolve(value, quotaHeader, env, fn.initEnv().get(Config.INIT_QUOTA_ENV));
        } catch (Quota.InvalidQuotaException e) {
            Log.warn("activation " + activationId + " refused: " + e.getMessage());
            return finish(platform, fn, t0, Reply.error(400, e.getMessage()), sentinels, "bad_quota");
        }
        if (q.milli() == 0 && platform.equals("openwhisk") && cfg.annotationLookup()) noApiKey(env, action);
        if (q.source().equals("invocation") && value.isJsonObject()) {
            value = value.deepCopy();
            value.getAsJsonObject().remove(Config.QUOTA_PARAM);
        }

        // what the activation prints: its own block, written out before its sentinels (finish);
        // the pool hands it to the worker
        ActivationOutput.Capture output = ActivationOutput.open();
        ActivationOutput.enter(output);
        inFlight.incrementAndGet();
        FunctionPool.Outcome o;
        long deadline = System.nanoTime() + timeoutNs;
        // the chain's first hop: the owner is the Hydra function's, else the activation's namespace
        String hopOwner = hosted != null ? hosted.owner() : ns != null && ns.isJsonPrimitive() ? ns.getAsString().trim() : "";
        LocalBus.Hop hop = bus.root(action, hopOwner, activationId, deadline, depth,
                new PlatformPath.Origin(env.get("__OW_API_HOST"), env.get("__OW_API_KEY")));
        try {
            o = p.invoke(new FunctionPool.Task(value, env, q.milli(), action, activationId, hop,
                    usageAsked || cfg.usageInReply()), deadline);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return finish(platform, fn, t0, Reply.error(503, "interrupted"), sentinels, "error", output);
        } finally {
            inFlight.decrementAndGet();
        }
        // the steps the container's action declared (its /init env, else the container's env) follow it
        if (hosted == null) o = bus.then(hop, fn.initEnv().getOrDefault(LocalBus.STEPS_ENV, cfg.chainSteps()), o);

        Reply r;
        String status;
        if (o.error() != null) {
            status = o.timedOut() ? "timeout" : "error";
            r = Reply.error(502, o.timedOut() ? "The action did not finish before its deadline: " + o.error() + "."
                    : "An error has occurred while invoking the action (see logs for details): " + o.error());
        } else if (o.result() == null || !(o.result().isJsonObject() || o.result().isJsonArray())) {
            status = "bad_result";
            r = Reply.error(502, "The action did not return a dictionary.");
        } else {
            status = "ok";
            if (platform.equals("hydra")) {
                JsonObject h = new JsonObject();
                h.add("result", o.result());
                h.addProperty("process time (us)", o.runNanos() / 1000);
                if (reportInBody) h.add("cpuslot", usageJson(q, o.lease(), o.usage()));
                r = Reply.ok(h);
            } else {
                r = Reply.ok(o.result());
            }
        }
        Map<String, String> headers = new LinkedHashMap<>(r.headers());
        headers.put("X-Cpuslot-Quota-Milli", Long.toString(q.milli()));
        headers.put("X-Cpuslot-Quota-Source", q.source());
        SlotLease l = o.lease();
        if (l != null) {
            if (l.active()) {
                headers.put("X-Cpuslot-Slot", Long.toString(l.slot()));
                headers.put("X-Cpuslot-Outcome", l.outcome());
                if (l.reused()) headers.put("X-Cpuslot-Reused", "true");
                if (l.local()) headers.put("X-Cpuslot-Local", "true");
            } else {
                headers.put("X-Cpuslot-Noslot", l.reason());
            }
        }
        Usage u = o.usage();
        if (u != null && u.measured()) {
            headers.put("X-Cpuslot-Cpu-Ns", Long.toString(u.cpuNanos()));
            headers.put("X-Cpuslot-Throttled-Ns", Long.toString(u.throttledNanos()));
        }
        int hops = hop.trace.count();
        if (hops > 0) {
            // the synchronous hops below this activation: each hop's CPU, and the chain's (this one's
            // included; not sent when this one's is read after the reply)
            headers.put("X-Cpuslot-Chain-Hops", Integer.toString(hops));
            headers.put("X-Cpuslot-Chain", hop.trace.listed());
            if (o.usageLater() == null && (hop.trace.measured() || (u != null && u.measured())))
                headers.put("X-Cpuslot-Chain-Cpu-Ns", Long.toString(hop.trace.cpuNanos() + (u != null && u.measured() ? u.cpuNanos() : 0)));
        }
        String slotOutcome = q.milli() == 0 ? "no_quota" : l == null ? "none" : l.active() ? l.outcome() : "noslot_" + l.reason();
        metrics.inc("cpuslot_slot_outcomes_total", Metrics.labels("outcome", slotOutcome));
        long duration = System.nanoTime() - t0;
        String act = activationId, st = status;
        Quota.Resolved qq = q;
        // after the reply: the usage metrics and the activation's log line (what the slot gave and
        // what it used), once the usage is known (the worker may read the counters after the reply)
        java.util.function.Consumer<Usage> record = used -> {
            boolean m = used != null && used.measured();
            if (m) {
                metrics.add("cpuslot_slot_cpu_seconds_total", p.labels(), used.cpuNanos() / 1e9);
                metrics.add("cpuslot_slot_throttled_seconds_total", p.labels(), used.throttledNanos() / 1e9);
            }
            Log.activation("cpuslot: activation=" + act + " action=" + action + " status=" + st
                    + " quota=" + qq.milli() + "m source=" + qq.source() + (qq.capped() ? " capped" : "")
                    + " slot=" + (l != null && l.active() ? l.slot() + " outcome=" + l.outcome() + " place=" + l.place()
                            + (l.reused() ? " reused" : "") + (l.local() ? " local" : "") : "none")
                    + (l != null && !l.active() ? " noslot=" + l.reason() : "")
                    + (m ? " cpu_ms=" + ms(used.cpuNanos()) + " throttled_ms=" + ms(used.throttledNanos())
                    + " periods=" + used.periods() + " throttled_periods=" + used.throttledPeriods() : "")
                    + (hops > 0 ? " chain_hops=" + hops : "")
                    + (hops > 0 && (hop.trace.measured() || m) ? " chain_cpu_ms=" + ms(hop.trace.cpuNanos() + (m ? used.cpuNanos() : 0)) : "")
                    + " duration_ms=" + ms(duration));
        };
        java.util.concurrent.CompletableFuture<Usage> later = o.usageLater();
        Runnable after = later == null ? () -> record.accept(u) : () -> later.thenAccept(record);
        return finish(platform, fn, t0, new Reply(r.status(), r.body(), headers, after), sentinels, status, output);

    }

    /**
     * One hop of a local chain (called by the bus on the caller's thread, or on a virtual thread
     * for an asynchronous call): the callee's own quota, pool, slot, metrics and log line, as
     * an invocation from the platform gets, with the deadline the bus gave it.
     */
    private FunctionPool.Outcome runHop(LocalBus.Hosted callee, JsonElement args, LocalBus.Hop hop, String mode) {
        long t0 = System.nanoTime();
        ActivationOutput.Capture callerLog = ActivationOutput.current(); // the hop's record goes there
        FunctionPool p = callee.pool();
        Function fn = p.function();
        Map<String, String> env = new LinkedHashMap<>(fn.initEnv());
        env.put("__OW_ACTION_NAME", hop.function);
        env.put("__OW_ACTIVATION_ID", hop.activationId);
        env.put("__OW_DEADLINE", Long.toString(System.currentTimeMillis() + TimeUnit.NANOSECONDS.toMillis(hop.deadlineNanos - t0)));
        if (!hop.owner.isEmpty()) env.put("__OW_NAMESPACE", hop.owner);
        if (cfg.apiHost() != null) env.putIfAbsent("__OW_API_HOST", cfg.apiHost());
        FunctionPool.Outcome o;
        Quota.Resolved q = null;
        try {
            q = quota.resolve(args, null, env, fn.initEnv().get(Config.INIT_QUOTA_ENV));
            if (q.source().equals("invocation") && args.isJsonObject()) {
                args = args.deepCopy();
                args.getAsJsonObject().remove(Config.QUOTA_PARAM);
            }
            // the hop's output: its own block (the platform's sentinels end its caller's)
            ActivationOutput.Capture output = ActivationOutput.open(), caller = ActivationOutput.enter(output);
            inFlight.incrementAndGet();
            try {
                o = p.invoke(new FunctionPool.Task(args, env, q.milli(), hop.function, hop.activationId, hop), hop.deadlineNanos);
            } finally {
                inFlight.decrementAndGet();
                ActivationOutput.enter(caller);
                if (output != null) output.close(false);
            }
        } catch (Quota.InvalidQuotaException e) {
            o = new FunctionPool.Outcome(null, e.getMessage(), false, null, Usage.NONE, 0);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // the caller was cancelled: it ends too
            o = new FunctionPool.Outcome(null, "the caller was cancelled", true, null, Usage.NONE, 0);
        } catch (RuntimeException e) { // the pool's own failure: the caller's typed error, not an escape
            o = new FunctionPool.Outcome(null, "runtime error: " + e, false, null, Usage.NONE, 0);
        }
        String status = o.error() != null ? (o.timedOut() ? "timeout" : "error")
                : o.result() == null || !(o.result().isJsonObject() || o.result().isJsonArray()) ? "bad_result" : "ok";
        Usage u = o.usage();
        boolean measured = u != null && u.measured();
        if (measured) {
            metrics.add("cpuslot_slot_cpu_seconds_total", p.labels(), u.cpuNanos() / 1e9);
            metrics.add("cpuslot_slot_throttled_seconds_total", p.labels(), u.throttledNanos() / 1e9);
        }
        if (!mode.equals("async")) hop.trace.add(hop.function, measured ? u.cpuNanos() : 0, measured);
        SlotLease l = o.lease();
        if (q != null) {
            String slotOutcome = q.milli() == 0 ? "no_quota" : l == null ? "none" : l.active() ? l.outcome() : "noslot_" + l.reason();
            metrics.inc("cpuslot_slot_outcomes_total", Metrics.labels("outcome", slotOutcome));
        }
        metrics.inc("cpuslot_chain_calls_total", Metrics.labels("function", fn.name(), "mode", mode, "status", status));
        metrics.inc("cpuslot_invocations_total", Metrics.labels("platform", "chain", "function", fn.name(), "status", status));
        metrics.histogram("cpuslot_invocation_duration_seconds", Metrics.labels("function", fn.name())).observe((System.nanoTime() - t0) / 1e9);
        boolean slot = l != null && l.active();
        new HopRecord(hop.activationId, hop.function, status, mode, hop.depth, "local", hop.callerId, q != null ? q.milli() : 0,
                q != null ? q.source() : null, slot ? l.slot() : HopRecord.NONE, slot ? l.outcome() : null, slot && l.local(),
                measured ? u.cpuNanos() : HopRecord.NONE, measured ? u.throttledNanos() : HopRecord.NONE, System.nanoTime() - t0,
                o.error()).report(callerLog);
        return o;
    }

    /** Nanoseconds as milliseconds with three decimals (what %.3f printed, without the formatter's cost per invocation). */
    static String ms(long ns) {
        long us = Math.max(0, (ns + 500) / 1000);
        String frac = Long.toString(us % 1000);
        return us / 1000 + "." + "000".substring(frac.length()) + frac;
    }

    /**
     * OpenWhisk sends no api_key to actions created without {@code -a provide-api-key true} (the
     * default for new actions in recent OpenWhisk): then the annotation cannot be read and, with
     * no other quota source, the invocation runs without a slot. Say so once per action; count it.
     */
    private void noApiKey(Map<String, String> env, String action) {
        String key = env.get("__OW_API_KEY");
        if (key != null && !key.isEmpty()) return;
        metrics.inc("cpuslot_quota_no_api_key_total", Metrics.labels("function", action));
        if (warnedNoApiKey.putIfAbsent(action, Boolean.TRUE) == null) {
            Log.warn("action " + action + " gets no api_key in /run, so its '" + cfg.annotationKey() + "' annotation cannot be read"
                    + " and it has no other quota: it runs without a CPU slot. Create or update it with"
                    + " -a provide-api-key true (or give it CPUSLOT_QUOTA in its init env, or set CPUSLOT_DEFAULT_QUOTA)."
                    + " Counted in cpuslot_quota_no_api_key_total; this warning is logged once per action.");
        }
    }

    private static JsonObject usageJson(Quota.Resolved q, SlotLease l, Usage u) {
        JsonObject o = new JsonObject();
        o.addProperty("quota_milli", q.milli());
        o.addProperty("quota_source", q.source());
        if (l != null && l.active()) {
            o.addProperty("slot", l.slot());
            o.addProperty("outcome", l.outcome());
            o.addProperty("place", l.place());
            if (l.reused()) o.addProperty("reused", true);
            if (l.local()) o.addProperty("local", true);
        } else if (l != null) {
            o.addProperty("noslot", l.reason());
        }
        if (u != null && u.measured()) {
            o.addProperty("cpu_ns", u.cpuNanos());
            o.addProperty("throttled_ns", u.throttledNanos());
            o.addProperty("periods", u.periods());
            o.addProperty("throttled_periods", u.throttledPeriods());
        }
        return o;
    }

    private Reply finish(String platform, Function fn, long t0, Reply r, boolean sentinels, String status) {
        return finish(platform, fn, t0, r, sentinels, status, null);
    }

    /** @param output the activation's stdout and stderr: written out now, before its sentinels */
    private Reply finish(String platform, Function fn, long t0, Reply r, boolean sentinels, String status,
                         ActivationOutput.Capture output) {
        metrics.inc("cpuslot_invocations_total", Metrics.labels("platform", platform, "function", fn.name(), "status", status));
        metrics.histogram("cpuslot_invocation_duration_seconds", Metrics.labels("function", fn.name()))
                .observe((System.nanoTime() - t0) / 1e9);
        if (!status.equals("ok")) Log.info("activation failed: " + (r.body() instanceof JsonObject jo && jo.has("error") && jo.get("error").isJsonPrimitive() ? jo.get("error").getAsString() : status));
        ActivationOutput.leave();
        if (output != null) output.close(sentinels);
        else if (sentinels) sentinels();
        return r;
    }

    private void sentinels() {
        ActivationOutput.sentinels(out, err);
    }

    private static String str(JsonObject o, String k, String def) {
        JsonElement e = o.get(k);
        return e == null || e.isJsonNull() || !e.isJsonPrimitive() ? def : e.getAsString();
    }

    @Override
    public void close() {
        FunctionPool p = owPool;
        if (p != null) p.close();
        hydra.values().forEach(h -> h.pool().close());
        if (slots != null) slots.close();
    }
}
