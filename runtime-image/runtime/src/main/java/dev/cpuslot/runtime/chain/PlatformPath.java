package dev.cpuslot.runtime.chain;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.chain.ChainException;
import dev.cpuslot.chain.ChainException.Kind;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.nio.ByteBuffer;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Flow;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Pattern;
import dev.cpuslot.runtime.base.Lazy;

/**
 * Global after local (docs/chaining.md): a chain call whose callee this runtime does not host goes
 * through the platform's normal path. From an OpenWhisk activation: the OpenWhisk REST API
 * ({@code POST {__OW_API_HOST}/api/v1/namespaces/{ns}/actions/{name}?blocking=true&result=true})
 * with the activation's own api_key, in the caller's namespace. Otherwise, when configured, a
 * Knative service URL ({@code CPUSLOT_CHAIN_URLS} name=url, else the {@code CPUSLOT_CHAIN_URL}
 * pattern with {@code {name}} and {@code {namespace}}), with {@code {"value": args}}. Names are
 * checked against the platform's own rules before they go into a URL; the chain's depth goes with
 * the call as the parameter {@value #DEPTH_PARAM}, so that a chain through the platform stays bounded.
 */
public final class PlatformPath {
    /** The parameter that carries the chain's depth to a callee (stripped by the runtime that receives it). */
    public static final String DEPTH_PARAM = "__cpuslot_chain_depth";

    /** An OpenWhisk entity name (EntityName.scala), without the spaces it allows: the one name rule for both paths' URLs. */
    private static final Pattern OW_NAME = Pattern.compile("[A-Za-z0-9_][A-Za-z0-9_@.-]{0,255}");
    /** A Knative service name: a DNS-1035 label. */
    private static final Pattern DNS_LABEL = Pattern.compile("[a-z]([-a-z0-9]{0,61}[a-z0-9])?");

    /** Where a call goes: the URL, and the api key to send (null: none). */
    record Target(String kind, URI uri, String apiKey) {}

    /** What the chain's first activation brought: the platform's API and key (each null when not OpenWhisk). */
    public record Origin(String apiHost, String apiKey) {
        static final Origin NONE = new Origin(null, null);

        @Override public String toString() { return "Origin[" + apiHost + "]"; } // never the key
    }

    private final String urlPattern;
    private final Map<String, URI> urls;
    private final Lazy<HttpClient> http = Lazy.httpClient(b -> b.version(HttpClient.Version.HTTP_1_1).connectTimeout(Duration.ofSeconds(10)));

    public PlatformPath(String urlPattern, String urlMap) {
        this.urlPattern = urlPattern == null || urlPattern.isBlank() ? null : urlPattern.trim();
        this.urls = parseUrls(urlMap);
        if (this.urlPattern != null) {
            // checked once, at start: a pattern that makes no URL is the operator's error
            URI u = URI.create(this.urlPattern.replace("{name}", "x").replace("{namespace}", "x"));
            if (!"http".equals(u.getScheme()) && !"https".equals(u.getScheme()))
                throw new IllegalArgumentException("CPUSLOT_CHAIN_URL is not an http(s) URL pattern: " + urlPattern);
        }
    }

    static Map<String, URI> parseUrls(String spec) {
        Map<String, URI> m = new LinkedHashMap<>();
        if (spec == null || spec.isBlank()) return m;
        for (String kv : spec.split(",")) {
            if (kv.isBlank()) continue;
            int eq = kv.indexOf('=');
            if (eq <= 0) throw new IllegalArgumentException("CPUSLOT_CHAIN_URLS: not name=url: " + kv);
            URI u = URI.create(kv.substring(eq + 1).trim());
            if (!"http".equals(u.getScheme()) && !"https".equals(u.getScheme()))
                throw new IllegalArgumentException("CPUSLOT_CHAIN_URLS: not an http(s) URL: " + kv);
            m.put(kv.substring(0, eq).trim(), u);
        }
        return m;
    }

