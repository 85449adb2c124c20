package dev.cpuslot.runtime.front;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Lazy;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.core.Invocation;
import dev.cpuslot.runtime.core.Reply;
import dev.cpuslot.runtime.core.Result;
import dev.cpuslot.runtime.core.Platform;
import dev.cpuslot.runtime.core.FunctionRuntime;

/**
 * Graalvisor/Hydra's protocol: functions registered by name ({@code /register},
 * {@code /deregister}) and invoked as {@code {"name", "arguments": "<JSON string>"}}, answered
 * {@code {"result", "process time (us)"}}. The registered functions are the co-located set that
 * local chain calls reach; the core hosts them.
 */
public final class HydraAdapter {
    private final FunctionRuntime rt;
    private final Config cfg;
    private final Metrics metrics;
    private final Lazy<HttpClient> http = Lazy.httpClient(b -> b.connectTimeout(Duration.ofSeconds(10))
            .followRedirects(HttpClient.Redirect.NORMAL));

    public HydraAdapter(FunctionRuntime rt) {
        this.rt = rt;
        this.cfg = rt.config();
        this.metrics = rt.metrics();
    }

    /** {@code /register?name=&url=&entryPoint=&language=&sandbox=[&quota=][&lend=]}; code from the body or url. */
    public Reply register(Map<String, String> q, byte[] body) {
        String name = q.get("name");
        if (name == null || name.isBlank()) return Reply.error(400, "missing name");
        String language = q.getOrDefault("language", "java").toLowerCase(Locale.ROOT);
        String entry = q.get("entryPoint");
        Reply refused = rt.checkOwner(q.get("owner"), "/register of " + name);
        if (refused != null) return refused;
        String who = owner(q);
        String existing = rt.ownerOf(name);
        if (existing != null && !existing.equals(who)) return otherOwner(name, "/register");
        try {
            // read at each invocation as the quota is; one that can never be read is refused now, before any code is fetched
            if (q.containsKey("lend")) Config.parseBool("lend", q.get("lend"));
            byte[] code = q.containsKey("steps") ? null : body != null && body.length > 0 ? body : fetch(q.get("url"));
            Map<String, String> env = new LinkedHashMap<>();
            if (q.containsKey("quota")) env.put(Config.INIT_QUOTA_ENV, q.get("quota"));
            if (q.containsKey("lend")) env.put(Config.INIT_LEND_ENV, q.get("lend"));
            if (q.containsKey("sandbox")) env.put("CPUSLOT_SANDBOX", q.get("sandbox"));
            if (q.containsKey("conductor")) env.put(FunctionRuntime.CONDUCTOR_ENV, q.get("conductor"));
            long timeoutMs = 0;
            if (q.containsKey("timeout")) {
                try {
                    timeoutMs = Long.parseLong(q.get("timeout").trim());
                } catch (NumberFormatException e) {
                    timeoutMs = -1;
                }
                if (timeoutMs <= 0) throw new IllegalArgumentException("timeout is not a number of milliseconds above 0: " + q.get("timeout"));
            }
            boolean java = language.equals("java");
            try {
                // steps=a,b,c: a sequence of functions (local first, then the platform's), no code of its own
                rt.register(name, who, timeoutMs, q.get("steps"), language, java ? code : null,
                        java || code == null ? null : new String(code, StandardCharsets.UTF_8), java && entry == null ? "main" : entry, env);
            } catch (FunctionRuntime.OtherOwnerException e) { // registered by another owner meanwhile
                return otherOwner(name, "/register");
            }
            Log.info("registered " + language + " function " + name);
            rt.warmSlots("/register");
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

    /** The owner a request names ({@code owner=}; none: the anonymous owner ""). */
    private static String owner(Map<String, String> q) {
        String o = q.get("owner");
        return o == null ? "" : o.trim();
    }

    /** 403 for a name another owner registered: no owner replaces or removes another's function, in any mode. */
    private Reply otherOwner(String name, String what) {
        metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "other_owner"));
        String msg = what + " of " + name + " refused: the function " + name + " belongs to another owner";
        Log.warn(msg);
        return Reply.error(403, msg);
    }

    /** {@code /deregister?name=&owner=}: only the owner's own function. */
    public Reply deregister(Map<String, String> q) {
        String name = q.get("name");
        boolean removed; // every function carries its owner: the check is the same in every mode
        try {
            removed = name != null && rt.deregister(name, owner(q));
        } catch (FunctionRuntime.OtherOwnerException e) {
            return otherOwner(name, "/deregister");
        }
        if (!removed) return Reply.error(404, "no function named " + name);
        JsonObject o = new JsonObject();
        o.addProperty("deregistered", name);
        return Reply.ok(o);
    }

    /**
     * Hydra invoke: {@code {"name", "arguments": "<JSON string>"}} -> {@code {"result", "process time (us)"}}.
     *
     * @param report     the body carries the slot's report too ({@code X-Cpuslot-Report: body})
     * @param usageAsked the request asked for its CPU usage in the answer ({@link Config#USAGE_HEADER})
     */
    public Reply invoke(JsonObject body, String quotaHeader, boolean report, boolean usageAsked) {
        String name = body.get("name").isJsonPrimitive() ? body.get("name").getAsString() : null;
        if (name == null || rt.ownerOf(name) == null) {
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
        boolean inBody = report || cfg.reportInBody();
        return rt.run(new Invocation(inBody ? REPORTED : PLAIN, name, activation, args, quotaHeader, usageAsked || inBody));
    }

    private static final Envelope PLAIN = new Envelope(false), REPORTED = new Envelope(true);

    /** Hydra's reply: the result in an envelope, with the slot's report when asked. No sentinels. */
    private record Envelope(boolean report) implements Platform {
        @Override public String name() { return "hydra"; }
        @Override public boolean sentinels() { return false; }
        @Override public JsonElement body(Result r) {
            JsonObject h = new JsonObject();
            h.add("result", r.value());
            h.addProperty("process time (us)", r.runNanos() / 1000);
            if (report) h.add("cpuslot", r.report());
            return h;
        }
    }
}
