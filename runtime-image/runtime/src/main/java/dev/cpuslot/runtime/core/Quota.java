package dev.cpuslot.runtime.core;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;

import java.math.BigDecimal;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Lazy;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.chain.ConductorFunction;

/**
 * Where an invocation's CPU quota comes from, highest first:
 * <ol>
 * <li>the invocation: parameter {@code __cpuslot_quota} in {@code value} (OpenWhisk, Knative,
 *     Hydra) or header {@code X-Cpuslot-Quota} (Knative, Hydra), each only when the operator
 *     allows it;</li>
 * <li>the OpenWhisk action's annotation {@code cpu-quota}, read once per action version from
 *     {@code GET {__OW_API_HOST}/api/v1/namespaces/{ns}/actions/{name}?code=false} with the
 *     activation's api_key (the key is used for that one read only: never stored beyond the
 *     request, never logged). The read runs in the background: activations never wait for it,
 *     they use the next source until the answer is in; a failed read is retried after 30 s.
 *     OpenWhisk's /init starts it and answers once it is in, within its budget;</li>
 * <li>the init-time environment value {@code CPUSLOT_QUOTA} (OpenWhisk/Knative {@code /init} env,
 *     Hydra {@code /register?quota=});</li>
 * <li>the pod's default {@code CPUSLOT_DEFAULT_QUOTA} (env, e.g. from the downward API).</li>
 * </ol>
 * Every value is capped at {@code CPUSLOT_MAX_QUOTA_MILLI}. A value that does not parse is an
 * error: the invocation is refused in the platform's error format.
 */
public final class Quota {
    /** A resolved quota: millicores (0 = run without a slot) and where it came from. */
    public record Resolved(long milli, String source, boolean capped) {}

    public static final class InvalidQuotaException extends Exception {
        final String source;
        InvalidQuotaException(String source, String msg) { super(msg); this.source = source; }
        public String source() { return source; }
    }

    /**
     * Parses a Kubernetes-style CPU quantity: {@code "250m"} = 250 millicores, {@code "0.5"} or
     * {@code 0.5} = 500, {@code "2"} or {@code 2} = 2000 (plain numbers are cores, as in pod specs).
     */
    public static long parseMilli(JsonElement e) throws IllegalArgumentException {
        if (e == null || e.isJsonNull()) throw new IllegalArgumentException("empty");
        if (!e.isJsonPrimitive()) throw new IllegalArgumentException("not a string or number: " + e);
        return parseMilli(e.getAsString());
    }

    public static long parseMilli(String s) throws IllegalArgumentException {
        if (s == null) throw new IllegalArgumentException("empty");
        String t = s.trim();
        if (t.isEmpty()) throw new IllegalArgumentException("empty");
        try {
            BigDecimal v;
            if (t.endsWith("m")) v = new BigDecimal(t.substring(0, t.length() - 1));
            else v = new BigDecimal(t).multiply(BigDecimal.valueOf(1000));
            if (v.signum() <= 0) throw new IllegalArgumentException("not positive: " + s);
            if (v.compareTo(BigDecimal.valueOf(0xFFFFFFFFL)) > 0) throw new IllegalArgumentException("too large: " + s);
            long m = v.setScale(0, java.math.RoundingMode.CEILING).longValueExact();
            return m;
        } catch (NumberFormatException | ArithmeticException ex) {
            throw new IllegalArgumentException("not a CPU quantity (use e.g. 250m or 0.25): " + s);
        }
    }

    private final Config cfg;
    private final Metrics metrics;
    private final Lazy<HttpClient> http;
    /** An action's annotations (key to value), read once per action version. */
    private record CacheEntry(CompletableFuture<Map<String, JsonElement>> value, long expiresNanos) {}
    private final Map<String, CacheEntry> annotations = new ConcurrentHashMap<>();
    /** The pod's lending default (CPUSLOT_DEFAULT_LEND): most invocations' answer, made once. */
    private final Lend defaultLend;
    static final long NEGATIVE_TTL_NS = TimeUnit.SECONDS.toNanos(30);

    public Quota(Config cfg, Metrics metrics) {
        this.cfg = cfg;
        this.metrics = metrics;
        this.defaultLend = new Lend(cfg.defaultLend(), "default");
        this.http = Lazy.httpClient(b -> b.connectTimeout(Duration.ofMillis(cfg.annotationTimeoutMs())));
    }