    /**
     * Where {@code callee} goes from a chain of {@code owner} that started with {@code origin}.
     * Throws BAD_NAME for a name the platform would not accept (nothing is sent), OTHER_OWNER for a
     * name in another namespace, NOT_LOCAL when there is no platform path.
     */
    Target target(Origin origin, String owner, String callee) {
        if (origin.apiHost() != null && origin.apiKey() != null && !origin.apiKey().isEmpty()) {
            // [/namespace/][package/]action, in the caller's namespace only
            String name = callee;
            String ns = owner.isEmpty() ? "_" : owner;
            if (name.startsWith("/")) {
                int slash = name.indexOf('/', 1);
                if (slash < 0) throw new ChainException(Kind.BAD_NAME, callee, "a fully qualified name is /namespace/[package/]action");
                String theirs = name.substring(1, slash);
                if (!theirs.equals(ns) && !theirs.equals("_"))
                    throw new ChainException(Kind.OTHER_OWNER, callee, "namespace '" + theirs + "' is not the caller's");
                name = name.substring(slash + 1);
            }
            String[] parts = name.split("/", -1);
            if (parts.length > 2) throw new ChainException(Kind.BAD_NAME, callee, "an OpenWhisk action name is [package/]action");
            for (String p : parts) checkName(callee, p, OW_NAME, "an OpenWhisk entity name (letters, digits, _ @ . -, starting with a letter, digit or _)");
            checkName(callee, ns, OW_NAME, "an OpenWhisk namespace");
            String base = origin.apiHost().startsWith("http://") || origin.apiHost().startsWith("https://") ? origin.apiHost() : "https://" + origin.apiHost();
            if (base.endsWith("/")) base = base.substring(0, base.length() - 1);
            // every part matched OW_NAME: nothing in it needs escaping or can leave its path segment
            return new Target("openwhisk", URI.create(base + "/api/v1/namespaces/" + ns + "/actions/" + name), origin.apiKey());
        }
        URI mapped = urls.get(callee);
        if (mapped != null) return new Target("knative", mapped, null);
        if (urlPattern != null) {
            checkName(callee, callee, DNS_LABEL, "a Knative service name (a DNS label: a-z, 0-9, -)");
            String u = urlPattern.replace("{name}", callee);
            if (u.contains("{namespace}")) {
                if (owner.isEmpty()) throw new ChainException(Kind.NOT_LOCAL, callee, "the caller has no namespace for CPUSLOT_CHAIN_URL's {namespace}");
                checkName(callee, owner, DNS_LABEL, "a namespace (a DNS label)");
                u = u.replace("{namespace}", owner);
            }
            return new Target("knative", URI.create(u), null);
        }
        throw new ChainException(Kind.NOT_LOCAL, callee, "no function of that name in this runtime, and no platform path to call it"
                + " (an OpenWhisk activation with an api_key and __OW_API_HOST, or CPUSLOT_CHAIN_URL / CPUSLOT_CHAIN_URLS)");
    }

    /** A step of a declared sequence: {@code [/namespace/][package/]name}, each part an OpenWhisk entity name. */
    static boolean isStepName(String s) {
        String n = s.startsWith("/") ? s.substring(1) : s;
        String[] parts = n.split("/", -1);
        if (parts.length > 3 || (!s.startsWith("/") && parts.length > 2)) return false;
        for (String p : parts) if (!OW_NAME.matcher(p).matches()) return false;
        return true;
    }

    private static void checkName(String callee, String part, Pattern rule, String what) {
        if (!rule.matcher(part).matches())
            throw new ChainException(Kind.BAD_NAME, callee, "not " + what);
    }

    /** What a call through the platform gave: the result (null for an asynchronous call) and the platform's activation id, if it said. */
    record Result(JsonElement result, String activationId) {}

