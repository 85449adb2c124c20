package dev.cpuslot.runtime.front;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;

import java.io.PrintStream;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.core.Invocation;
import dev.cpuslot.runtime.core.Reply;
import dev.cpuslot.runtime.core.Result;
import dev.cpuslot.runtime.core.Platform;
import dev.cpuslot.runtime.core.FunctionRuntime;

/**
 * Knative's single entrypoint {@code POST /}, as OpenWhisk's Knative runtimes shape it: an
 * {@code init} (OpenWhisk's init value), an {@code activation} with its {@code value}, or both in
 * one request. The action is the one {@link OpenWhiskAdapter} deploys; Knative sends its init
 * with every request, so the same code again is no second init. Errors and replies as OpenWhisk's.
 */
public final class KnativeAdapter implements Platform {
    private final FunctionRuntime rt;
    private final OpenWhiskAdapter ow;
    private final Metrics metrics;
    private final PrintStream err;

    public KnativeAdapter(FunctionRuntime rt, OpenWhiskAdapter ow) {
        this.rt = rt;
        this.ow = ow;
        this.metrics = rt.metrics();
        this.err = rt.err();
    }

    /**
     * {@code POST /}: {@code init}, {@code activation}+{@code value}, or both.
     *
     * @param usageAsked the request asked for its CPU usage in the answer ({@link Config#USAGE_HEADER})
     */
    public Reply handle(JsonObject body, String quotaHeader, boolean usageAsked) {
        if (body.has("init")) {
            boolean run = body.has("activation") || body.has("value");
            Reply r;
            synchronized (ow.initLock) {
                JsonElement init = body.get("init");
                if (rt.initialized() && init.isJsonObject() && sameCode(ow.initValue(), init.getAsJsonObject())) {
                    // Knative sends the init with every request (and to every pod scale-out adds):
                    // the same code again is not a second init; run the activation
                    metrics.inc("cpuslot_repeated_inits_total");
                    r = null;
                } else if (rt.initialized()) {
                    err.println("Cannot initialize the action more than once: this runtime already runs different code.");
                    metrics.inc("cpuslot_bad_requests_total", Metrics.labels("reason", "reinit_different"));
                    return Reply.error(403, "Cannot initialize the action more than once: this runtime already runs different code.");
                } else {
                    JsonObject initBody = new JsonObject();
                    initBody.add("value", init);
                    r = ow.init(initBody, false);
                }
            }
            if (r != null && r.status() == 200) rt.warmSlots("init");
            if (r == null && !run) return Reply.ok();
            if (r != null && (r.status() != 200 || !run)) return r;
        }
        JsonObject activation = body.has("activation") && body.get("activation").isJsonObject() ? body.getAsJsonObject("activation") : new JsonObject();
        JsonElement value = body.has("value") ? body.get("value") : new JsonObject();
        return rt.run(new Invocation(this, null, activation, value, quotaHeader, usageAsked));
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

    @Override public String name() { return "knative"; }
    @Override public boolean sentinels() { return true; }
    @Override public JsonElement body(Result r) { return r.value(); }
}
