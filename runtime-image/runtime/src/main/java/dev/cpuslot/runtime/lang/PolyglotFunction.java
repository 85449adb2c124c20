package dev.cpuslot.runtime.lang;

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import org.graalvm.polyglot.Context;
import org.graalvm.polyglot.Engine;
import org.graalvm.polyglot.PolyglotException;
import org.graalvm.polyglot.Source;
import org.graalvm.polyglot.Value;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicReference;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.exec.Function;

/**
 * A JavaScript or Python function run by GraalVM Polyglot. One shared {@link Engine} per language
 * (code caches shared, contexts isolated); one {@link Context} per worker, reused across that
 * worker's invocations (as Photons@Graal does), so invocations of one worker see module-level
 * state of that worker only and no function sees another's. No host access, no process
 * environment, no threads, no native access, no file system.
 *
 * <p>JavaScript is ECMAScript (GraalJS) with the parts of the Node.js surface OpenWhisk actions
 * use: {@code process.env}, {@code exports}/{@code module.exports}, {@code global},
 * {@code setTimeout}/{@code setInterval}/{@code setImmediate} and their clear functions (run by a
 * per-activation event loop), returned promises awaited. No {@code require}, no Node modules.
 * Python sees the /init env in {@code os.environ} at import, and the activation's {@code __OW_*}
 * per invocation; a zip action's modules import from the zip (in memory).
 */