    /**
     * @param invocationValue the invocation's value (may hold __cpuslot_quota), or null
     * @param header          the X-Cpuslot-Quota header, or null
     * @param owEnv           the activation's __OW_* values (for the annotation lookup), or empty
     * @param initQuota       the init-time CPUSLOT_QUOTA, or null
     */
    public Resolved resolve(JsonElement invocationValue, String header, Map<String, String> owEnv, String initQuota)
            throws InvalidQuotaException {
        if (cfg.allowInvocationQuota() && invocationValue != null && invocationValue.isJsonObject()
                && invocationValue.getAsJsonObject().has(Config.QUOTA_PARAM)) {
            return of("invocation", invocationValue.getAsJsonObject().get(Config.QUOTA_PARAM).isJsonPrimitive()
                    ? invocationValue.getAsJsonObject().get(Config.QUOTA_PARAM).getAsString()
                    : invocationValue.getAsJsonObject().get(Config.QUOTA_PARAM).toString());
        }
        if (cfg.allowHeaderQuota() && header != null && !header.isBlank()) return of("header", header);
        String ann = annotation(owEnv);
        if (ann != null) return of("annotation", ann);
        if (initQuota != null && !initQuota.isBlank()) return of("init", initQuota);
        if (cfg.defaultQuota() != null) return of("default", cfg.defaultQuota());
        return new Resolved(0, "none", false);
    }

    /** Whether an action's invocations sleep in their synchronous chain calls, and where that came from. */
    public record Lend(boolean lends, String source) {}

    /** The OpenWhisk annotation that sets an action's lending (true or false). */
    static final String LEND_ANNOTATION = "cpu-lend";

    /**
     * Whether the action's leases sleep while it waits on a synchronous chain call (so the agent
     * may lend their quota, docs/lending.md), from the action's sources as its quota: the
     * OpenWhisk annotation {@value #LEND_ANNOTATION}, the init-time {@code CPUSLOT_LEND}
     * ({@code /init} env, Hydra {@code /register?lend=}), the pod's {@code CPUSLOT_DEFAULT_LEND}.
     * Lending still needs the agent's LEND (the pod's {@code admission.lendRatio}): an action
     * can only stay out of it, or be in it where the runtime's default leaves it out.
     *
     * @param initLend the init-time CPUSLOT_LEND, or null
     */
    public Lend lend(Map<String, String> owEnv, String initLend) throws InvalidQuotaException {
        JsonElement ann = annotationValue(owEnv, LEND_ANNOTATION, false);
        if (ann != null && !ann.isJsonNull())
            return lendOf("annotation", LEND_ANNOTATION, ann.isJsonPrimitive() ? ann.getAsString() : ann.toString());
        if (initLend != null && !initLend.isBlank()) return lendOf("init", Config.INIT_LEND_ENV, initLend);
        return defaultLend;
    }

    private Lend lendOf(String source, String name, String raw) throws InvalidQuotaException {
        try {
            return new Lend(Config.parseBool(name, raw), source);
        } catch (IllegalArgumentException e) {
            metrics.inc("cpuslot_lend_invalid_total", Metrics.labels("source", source));
            throw new InvalidQuotaException(source, "invalid lending setting from " + source + ": " + e.getMessage());
        }
    }

    /** The last value that parsed: most invocations repeat one (the init env's), parsed once then. */
    private record Parsed(String raw, long milli) {}
    private volatile Parsed lastParsed;

    private Resolved of(String source, String raw) throws InvalidQuotaException {
        long m;
        Parsed last = lastParsed;
        if (last != null && last.raw().equals(raw)) {
            m = last.milli();
        } else {
            try {
                m = parseMilli(raw);
            } catch (IllegalArgumentException e) {
                metrics.inc("cpuslot_quota_invalid_total", Metrics.labels("source", source));
                throw new InvalidQuotaException(source, "invalid CPU quota from " + source + ": " + e.getMessage());
            }
            lastParsed = new Parsed(raw, m);
        }
        if (cfg.maxQuotaMilli() > 0 && m > cfg.maxQuotaMilli()) {
            metrics.inc("cpuslot_quota_capped_total", Metrics.labels("source", source));
            Log.warn("quota " + m + "m from " + source + " capped at " + cfg.maxQuotaMilli() + "m");
            return new Resolved(cfg.maxQuotaMilli(), source, true);
        }
        return new Resolved(m, source, false);
    }

    /**
     * Starts the read of the action's annotations for an /init that carries the cold start's
     * {@code __OW_*} fields (OpenWhisk's invoker sends them): the same read, cache and key as an
     * activation's. Returns the read, for the init to wait for ({@link #awaitRead}); null when
     * there is none (lookup off, no api_key or action name).
     */
    CompletableFuture<?> prefetch(Map<String, String> ow) {
        annotationValue(ow, cfg.annotationKey(), false);
        CacheEntry e = ow == null || ow.get("__OW_ACTION_NAME") == null ? null : annotations.get(cacheKey(ow));
        return e == null ? null : e.value;
    }

