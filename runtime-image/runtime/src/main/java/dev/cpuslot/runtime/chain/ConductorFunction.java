package dev.cpuslot.runtime.chain;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.cpuslot.chain.ChainException;

import java.util.Map;
import java.util.function.Predicate;
import dev.cpuslot.runtime.exec.Function;

/**
 * OpenWhisk's conductor actions (its docs/conductors.md), run in the runtime: a conductor returns
 * a continuation {@code {action, params, state}}; the named action runs on {@code params} as a
 * chain call of its own (local first, in its own slot at its own quota, then the platform's path),
 * and the conductor runs again on that action's result with the state's fields over it, until a
 * continuation names no action (the composition's result: its {@code params}, else all of it) or
 * is an error. The conductor's own runs are on its worker, in its slot (asleep while a component
 * runs). OpenWhisk's limits hold for the whole chain (nested compositions share them): at most
 * {@value LocalBus#MAX_STEPS} components and twice that plus one conductor runs.
 *
 * <p>Declared: OpenWhisk, the action's {@code conductor} annotation (truthy: not 0, null, false or
 * ""), read with the activation's key as the cpu-quota annotation is; the controller runs the
 * composition too, so the runtime answers it with the last continuation (no action: the
 * controller takes its params), and until the annotation is read the conductor's continuation
 * goes to the controller unchanged. Elsewhere (Knative, Hydra): {@value #ENV} in the function's
 * init env ({@code /register?conductor=true}); the runtime returns the composition's result.
 */
public final class ConductorFunction implements Function {
    public static final String ENV = "CPUSLOT_CHAIN_CONDUCTOR";
    public static final String ANNOTATION = "conductor";
    /** OpenWhisk's message words for a composition over its limits. */
    static final String TOO_LONG = "Too many actions in the composition (at most " + LocalBus.MAX_STEPS + " components and "
            + (2 * LocalBus.MAX_STEPS + 1) + " conductor runs).";

    private final Function inner;
    private final LocalBus bus;
    /** OpenWhisk: whether the action's annotation says conductor (null: not OpenWhisk, or no lookup). */
    private final Predicate<Map<String, String>> annotated;
    private final boolean declared;

    private ConductorFunction(Function inner, LocalBus bus, Predicate<Map<String, String>> annotated, boolean declared) {
        this.inner = inner;
        this.bus = bus;
        this.annotated = annotated;
        this.declared = declared;
    }

    /** {@code f} as a conductor when it may be one (declared, or an annotation to read); else {@code f} itself. */
    public static Function wrap(Function f, LocalBus bus, Predicate<Map<String, String>> annotated) {
        boolean declared = truthy(f.initEnv().get(ENV));
        if (f instanceof SequenceFunction || (!declared && annotated == null)) return f; // OpenWhisk ignores it on sequences
        return new ConductorFunction(f, bus, annotated, declared);
    }

    /** OpenWhisk's truthiness of an annotation: not 0, null, false or the empty string. */
    public static boolean truthy(JsonElement v) {
        if (v == null || v.isJsonNull()) return false;
        if (!v.isJsonPrimitive()) return true;
        var p = v.getAsJsonPrimitive();
        if (p.isBoolean()) return p.getAsBoolean();
        if (p.isNumber()) return p.getAsBigDecimal().signum() != 0;
        return !p.getAsString().isEmpty();
    }

    /** An init env value as OpenWhisk exports an init parameter (null as "", the rest as JSON text): the same truthiness. */
    static boolean truthy(String env) {
        if (env == null) return false;
        String t = env.trim();
        if (t.isEmpty() || t.equals("false") || t.equals("null")) return false;
        try {
            return new java.math.BigDecimal(t).signum() != 0;
        } catch (NumberFormatException e) {
            return true;
        }
    }

    @Override public String name() { return inner.name(); }

    @Override public String language() { return inner.language(); }

    @Override public Map<String, String> initEnv() { return inner.initEnv(); }

    @Override public void close() { inner.close(); }

