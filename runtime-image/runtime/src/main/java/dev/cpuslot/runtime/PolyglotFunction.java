package dev.cpuslot.runtime;

import com.google.gson.JsonElement;
import com.google.gson.JsonParser;
import org.graalvm.polyglot.Context;
import org.graalvm.polyglot.Engine;
import org.graalvm.polyglot.PolyglotException;
import org.graalvm.polyglot.Source;
import org.graalvm.polyglot.Value;

import java.util.Map;

/**
 * A JavaScript or Python function run by GraalVM Polyglot. One {@link Engine} per function (shared
 * code caches); one {@link Context} per worker, reused across that worker's invocations (as
 * Photons@Graal does), so invocations of one worker see module-level state of that worker only and
 * no function sees another's. No host access, no process environment, no threads, no native
 * access; I/O off for JavaScript; Python gets no host file system access beyond its own stdlib.
 *
 * <p>The invocation's environment ({@code __OW_*}) is exposed as {@code process.env} in
 * JavaScript and {@code os.environ} in Python (context-local emulation, not the process's).
 */
public final class PolyglotFunction implements Function {
    private static final String JS_WRAPPER = """
            (function(fn) {
              var st = {};
              return {
                call: function(a, e) {
                  globalThis.process = globalThis.process || {};
                  globalThis.process.env = JSON.parse(e);
                  st = {};
                  var r = fn(JSON.parse(a));
                  if (r !== null && typeof r === 'object' && typeof r.then === 'function') {
                    st.pending = true;
                    r.then(function(v) { st.pending = false; st.v = JSON.stringify(v === undefined ? null : v); },
                           function(err) { st.pending = false; st.err = String(err && err.stack ? err.stack : err); });
                    return '\\u0000promise';
                  }
                  var s = JSON.stringify(r === undefined ? null : r);
                  return s === undefined ? 'null' : s;
                },
                poll: function() {
                  if (st.pending) return '\\u0000pending';
                  if (st.err !== undefined) throw new Error(st.err);
                  return st.v;
                }
              };
            })""";

    private static final String PY_WRAPPER = """
            import json as __cpuslot_json, os as __cpuslot_os
            def __cpuslot_call(a, e, __f=%s):
                env = __cpuslot_json.loads(e)
                for k in [k for k in __cpuslot_os.environ if k.startswith('__OW_')]:
                    del __cpuslot_os.environ[k]
                __cpuslot_os.environ.update(env)
                return __cpuslot_json.dumps(__f(__cpuslot_json.loads(a)))
            """;

    private final String name, language, polyglotId, entry;
    private final Map<String, String> initEnv;
    private final Engine engine;
    private final Source source;

    public PolyglotFunction(String name, String language, String code, String entry, Map<String, String> initEnv) {
        this.name = name;
        this.language = language;
        this.polyglotId = switch (language) {
            case "javascript", "js", "nodejs" -> "js";
            case "python", "py" -> "python";
            default -> throw new IllegalArgumentException("unsupported language " + language);
        };
        this.entry = entry == null || entry.isBlank() ? "main" : entry;
        if (!this.entry.matches("[A-Za-z_$][A-Za-z0-9_$]*"))
            throw new IllegalArgumentException("entry point is not an identifier: " + entry);
        this.initEnv = Map.copyOf(initEnv);
        this.engine = Engine.newBuilder(polyglotId).option("engine.WarnInterpreterOnly", "false").build();
        this.source = Source.newBuilder(polyglotId, code, name + (polyglotId.equals("js") ? ".js" : ".py")).buildLiteral();
        // compile and check the entry point once, in a throwaway context, so /init reports errors
        Sandbox probe = newSandbox();
        probe.close();
    }

    @Override public String name() { return name; }
    @Override public String language() { return polyglotId.equals("js") ? "javascript" : "python"; }
    @Override public Map<String, String> initEnv() { return initEnv; }

    @Override
    public Sandbox newSandbox() {
        Context.Builder b = Context.newBuilder(polyglotId).engine(engine)
                .allowAllAccess(false)
                .allowCreateThread(false)
                .allowNativeAccess(false);
        if (polyglotId.equals("python")) b.option("python.ForceImportSite", "false");
        Context ctx = b.build();
        Value call;
        Value poll = null;
        try {
            ctx.eval(source);
            if (polyglotId.equals("js")) {
                Value fn = ctx.getBindings("js").getMember(entry);
                if (fn == null || !fn.canExecute())
                    throw new IllegalArgumentException("no function " + entry + " in the JavaScript code");
                Value w = ctx.eval("js", JS_WRAPPER).execute(fn);
                call = w.getMember("call");
                poll = w.getMember("poll");
            } else {
                Value fn = ctx.getBindings("python").getMember(entry);
                if (fn == null || !fn.canExecute())
                    throw new IllegalArgumentException("no function " + entry + " in the Python code");
                ctx.eval("python", PY_WRAPPER.formatted(entry));
                call = ctx.getBindings("python").getMember("__cpuslot_call");
            }
        } catch (PolyglotException e) {
            ctx.close(true);
            throw new IllegalArgumentException("the " + language() + " code does not load: " + e.getMessage());
        } catch (RuntimeException e) {
            ctx.close(true);
            throw e;
        }
        final Value fCall = call, fPoll = poll;
        return new Sandbox() {
            volatile boolean cancelled;

            @Override
            public JsonElement invoke(JsonElement args, Map<String, String> env) throws Exception {
                try {
                    String envJson = new com.google.gson.Gson().toJson(env);
                    String out = fCall.execute(args == null ? "{}" : args.toString(), envJson).asString();
                    if ("\u0000promise".equals(out)) {
                        out = fPoll.execute().asString();
                        if ("\u0000pending".equals(out)) throw new Function.FunctionError("the action's promise did not resolve", null);
                    }
                    return out == null ? null : JsonParser.parseString(out);
                } catch (PolyglotException e) {
                    if (e.isCancelled() || cancelled) throw new Function.FunctionError("cancelled at the deadline", e);
                    throw new Function.FunctionError(e.getMessage(), e);
                }
            }

            @Override
            public void cancel(Thread worker) {
                cancelled = true;
                ctx.close(true);
            }

            @Override
            public boolean poisoned() { return cancelled; }

            @Override
            public void close() {
                try {
                    ctx.close(true);
                } catch (RuntimeException ignored) {
                }
            }
        };
    }

    @Override
    public void close() {
        try {
            engine.close(true);
        } catch (RuntimeException ignored) {
        }
    }
}