    /**
     * Waits for a read {@link #prefetch} started, at most CPUSLOT_ANNOTATION_TIMEOUT_MS (the read's
     * own budget): true when it has answered (a failure too: the activations then take the next
     * source at once), false when it has not in time (fail-open: the first activations take the
     * next source, counted in cpuslot_annotation_pending_total, and its answer serves the later ones).
     */
    boolean awaitRead(CompletableFuture<?> read) {
        try {
            read.get(cfg.annotationTimeoutMs(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            return false;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        } catch (java.util.concurrent.ExecutionException | java.util.concurrent.CancellationException e) {
            // answered with a failure: annotationValue counts and logs it when it is used
        }
        return true;
    }

    private static String cacheKey(Map<String, String> ow) {
        return ow.get("__OW_ACTION_NAME") + "@" + ow.getOrDefault("__OW_ACTION_VERSION", "");
    }

    /** The action's quota annotation, cached per action version; null when absent or unknown. */
    String annotation(Map<String, String> ow) {
        JsonElement v = annotationValue(ow, cfg.annotationKey(), true);
        return v == null ? null : v.isJsonPrimitive() ? v.getAsString() : v.toString();
    }

    /**
     * Whether the action is an OpenWhisk conductor action (its {@code conductor} annotation is
     * truthy): false until the annotations are read (ConductorFunction).
     */
    boolean conductor(Map<String, String> ow) {
        return ConductorFunction.truthy(annotationValue(ow, ConductorFunction.ANNOTATION, false));
    }

    /**
     * One annotation of the action, from the read of its annotations; null when absent or not read
     * yet. {@code countPending}: count an activation that goes on without it (once per activation: the quota's read).
     */
    private JsonElement annotationValue(Map<String, String> ow, String annotationKey, boolean countPending) {
        if (!cfg.annotationLookup() || ow == null) return null;
        String apiHost = ow.getOrDefault("__OW_API_HOST", cfg.apiHost());
        String key = ow.get("__OW_API_KEY"), action = ow.get("__OW_ACTION_NAME");
        if (apiHost == null || key == null || action == null || key.isEmpty()) return null;
        String cacheKey = cacheKey(ow);
        long now = System.nanoTime();
        CacheEntry e = annotations.compute(cacheKey, (k, old) -> {
            if (old != null && (old.expiresNanos == Long.MAX_VALUE || old.expiresNanos > now)) return old;
            metrics.inc("cpuslot_annotation_lookups_total");
            return new CacheEntry(fetch(apiHost, key, action), Long.MAX_VALUE);
        });
        // never wait for it: until the lookup has answered, the activation runs with the next
        // source (init env, pod default); the answer serves the following activations
        if (!e.value.isDone()) {
            if (countPending) metrics.inc("cpuslot_annotation_pending_total");
            return null;
        }
        try {
            return e.value.getNow(Map.of()).get(annotationKey);
        } catch (Exception ex) {
            // failed lookups are retried after a while; the invocation falls back to the next source
            if (e.expiresNanos == Long.MAX_VALUE) { // first time this failure is seen
                annotations.computeIfPresent(cacheKey, (k, old) -> old == e ? new CacheEntry(e.value, now + NEGATIVE_TTL_NS) : old);
                metrics.inc("cpuslot_annotation_errors_total");
                Log.warn("annotation lookup for " + action + " failed: " + ex);
            }
            return null;
        }
    }

    private CompletableFuture<Map<String, JsonElement>> fetch(String apiHost, String apiKey, String action) {
        String base = apiHost.startsWith("http://") || apiHost.startsWith("https://") ? apiHost : "https://" + apiHost;
        if (base.endsWith("/")) base = base.substring(0, base.length() - 1);
        // action_name is /namespace/[package/]name
        String[] parts = action.replaceFirst("^/", "").split("/");
        if (parts.length < 2) return CompletableFuture.failedFuture(new IllegalArgumentException("bad action name " + action));
        StringBuilder name = new StringBuilder();
        for (int i = 1; i < parts.length; i++) {
            if (i > 1) name.append('/');
            name.append(enc(parts[i]));
        }
        URI uri = URI.create(base + "/api/v1/namespaces/" + enc(parts[0]) + "/actions/" + name + "?code=false");
        HttpRequest req = HttpRequest.newBuilder(uri)
                .timeout(Duration.ofMillis(cfg.annotationTimeoutMs()))
                .header("Authorization", "Basic " + Base64.getEncoder().encodeToString(apiKey.getBytes(StandardCharsets.UTF_8)))
                .header("Accept", "application/json")
                .GET().build();
        return http.get().sendAsync(req, HttpResponse.BodyHandlers.ofString()).thenApply(r -> {
            if (r.statusCode() != 200) throw new IllegalStateException("HTTP " + r.statusCode() + " from " + uri);
            JsonObject o = JsonParser.parseString(r.body()).getAsJsonObject();
            JsonArray anns = o.has("annotations") && o.get("annotations").isJsonArray() ? o.getAsJsonArray("annotations") : new JsonArray();
            Map<String, JsonElement> m = new java.util.HashMap<>();
            for (JsonElement a : anns) {
                if (!a.isJsonObject()) continue;
                JsonElement k = a.getAsJsonObject().get("key"), v = a.getAsJsonObject().get("value");
                if (k != null && k.isJsonPrimitive() && v != null) m.putIfAbsent(k.getAsString(), v);
            }
            return Map.copyOf(m);
        });
    }

    private static String enc(String s) { return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20"); }
}
