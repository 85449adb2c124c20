package dev.cpuslot.runtime.front;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

import java.io.PrintStream;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.core.Invocation;
import dev.cpuslot.runtime.core.Reply;
import dev.cpuslot.runtime.core.Result;
import dev.cpuslot.runtime.core.Platform;
import dev.cpuslot.runtime.core.FunctionRuntime;

/**
 * OpenWhisk's action interface: {@code POST /init} deploys the container's one action (its
 * {@code value}: code or a base64 jar, main, name, env), {@code POST /run} runs an activation (its
 * {@code value} and activation fields). Errors are {@code {"error"}} with OpenWhisk's messages and
 * status codes; the reply is the action's result; sentinels close each activation's output.
 * {@link KnativeAdapter} deploys the same action with the same init.
 */
public final class OpenWhiskAdapter implements Platform {
    static final String OW_ACTION = "__ow_action";

    private final FunctionRuntime rt;
    private final Config cfg;
    private final Metrics metrics;
    private final PrintStream err;
    /** Held while the action is deployed (an init, and Knative's check for a repeated one). */
    final Object initLock = new Object();
    /** The init that deployed the action (its value object), to recognise a repeated Knative init. */
    private volatile JsonObject initValue;
    /** The deployed action's __OW_ACTION_NAME (its init env), for the log. */
    private volatile String initName;
    private volatile boolean concurrent;
    private final AtomicBoolean running = new AtomicBoolean();
    /** Actions already warned about: no api_key in /run, so no annotation lookup (warned once each). */
    private final Map<String, Boolean> warnedNoApiKey = new ConcurrentHashMap<>();

    public OpenWhiskAdapter(FunctionRuntime rt) {
        this.rt = rt;
        this.cfg = rt.config();
        this.metrics = rt.metrics();
        this.err = rt.err();
    }

    /** The value object of the init that deployed the action. */
    JsonObject initValue() { return initValue; }

    /**
     * {@code POST /init}. It answers once the runtime is ready to run the action's first activation
     * at its quota: served by the agent ({@link FunctionRuntime#warmSlots}) and, when the init
     * carries the cold start's {@code __OW_*} fields as the invoker sends them, with the action's
     * annotations read: the read runs beside the wait for the agent, and is waited for at most its
     * budget (CPUSLOT_ANNOTATION_TIMEOUT_MS) after that. The invoker sends the cold start's /run as soon as the init answers, and the
     * init's time is its own in OpenWhisk (the activation's initTime, within the action's time
     * limit); a /run never waits for the read. A read not in by then: fail-open, the first
     * activations take the next quota source (cpuslot_annotation_pending_total).
     */
    public Reply init(JsonObject body) {
        Reply r = init(body, true);
        if (r.status() != 200) return r;
        CompletableFuture<?> read = rt.prefetchAnnotations();
        rt.warmSlots("/init");
        if (read != null && !rt.awaitAnnotations(read))
            Log.info("annotation read for " + initName + " not answered within CPUSLOT_ANNOTATION_TIMEOUT_MS ("
                    + cfg.annotationTimeoutMs() + " ms); /init answers, and activations take the next quota source until it is in");
        return r;
    }

    /** @param openwhisk false: Knative's init, whose action gets a pool of the runtime's size (CPUSLOT_SANDBOXES) */
    Reply init(JsonObject body, boolean openwhisk) {
        synchronized (initLock) {
            if (rt.initialized()) {
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
                int sandboxes = 0; // Knative's: the runtime's size
                if (openwhisk) {
                    concurrent = cfg.owConcurrent() || "true".equalsIgnoreCase(env.getOrDefault("__OW_ALLOW_CONCURRENT", "").trim());
                    sandboxes = sandboxes(env);
                }
                String language = rt.deploy(name, lang, bin, binary ? null : code, main, env, sandboxes, openwhisk);
                initValue = v.deepCopy();
                initName = env.get("__OW_ACTION_NAME");
                Log.info("initialised " + language + " action " + name + " (main " + main + ")");
                return Reply.ok();
            } catch (Exception e) {
                String msg = e instanceof IllegalArgumentException ? e.getMessage() : "An error has occurred (see logs for details): " + e;
                err.println(msg);
                Log.info("init failed: " + msg);
                metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "init_failed"));
                rt.sentinels();
                return Reply.error(502, msg);
            }
        }
    }

    /**
     * OpenWhisk sends one activation at a time to a container unless the action allows
     * concurrency, and then says so with {@code __OW_ALLOW_CONCURRENT} (container environment, or
     * the action's /init env). Concurrent: sandboxes grow on demand up to CPUSLOT_OW_MAX_CONCURRENCY
     * (per action: /init env CPUSLOT_SANDBOXES, at most that). Otherwise one sandbox, and an
     * overlapping /run is refused as OpenWhisk's runtimes refuse it.
     */
    private int sandboxes(Map<String, String> initEnv) {
        int max = concurrent ? cfg.owMaxConcurrency() : 1;
        String per = initEnv.get(Config.INIT_SANDBOXES_ENV);
        if (concurrent && per != null && !per.isBlank()) {
            try {
                max = Math.max(1, Math.min(max, Integer.parseInt(per.trim())));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException(Config.INIT_SANDBOXES_ENV + " is not a number: " + per);
            }
        }
        return max;
    }

    /**
     * {@code POST /run}.
     *
     * @param usageAsked the request asked for its CPU usage in the answer ({@link Config#USAGE_HEADER})
     */
    public Reply run(JsonObject body, String quotaHeader, boolean usageAsked) {
        JsonElement value = body.has("value") ? body.get("value") : new JsonObject();
        JsonObject activation = new JsonObject();
        for (Map.Entry<String, JsonElement> e : body.entrySet()) if (!e.getKey().equals("value")) activation.add(e.getKey(), e.getValue());
        Invocation inv = new Invocation(this, null, activation, value, quotaHeader, usageAsked);
        if (concurrent) return rt.run(inv);
        // one activation at a time, as OpenWhisk's runtimes without __OW_ALLOW_CONCURRENT
        if (!running.compareAndSet(false, true)) {
            metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "not_concurrent"));
            err.println("Internal system error: System not ready, status is running.");
            err.flush();
            return Reply.error(403, "System not ready, status is running.");
        }
        try {
            return rt.run(inv);
        } finally {
            running.set(false);
        }
    }

    /**
     * The answer to a {@code /run} the runtime cannot take now (over the front's cap): 200 with
     * {@code error}, which OpenWhisk's invoker records as the activation's application error, the
     * text shown to its caller, and the container kept. Any other status it reads as the
     * container's failure (it destroys it, its other activations with it), a 503 as its shutdown.
     */
    static Reply refused(String msg) {
        return Reply.error(200, msg);
    }

    @Override public String name() { return "openwhisk"; }
    @Override public boolean sentinels() { return true; }
    @Override public JsonElement body(Result r) { return r.value(); }

    /**
     * OpenWhisk sends no api_key to actions created without {@code -a provide-api-key true} (the
     * default for new actions in recent OpenWhisk): then the annotation cannot be read and, with
     * no other quota source, the invocation runs without a slot. Say so once per action; count it.
     */
    @Override
    public void noQuota(Map<String, String> env, String action) {
        if (!cfg.annotationLookup()) return;
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

    private static String str(JsonObject o, String k, String def) {
        JsonElement e = o.get(k);
        return e == null || e.isJsonNull() || !e.isJsonPrimitive() ? def : e.getAsString();
    }
}