    /**
     * Calls {@code t} with {@code args} (its depth added), waiting at most until {@code deadlineNanos};
     * {@code async}: OpenWhisk's non-blocking invoke (Knative: the answer is not waited for beyond
     * its status). Every failure is a ChainException naming the callee; the key is never in one.
     */
    Result call(Target t, String callee, JsonElement args, int depth, long deadlineNanos, boolean async) {
        JsonObject params = args.isJsonObject() ? args.getAsJsonObject().deepCopy() : new JsonObject();
        if (!args.isJsonObject()) params.add("value", args); // OpenWhisk parameters are an object
        params.addProperty(DEPTH_PARAM, depth);
        JsonElement body = params;
        URI uri = t.uri();
        if (t.kind().equals("openwhisk")) {
            uri = URI.create(uri + (async ? "?blocking=false" : "?blocking=true&result=true"));
        } else {
            JsonObject v = new JsonObject(); // the single entrypoint's shape (a cpuslot runtime, OpenWhisk's Knative runtimes)
            v.add("value", params);
            body = v;
        }
        long left = deadlineNanos - System.nanoTime();
        if (left <= 0) throw new ChainException(Kind.TIMEOUT, callee, "no time left before the caller's deadline");
        HttpRequest.Builder b = HttpRequest.newBuilder(uri)
                .timeout(Duration.ofNanos(left))
                .header("Content-Type", "application/json")
                .header("Accept", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body.toString(), StandardCharsets.UTF_8));
        if (t.apiKey() != null) b.header("Authorization", "Basic " + Base64.getEncoder().encodeToString(t.apiKey().getBytes(StandardCharsets.UTF_8)));
        HttpResponse<byte[]> r;
        // the whole exchange, body included, ends by the deadline; the body is bounded
        CompletableFuture<HttpResponse<byte[]>> f = http.get().sendAsync(b.build(), limited(MAX_ANSWER_BYTES));
        try {
            r = f.get(Math.max(1, deadlineNanos - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            f.cancel(true);
            throw new ChainException(Kind.TIMEOUT, callee, "no answer from " + t.kind() + " before the caller's deadline");
        } catch (InterruptedException e) {
            f.cancel(true);
            Thread.currentThread().interrupt();
            throw new ChainException(Kind.TIMEOUT, callee, "the caller was cancelled");
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            if (c instanceof HttpTimeoutException)
                throw new ChainException(Kind.TIMEOUT, callee, "no answer from " + t.kind() + " before the caller's deadline");
            if (c instanceof TooLarge)
                throw new ChainException(Kind.PLATFORM, callee, t.kind() + "'s answer is larger than " + (MAX_ANSWER_BYTES >> 20) + " MiB");
            throw new ChainException(Kind.PLATFORM, callee, t.kind() + " unreachable at " + uri.getHost() + ":" + uri.getPort() + ": " + c);
        }
        String id = r.headers().firstValue("X-Openwhisk-Activation-Id").orElse(null);
        int s = r.statusCode();
        if (async && (s == 202 || s == 200)) return new Result(null, id);
        if (s == 202) // a blocking invoke OpenWhisk stopped waiting for (its 60 s): still running
            throw new ChainException(Kind.TIMEOUT, callee, "OpenWhisk answered 202: the activation " + (id == null ? "" : id + " ") + "was still running");
        JsonElement result = null;
        try {
            result = JsonParser.parseString(new String(r.body(), StandardCharsets.UTF_8));
        } catch (RuntimeException ignored) {
            // not JSON: reported below
        }
        String error = result != null && result.isJsonObject() && result.getAsJsonObject().has("error")
                ? jsonText(result.getAsJsonObject().get("error")) : null;
        if (s == 200) {
            if (result == null || !(result.isJsonObject() || result.isJsonArray()))
                throw new ChainException(Kind.FAILED, callee, "the callee did not return a dictionary");
            return new Result(result, id);
        }
        // 502: the callee's own (application or developer) error; anything else: the platform refused or failed
        if (s == 502 && t.kind().equals("openwhisk"))
            throw new ChainException(Kind.FAILED, callee, error != null ? error : "HTTP 502 from the OpenWhisk API");
        throw new ChainException(Kind.PLATFORM, callee, t.kind() + " answered HTTP " + s + (error != null ? ": " + error : ""));
    }

    /**
     * Most bytes of an answer the runtime takes: the answer comes from outside (a tenant's own
     * service), and buffered whole it must not take the memory the other functions here need.
     * OpenWhisk's own results are at most 1 MiB by default (whisk.activation.payload.max).
     */
    static final int MAX_ANSWER_BYTES = 8 << 20;

    private static final class TooLarge extends IOException {
        TooLarge() { super("answer too large", null); }
    }

    /** The body as bytes, refused (the exchange cancelled) once it passes {@code max}. */
    static HttpResponse.BodyHandler<byte[]> limited(int max) {
        return info -> new HttpResponse.BodySubscriber<>() {
            private final CompletableFuture<byte[]> done = new CompletableFuture<>();
            private final java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
            private Flow.Subscription sub;

            @Override public CompletionStage<byte[]> getBody() { return done; }

            @Override
            public void onSubscribe(Flow.Subscription s) {
                sub = s;
                s.request(Long.MAX_VALUE);
            }

            @Override
            public void onNext(List<ByteBuffer> items) {
                if (done.isDone()) return;
                for (ByteBuffer b : items) {
                    if ((long) buf.size() + b.remaining() > max) {
                        sub.cancel();
                        done.completeExceptionally(new TooLarge());
                        return;
                    }
                    byte[] a = new byte[b.remaining()];
                    b.get(a);
                    buf.write(a, 0, a.length);
                }
            }

            @Override public void onError(Throwable t) { done.completeExceptionally(t); }

            @Override public void onComplete() { done.complete(buf.toByteArray()); }
        };
    }

    private static String jsonText(JsonElement e) {
        String s = e.isJsonPrimitive() ? e.getAsString() : e.toString();
        return s.length() > 1024 ? s.substring(0, 1024) + "..." : s;
    }
}
