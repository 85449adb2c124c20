package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

import java.util.Map;

/**
 * An HTTP-agnostic reply, as a platform's adapter renders it for the HTTP front. {@code after}:
 * work for after the reply is sent (the activation's log line and usage metrics), or null.
 */
public record Reply(int status, JsonElement body, Map<String, String> headers, Runnable after) {
    public Reply(int status, JsonElement body, Map<String, String> headers) { this(status, body, headers, null); }

    public static Reply ok(JsonElement b) { return new Reply(200, b, Map.of()); }

    /** {@code {"ok": true}}: an init, a warm-up or a health check that went well. */
    public static Reply ok() {
        JsonObject o = new JsonObject();
        o.addProperty("ok", true);
        return ok(o);
    }

    /** {@code {"error": msg}}: the error shape every platform here shares. */
    public static Reply error(int status, String msg) {
        JsonObject o = new JsonObject();
        o.addProperty("error", msg);
        return new Reply(status, o, Map.of());
    }
}