    @Override
    public Sandbox newSandbox() throws Exception {
        Sandbox s = inner.newSandbox();
        return new Sandbox() {
            @Override
            public JsonElement invoke(JsonElement args, Map<String, String> env) throws Exception {
                boolean controller = annotated != null && annotated.test(env);
                LocalBus.Hop hop = LocalBus.current();
                if ((!controller && !declared) || hop == null) return s.invoke(args, env);
                return conduct(hop, a -> s.invoke(a, env), args, !controller);
            }

            @Override public void prepareThread() { s.prepareThread(); }

            @Override public void cancel(Thread worker) { s.cancel(worker); }

            @Override public boolean poisoned() { return s.poisoned(); }

            @Override public void close() { s.close(); }
        };
    }

    interface Run {
        JsonElement run(JsonElement args) throws Exception;
    }

    /**
     * The composition, from the conductor's first run on {@code input}. {@code unbox}: return its
     * result (the last continuation's params); else the last continuation itself (for the
     * OpenWhisk controller, which unboxes it).
     */
    private JsonElement conduct(LocalBus.Hop hop, Run conductor, JsonElement input, boolean unbox) throws Exception {
        LocalBus.Trace acc = hop.trace;
        JsonElement payload = input;
        JsonObject state = null;
        while (true) {
            if (acc.conductorRuns.incrementAndGet() > 2 * LocalBus.MAX_STEPS + 1) return error(TOO_LONG);
            JsonElement in = payload;
            if (state != null) { // the state's fields over the component's result
                JsonObject m = payload.isJsonObject() ? payload.getAsJsonObject().deepCopy() : box("value", payload);
                for (Map.Entry<String, JsonElement> e : state.entrySet()) m.add(e.getKey(), e.getValue());
                in = m;
            }
            JsonElement r = conductor.run(in);
            if (r == null || !r.isJsonObject() || r.getAsJsonObject().has("error")) return r; // the runtime's checks apply
            JsonObject c = r.getAsJsonObject();
            JsonElement p = c.get("params"), st = c.get("state"), next = c.get("action");
            JsonObject params = p == null ? null : p.isJsonObject() ? p.getAsJsonObject() : box("value", p);
            state = st == null ? null : st.isJsonObject() ? st.getAsJsonObject() : box("state", st);
            if (next == null) return unbox ? (params != null ? params : c) : c;
            String name = next.isJsonPrimitive() && next.getAsJsonPrimitive().isString() ? local(hop, next.getAsString().trim()) : null;
            // OpenWhisk gives the conductor a name it cannot resolve or may not use, and the limit, as an error to handle
            if (name == null || !PlatformPath.isStepName(name)) {
                payload = error("the continuation's action is not an action name: " + next);
            } else if (acc.components.incrementAndGet() > LocalBus.MAX_STEPS) {
                payload = error(TOO_LONG);
            } else {
                try {
                    payload = bus.component(hop, name, params != null ? params : new JsonObject());
                } catch (ChainException e) {
                    switch (e.kind()) {
                        // the component's own error, or a name not found, not accepted or not the owner's
                        case FAILED, NOT_LOCAL, BAD_NAME, OTHER_OWNER -> payload = error(e.getMessage());
                        // the platform's failure, a timeout, the depth bound: the composition ends with it
                        default -> throw e;
                    }
                }
            }
        }
    }

    /** {@code /ns/name} of the conductor's own namespace ({@code _}: the default) as the name a function here has. */
    private static String local(LocalBus.Hop hop, String name) {
        for (String ns : new String[] {hop.owner, "_"}) {
            String prefix = "/" + ns + "/";
            if (!ns.isEmpty() && name.startsWith(prefix) && name.indexOf('/', prefix.length()) < 0) return name.substring(prefix.length());
        }
        return name;
    }

    private static JsonObject box(String key, JsonElement v) {
        JsonObject o = new JsonObject();
        o.add(key, v);
        return o;
    }

    private static JsonObject error(String message) {
        JsonObject o = new JsonObject();
        o.addProperty("error", message);
        return o;
    }
}