public final class PolyglotFunction implements Function {
    /**
     * The runtime's own guest code, a resource beside this class (prelude.js, wrapper.js,
     * prelude.py, wrapper.py), read once as the class is loaded.
     */
    static String guest(String name) {
        try (java.io.InputStream in = PolyglotFunction.class.getResourceAsStream(name)) {
            if (in == null) throw new IllegalStateException("the runtime's " + name + " is missing from its jar");
            return new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    /*
     * The runtime's own code is evaluated in every function's context from Source objects held
     * here for the process: an engine shares parsed and compiled code between its contexts for as
     * long as the Source it came from lives. A Source made anew for each context (ctx.eval of a
     * String) is collected with its code, and each new function parsed and compiled the
     * runtime's wrapper again (Truffle's compilation log: a new __cpuslot_call for every function).
     */

    /** Defines the Node-like globals before the action's code runs. */
    private static final Source JS_PRELUDE = Source.newBuilder("js", guest("prelude.js"), "cpuslot-prelude.js").buildLiteral();

    /** Finds the entry point (a dotted path) and wraps it: call, then poll until settled. */
    private static final Source JS_WRAPPER = Source.newBuilder("js", guest("wrapper.js"), "cpuslot-wrapper.js").buildLiteral();

    /**
     * The runtime's own Python: no standard module. Values cross as JSON through GraalPy's
     * built-in {@code _json} (what {@code json} uses, loaded with the interpreter): importing
     * {@code json} imports {@code re} and compiles its patterns, the largest part of a cold
     * context after GraalPy's own start. The environment goes into {@code posix.environ}, the
     * dict {@code os.environ} wraps, so that {@code os} is imported only by a function that asks.
     * Process signals are the runtime's: GraalPy's {@code signal} raises and handles them for the
     * whole JVM ({@code sun.misc.Signal}), so the built-in module's calls that raise, send, wait
     * for or handle one are replaced in it before any function code runs ({@code signal} copies
     * them from {@code _signal}; a built-in module imported again is the same object).
     */
    private static final String PY_PRELUDE = guest("prelude.py");

    /** The name the runtime's own Python has in a tenant's traceback. */
    private static final String RUNTIME_PY = "cpuslot-runtime.py";
    private static final Source PY_PRELUDE_SOURCE = Source.newBuilder("python", PY_PRELUDE, RUNTIME_PY).buildLiteral();

    /** Wraps the entry point (bound as {@code __cpuslot_entry}): the environment in, JSON both ways. */
    private static final Source PY_WRAPPER = Source.newBuilder("python", guest("wrapper.py"), RUNTIME_PY).buildLiteral();

    /** Local chaining for guests (cpuslot.call / callAsync): JSON strings both ways, the running activation's hop from the thread. */
    private static final org.graalvm.polyglot.proxy.ProxyExecutable CHAIN_BUS = a -> GuestChain.call(
            a.length > 0 && a[0].isString() ? a[0].asString() : "sync",
            a.length > 1 && a[1].isString() ? a[1].asString() : null,
            a.length > 2 && a[2].isString() ? a[2].asString() : "{}");

    private static final Gson GSON = new Gson();

    /** Loads a language before the first /init: {@link Contexts#prewarm}. */
    public static void prewarm(String language, long compilerWarmupMs) { Contexts.prewarm(language, compilerWarmupMs); }

    /** The compiler's warm-up (tests): {@link Contexts#warmCompiler}. */
    public static int warmCompiler(String id, long budgetMs) { return Contexts.warmCompiler(id, budgetMs); }

    /** How many contexts functions took prewarmed (tests). */
    public static int prewarmedContextsTaken() { return Contexts.prewarmedContextsTaken(); }

    /** How many spare contexts of a language were made (tests). */
    public static int sparesMade(String language) { return Contexts.sparesMade(language); }

    /** How long a spare waits for a function's first call (tests); returns what it was. */
    public static long spareWaitMs(long ms) { return Contexts.spareWaitMs(ms); }

    private final String name, language, polyglotId, entry;
    private final Map<String, String> initEnv;
    private final String initEnvJson;
    private final Engine engine;
    private final Source source;
    private final String zipSources; // Python zip: module name -> [source, is package], as JSON; or null
    /** The context /init made to check the code: the first worker uses it instead of making one. */
    private final AtomicReference<Sandbox> spare = new AtomicReference<>();

    public PolyglotFunction(String name, String language, String code, String entry, Map<String, String> initEnv) {
        this(name, language, code, entry, initEnv, null);
    }

    private PolyglotFunction(String name, String language, String code, String entry, Map<String, String> initEnv, String zipSources) {
        this.name = name;
        this.language = language;
        this.polyglotId = Contexts.polyglotId(language);
        this.entry = entry == null || entry.isBlank() ? "main" : entry;
        if (!this.entry.matches("[A-Za-z_$][A-Za-z0-9_$]*(\\.[A-Za-z_$][A-Za-z0-9_$]*)*")
                || (polyglotId.equals("python") && this.entry.contains(".")))
            throw new IllegalArgumentException("entry point is not an identifier: " + entry);
        this.initEnv = Map.copyOf(initEnv);
        this.initEnvJson = GSON.toJson(new LinkedHashMap<>(initEnv));
        this.zipSources = zipSources;
        this.engine = Contexts.engine(polyglotId);
        this.source = Source.newBuilder(polyglotId, code, name + (polyglotId.equals("js") ? ".js" : ".py")).buildLiteral();
        // compile and check the entry point once, so /init reports errors; the context is kept.
        // On the caller's thread, a platform one (the front has no virtual threads): compiled
        // Truffle code cannot materialize caller frames on a virtual thread, Python's need them
        spare.set(makeSandbox());
    }

    /**
     * A zip action (base64 in /init, {@code binary: true}). Python: {@code __main__.py} is the
     * action, its other {@code .py} files import. JavaScript: the file named by the first part of
     * a dotted {@code main} ({@code other.niam} -> {@code other.js}, export {@code niam}), else
     * package.json's {@code main}, else {@code index.js}; evaluated as a script with
     * {@code exports}. Other files are not reachable (no file system).
     */
    public static PolyglotFunction fromZip(String name, String language, byte[] zip, String main, Map<String, String> initEnv) {
        String id = Contexts.polyglotId(language);
        Map<String, String> files = unzip(zip, id.equals("js") ? "javascript" : "python");
        String m = main == null || main.isBlank() ? "main" : main;
        if (id.equals("python")) {
            String mainSrc = files.get("__main__.py");
            if (mainSrc == null) throw new IllegalArgumentException("Zip file does not include __main__.py");
            Map<String, Object[]> mods = new LinkedHashMap<>();
            files.forEach((path, src) -> {
                if (!path.endsWith(".py") || path.equals("__main__.py")) return;
                String mod = path.substring(0, path.length() - 3).replace('/', '.');
                boolean pkg = mod.endsWith(".__init__");
                if (pkg) mod = mod.substring(0, mod.length() - ".__init__".length());
                mods.put(mod, new Object[]{src, pkg});
            });
            return new PolyglotFunction(name, language, mainSrc, m, initEnv, GSON.toJson(mods));
        }
        String file = null, export = m;
        int dot = m.indexOf('.');
        if (dot > 0 && files.containsKey(m.substring(0, dot) + ".js")) {
            file = m.substring(0, dot) + ".js";
            export = m.substring(dot + 1);
        } else if (files.containsKey("package.json")) {
            try {
                JsonObject pj = JsonParser.parseString(files.get("package.json")).getAsJsonObject();
                file = pj.has("main") ? pj.get("main").getAsString().replaceFirst("^\\./", "") : "index.js";
            } catch (RuntimeException e) {
                throw new IllegalArgumentException("Error: package.json is not valid JSON"); // its parser's text quotes it
            }
        } else if (files.containsKey("index.js")) {
            file = "index.js";
        }
        if (file == null) throw new IllegalArgumentException("Error: Zipped actions must contain either package.json or index.js at the root.");
        String src = files.get(file);
        if (src == null) throw new IllegalArgumentException("Error: the zip has no " + file + " (package.json main)");
        return new PolyglotFunction(name, language, src, export, initEnv, null);
    }

    private static Map<String, String> unzip(byte[] zip, String language) {
        Map<String, String> files = new LinkedHashMap<>();
        long total = 0;
        boolean any = false;
        try (ZipInputStream in = new ZipInputStream(new ByteArrayInputStream(zip), StandardCharsets.UTF_8)) {
            ZipEntry e;
            while ((e = in.getNextEntry()) != null) {
                any = true;
                if (e.isDirectory()) continue;
                byte[] b = in.readNBytes(Config.MAX_BODY + 1);
                total += b.length;
                if (total > Config.MAX_BODY) throw new IllegalArgumentException("Error: the zip unpacks to more than " + Config.MAX_BODY + " bytes");
                files.put(e.getName().replaceFirst("^\\./", ""), new String(b, StandardCharsets.UTF_8));
            }
        } catch (IOException | IllegalArgumentException ex) {
            if (ex instanceof IllegalArgumentException iae && iae.getMessage().startsWith("Error:")) throw iae;
            throw new IllegalArgumentException("Error uncompressing the " + language + " action's zip: " + ex.getMessage());
        }
        if (!any) throw new IllegalArgumentException("Error uncompressing the " + language + " action's zip: not a zip file");
        return files;
    }

    @Override public String name() { return name; }
    @Override public String language() { return polyglotId.equals("js") ? "javascript" : "python"; }
    @Override public Map<String, String> initEnv() { return initEnv; }

    @Override
    public Sandbox newSandbox() {
        Sandbox s = spare.getAndSet(null);
        return s != null ? s : makeSandbox();
    }

    private Sandbox makeSandbox() {
        Context ctx = Contexts.newContext(polyglotId, engine);
        Value call, poll = null, loop = null;
        try {
            if (polyglotId.equals("js")) {
                loop = ctx.eval(JS_PRELUDE).execute(initEnvJson, CHAIN_BUS);
                loading(ctx);
                ctx.eval(source);
                Value w = ctx.eval(JS_WRAPPER).execute(entry, loop);
                if (w.isNull()) throw new IllegalArgumentException("no function " + entry + " in the JavaScript code");
                call = w.getMember("call");
                poll = w.getMember("poll");
            } else {
                Value bindings = ctx.getBindings("python");
                bindings.putMember("__cpuslot_init_env", initEnvJson);
                bindings.putMember("__cpuslot_zip_srcs", zipSources == null ? "" : zipSources);
                bindings.putMember("__cpuslot_bus", CHAIN_BUS);
                ctx.eval(PY_PRELUDE_SOURCE);
                loading(ctx);
                ctx.eval(source);
                Value fn = bindings.getMember(entry);
                if (fn == null || !fn.canExecute())
                    throw new IllegalArgumentException("no function " + entry + " in the Python code");
                bindings.putMember("__cpuslot_entry", fn);
                ctx.eval(PY_WRAPPER);
                call = bindings.getMember("__cpuslot_call");
            }
        } catch (PolyglotException e) {
            printGuestError(e);
            ctx.close(true);
            throw new IllegalArgumentException("the " + language() + " code does not load: " + loadError(e));
        } catch (RuntimeException e) {
            ctx.close(true);
            throw e;
        }
        return new GuestSandbox(ctx, call, poll, loop);
    }

    /** At /init or /register, the function's code begins: its context is closed at the load's deadline, which cancels it. */
    private static void loading(Context ctx) {
        dev.cpuslot.runtime.exec.Load.onCancel(() -> ctx.close(true));
    }

    /** A worker's context with the function loaded: calls it, runs its event loop, cancels it at the deadline. */
    private final class GuestSandbox implements Sandbox {
        private final Context ctx;
        private final Value fCall, fPoll, fLoop;
        private volatile boolean cancelled;
        private volatile boolean called;

        GuestSandbox(Context ctx, Value call, Value poll, Value loop) {
            this.ctx = ctx;
            this.fCall = call;
            this.fPoll = poll;
            this.fLoop = loop;
        }

        @Override
        public JsonElement invoke(JsonElement args, Map<String, String> env) throws Exception {
            try {
                String envJson = GSON.toJson(env);
                String out = fCall.execute(args == null ? "{}" : args.toString(), envJson).asString();
                if ("\u0000async".equals(out)) out = awaitPromise();
                return out == null ? null : JsonParser.parseString(out);
            } catch (PolyglotException e) {
                if (e.isCancelled() || cancelled) throw new Function.FunctionError("cancelled at the deadline", e);
                printGuestError(e);
                throw new Function.FunctionError(e.getMessage(), e);
            } finally {
                if (!called) {
                    called = true;
                    Contexts.firstCallEnded(polyglotId);
                }
            }
        }

        /** The context's state for this thread, made now rather than in the first call. */
        @Override
        public void prepareThread() {
            ctx.enter();
            ctx.leave();
        }

        /** The activation's event loop: timers until the returned promise settles. */
        private String awaitPromise() throws Exception {
            while (true) {
                String s = fPoll.execute().asString();
                if (!"\u0000pending".equals(s)) return s;
                long wait = fLoop.getMember("next").execute().asLong();
                if (wait < 0) throw new Function.FunctionError("the action's promise did not resolve and no timer is pending", null);
                long until = System.nanoTime() + wait * 1_000_000L;
                while (!cancelled) { // short sleeps: a cancelled context is closed, this thread is not interrupted
                    long left = until - System.nanoTime();
                    if (left <= 0) break;
                    Thread.sleep(Math.min(50, Math.max(1, left / 1_000_000L)));
                }
                if (cancelled) throw new Function.FunctionError("cancelled at the deadline", null);
                fLoop.getMember("tick").execute();
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
    }

    /**
     * Why code did not load, without the guest's text: a syntax error's message quotes the code
     * (and a name error the name), and the code may be any file a /register named. The kind and
     * where; the whole error is on the function's stderr.
     */
    static String loadError(PolyglotException e) {
        String kind = e.isSyntaxError() ? "SyntaxError" : "an error";
        try {
            Value g = e.getGuestObject();
            if (!e.isSyntaxError() && g != null && g.getMetaObject() != null) kind = g.getMetaObject().getMetaSimpleName();
        } catch (RuntimeException ignored) { // a guest object that cannot say what it is: "an error"
        }
        var at = e.getSourceLocation();
        return at == null ? kind : kind + " at line " + at.getStartLine() + ", column " + at.getStartColumn();
    }

    /** The guest's error on the tenant's stderr, in the language's own shape (Python: a traceback). */
    private void printGuestError(PolyglotException e) {
        if (e.isCancelled()) return;
        StringBuilder sb = new StringBuilder();
        List<String> frames = new ArrayList<>();
        for (PolyglotException.StackFrame f : e.getPolyglotStackTrace()) {
            if (!f.isGuestFrame() || f.getSourceLocation() == null) continue;
            var loc = f.getSourceLocation();
            if (polyglotId.equals("python"))
                frames.add("  File \"" + loc.getSource().getName() + "\", line " + loc.getStartLine() + ", in " + f.getRootName());
            else
                frames.add("    at " + f.getRootName() + " (" + loc.getSource().getName() + ":" + loc.getStartLine() + ")");
        }
        if (polyglotId.equals("python")) {
            Collections.reverse(frames);
            sb.append("Traceback (most recent call last):\n");
            frames.forEach(l -> sb.append(l).append('\n'));
            sb.append(e.getMessage());
        } else {
            sb.append(e.getMessage());
            frames.forEach(l -> sb.append('\n').append(l));
        }
        System.err.println(sb);
    }

    @Override
    public void close() {
        Sandbox s = spare.getAndSet(null);
        if (s != null) s.close();
    }
}
