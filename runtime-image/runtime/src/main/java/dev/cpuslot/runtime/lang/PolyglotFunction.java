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
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicReference;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
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
    private static String guest(String name) {
        try (java.io.InputStream in = PolyglotFunction.class.getResourceAsStream(name)) {
            if (in == null) throw new IllegalStateException("the runtime's " + name + " is missing from its jar");
            return new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        } catch (java.io.IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }

    /** Defines the Node-like globals before the action's code runs. */
    private static final String JS_PRELUDE = guest("prelude.js");

    /** Finds the entry point (a dotted path) and wraps it: call, then poll until settled. */
    private static final String JS_WRAPPER = guest("wrapper.js");

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

    private static final String PY_WRAPPER = guest("wrapper.py");

    /** Local chaining for guests (cpuslot.call / callAsync): JSON strings both ways, the running activation's hop from the thread. */
    private static final org.graalvm.polyglot.proxy.ProxyExecutable CHAIN_BUS = a -> GuestChain.call(
            a.length > 0 && a[0].isString() ? a[0].asString() : "sync",
            a.length > 1 && a[1].isString() ? a[1].asString() : null,
            a.length > 2 && a[2].isString() ? a[2].asString() : "{}");

    private static final Map<String, Engine> ENGINES = new ConcurrentHashMap<>();
    private static final Gson GSON = new Gson();

    /**
     * The shared engine of a language: made once, kept for the process (code caches, compiled
     * code). Its implementation is logged: "Interpreted" means Truffle found no JIT (no JVMCI or
     * no Graal on the upgrade module path) and guest code runs many times slower; Truffle's own
     * warning (engine.WarnInterpreterOnly) says why.
     */
    static Engine engine(String polyglotId) {
        return ENGINES.computeIfAbsent(polyglotId, id -> {
            Engine e = Engine.newBuilder(id).build();
            Log.info("polyglot engine " + id + ": " + e.getImplementationName());
            return e;
        });
    }

    /**
     * Loads a language before the first /init (the image's language is fixed): makes the engine
     * and one context, which the first function of that language takes as its own (a context
     * costs seconds to make for Python), so that /init does not make another.
     */
    public static void prewarm(String language, long compilerWarmupMs) {
        String id = polyglotId(language);
        SPARES.computeIfAbsent(id, k -> startSpare(k, compilerWarmupMs)).exceptionally(e -> null).join();
    }

    /**
     * Guest code of the shapes functions have (recursion, objects built, JSON both ways, a sort
     * with a comparator on a number and a string, string formatting), for the compiler's warm-up:
     * Truffle compiles it within a few hundred calls.
     */
    private static final String JS_WARMUP = """
            (function () {
              function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
              return function () {
                var items = [];
                for (var i = 0; i < 200; i++) items.push({ id: i, name: 'item' + (i * 7919 % 200), price: (i * 37) % 1000 / 10 });
                var doc = JSON.parse(JSON.stringify({ items: items }));
                doc.items.sort(function (a, b) { return a.price - b.price || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0); });
                return fib(15) + doc.items.slice(0, 20).map(function (x) { return x.name.toUpperCase() + ':' + x.price.toFixed(2); }).join('|').length;
              };
            })()
            """;
    private static final String PY_WARMUP = """
            import json as _json
            def _fib(n):
                return n if n < 2 else _fib(n - 1) + _fib(n - 2)
            def _warm():
                items = [{'id': i, 'name': 'item%d' % (i * 7919 % 200), 'price': (i * 37) % 1000 / 10} for i in range(200)]
                doc = _json.loads(_json.dumps({'items': items}))
                doc['items'].sort(key=lambda x: (x['price'], x['name']))
                return _fib(12) + len('|'.join('%s:%.2f' % (x['name'].upper(), x['price']) for x in doc['items'][:20]))
            """;

    /**
     * Runs guest code in a context of its own (closed after: no function sees it) until
     * {@code budgetMs} of wall time have passed since it began, so that HotSpot compiles the Graal
     * compiler itself (Java bytecode on a stock JDK) and Truffle the language's built-ins before
     * the first function's calls pay for it. A call under way at the end is cancelled (the context
     * closed under it): under load one call can take seconds. Its CPU is bounded by that time: this
     * thread plus the compiler threads, whose number image/jvm-options-jit fixes. Returns the
     * number of calls that finished.
     */
    public static int warmCompiler(String id, long budgetMs) {
        if (budgetMs <= 0) return 0;
        long t0 = System.nanoTime(), until = t0 + budgetMs * 1_000_000L;
        int calls = 0;
        Context c = contextBuilder(id, engine(id)).build();
        Thread stop = Thread.ofPlatform().daemon().name("compiler-warmup-stop").group(dev.cpuslot.runtime.guard.RuntimeThreads.RUNTIME_THREADS)
                .inheritInheritableThreadLocals(false).start(() -> {
                    try {
                        Thread.sleep(Math.max(0, (until - System.nanoTime()) / 1_000_000L));
                        c.close(true);
                    } catch (InterruptedException | RuntimeException e) { // finished in time, or closed meanwhile
                    }
                });
        try {
            Value f = c.eval(Source.newBuilder(id, id.equals("js") ? JS_WARMUP : PY_WARMUP, "cpuslot-compiler-warmup").buildLiteral());
            if (id.equals("python")) f = c.getBindings("python").getMember("_warm");
            while (System.nanoTime() - until < 0) {
                f.execute();
                calls++;
            }
        } catch (PolyglotException | IllegalStateException e) { // cancelled at the end, or closed between two calls
            if (System.nanoTime() - until < 0) throw e;
        } finally {
            stop.interrupt();
            c.close(true);
        }
        // its garbage given back now (image/jvm-options' MaxHeapFreeRatio), not held until a full GC
        System.gc();
        Log.info("warmed the " + id + " compiler: " + calls + " calls in " + (System.nanoTime() - t0) / 1_000_000 + " ms");
        return calls;
    }

    /**
     * The next context of each language, made or under way: it ran the runtime's own code only
     * (no function's), and goes to one function, once. Each one taken is replaced in the
     * background, so that the next function of the language (a Hydra /register, a second worker)
     * starts in a context made before it asked: a GraalPy context takes about half a second of
     * CPU to initialise, most of a new Python function's /register. One spare per language in use.
     */
    private static final Map<String, java.util.concurrent.CompletableFuture<Context>> SPARES = new ConcurrentHashMap<>();
    private static final java.util.concurrent.atomic.AtomicInteger PREWARMED_TAKEN = new java.util.concurrent.atomic.AtomicInteger();

    /** How many contexts functions took prewarmed (tests). */
    public static int prewarmedContextsTaken() { return PREWARMED_TAKEN.get(); }

    /**
     * Makes a spare on a thread of the runtime's own: not the caller's (a worker's thread group,
     * its activation's output), so that no function is charged for it nor sees it.
     */
    private static java.util.concurrent.CompletableFuture<Context> startSpare(String id) {
        return startSpare(id, 0);
    }

    /** A spare, after {@code compilerWarmupMs} of {@link #warmCompiler} (the prewarm's, before the first /init takes it). */
    private static java.util.concurrent.CompletableFuture<Context> startSpare(String id, long compilerWarmupMs) {
        var f = new java.util.concurrent.CompletableFuture<Context>();
        Thread.ofPlatform().daemon().name("prewarm-" + id).group(dev.cpuslot.runtime.guard.RuntimeThreads.RUNTIME_THREADS)
                .inheritInheritableThreadLocals(false).start(() -> {
                    try {
                        Context c = spareContext(id);
                        try {
                            warmCompiler(id, compilerWarmupMs);
                        } catch (RuntimeException e) { // the spare is good without it
                            Log.warn("warming the " + id + " compiler failed: " + e);
                        }
                        f.complete(c);
                    } catch (Throwable e) {
                        Log.warn("prewarming " + id + " failed: " + e);
                        f.completeExceptionally(e);
                    }
                });
        return f;
    }

    private static Context spareContext(String id) {
        long t0 = System.nanoTime();
        Context c = contextBuilder(id, engine(id)).build();
        try {
            // under the prelude's own names: the function's globals get no name from the prewarm
            c.eval(id, id.equals("python") ? "import _json as __cpuslot__json, posix as __cpuslot_posix, sys as __cpuslot_sys\n" : "JSON.stringify({})");
        } catch (RuntimeException e) {
            c.close(true);
            throw e;
        }
        Log.info("prewarmed a " + id + " context in " + (System.nanoTime() - t0) / 1_000_000 + " ms");
        return c;
    }

    /**
     * The language's spare context (waiting for it when under way: two contexts made at once would
     * each take twice as long), then the next spare started; a new context when none was started
     * or it failed.
     */
    private static Context newContext(String polyglotId, Engine engine) {
        var f = SPARES.remove(polyglotId);
        Context c = null;
        if (f != null) {
            try {
                c = f.join();
            } catch (java.util.concurrent.CompletionException | java.util.concurrent.CancellationException e) {
                c = null; // logged by the prewarm; make one here
            }
        }
        SPARES.computeIfAbsent(polyglotId, PolyglotFunction::startSpare);
        if (c != null) {
            PREWARMED_TAKEN.incrementAndGet();
            return c;
        }
        return contextBuilder(polyglotId, engine).build();
    }

    static String polyglotId(String language) {
        return switch (language) {
            case "javascript", "js", "nodejs" -> "js";
            case "python", "py" -> "python";
            default -> throw new IllegalArgumentException("unsupported language " + language);
        };
    }

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
        this.polyglotId = polyglotId(language);
        this.entry = entry == null || entry.isBlank() ? "main" : entry;
        if (!this.entry.matches("[A-Za-z_$][A-Za-z0-9_$]*(\\.[A-Za-z_$][A-Za-z0-9_$]*)*")
                || (polyglotId.equals("python") && this.entry.contains(".")))
            throw new IllegalArgumentException("entry point is not an identifier: " + entry);
        this.initEnv = Map.copyOf(initEnv);
        this.initEnvJson = GSON.toJson(new LinkedHashMap<>(initEnv));
        this.zipSources = zipSources;
        this.engine = engine(polyglotId);
        this.source = Source.newBuilder(polyglotId, code, name + (polyglotId.equals("js") ? ".js" : ".py")).buildLiteral();
        // compile and check the entry point once, so /init reports errors; the context is kept
        spare.set(onPlatformThread(this::makeSandbox));
    }

    /**
     * Runs guest code on a platform thread when called on a virtual one (an HTTP request's):
     * compiled Truffle code cannot materialize caller frames on virtual threads (Truffle warns
     * "Using polyglot contexts on Java virtual threads on HotSpot is experimental"), and
     * Python's frames (tracebacks, sys._getframe) need that. Workers are platform threads.
     */
    static <T> T onPlatformThread(java.util.function.Supplier<T> work) {
        if (!Thread.currentThread().isVirtual()) return work.get();
        return dev.cpuslot.runtime.guard.RuntimeThreads.makeOn(Thread.ofPlatform().daemon().name("polyglot-init"), work);
    }

    /**
     * A zip action (base64 in /init, {@code binary: true}). Python: {@code __main__.py} is the
     * action, its other {@code .py} files import. JavaScript: the file named by the first part of
     * a dotted {@code main} ({@code other.niam} -> {@code other.js}, export {@code niam}), else
     * package.json's {@code main}, else {@code index.js}; evaluated as a script with
     * {@code exports}. Other files are not reachable (no file system).
     */
    public static PolyglotFunction fromZip(String name, String language, byte[] zip, String main, Map<String, String> initEnv) {
        String id = polyglotId(language);
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

    /**
     * System.out and System.err as they are when guest code prints, not when its context was made
     * (a spare is made before its function, and a test's harness replaces the streams).
     */
    private static final java.io.OutputStream STDOUT = forwarding(true), STDERR = forwarding(false);

    private static java.io.OutputStream forwarding(boolean out) {
        return new java.io.OutputStream() {
            @Override public void write(int b) { (out ? System.out : System.err).write(b); }
            @Override public void write(byte[] b, int off, int len) { (out ? System.out : System.err).write(b, off, len); }
            @Override public void flush() { (out ? System.out : System.err).flush(); }
        };
    }

    /**
     * A function's context, and the prewarm's: the same options, so that the contexts share the
     * engine's parsed and compiled code (Truffle shares it between contexts of one engine whose
     * options agree).
     */
    private static Context.Builder contextBuilder(String polyglotId, Engine engine) {
        Context.Builder b = Context.newBuilder(polyglotId).engine(engine)
                .out(STDOUT).err(STDERR) // the tenant's streams (the engine is shared)
                .allowAllAccess(false)
                .allowCreateThread(false)
                .allowNativeAccess(false);
        // no default SIGINT handler of GraalPy's: process signals are the runtime's
        if (polyglotId.equals("python")) b.option("python.ForceImportSite", "false").option("python.Executable", "python3")
                .option("python.InstallSignalHandlers", "false");
        return b;
    }

    private Sandbox makeSandbox() {
        Context ctx = newContext(polyglotId, engine);
        Value call, poll = null, loop = null;
        try {
            if (polyglotId.equals("js")) {
                loop = ctx.eval("js", JS_PRELUDE).execute(initEnvJson, CHAIN_BUS);
                ctx.eval(source);
                Value w = ctx.eval("js", JS_WRAPPER).execute(entry, loop);
                if (w.isNull()) throw new IllegalArgumentException("no function " + entry + " in the JavaScript code");
                call = w.getMember("call");
                poll = w.getMember("poll");
            } else {
                Value bindings = ctx.getBindings("python");
                bindings.putMember("__cpuslot_init_env", initEnvJson);
                bindings.putMember("__cpuslot_zip_srcs", zipSources == null ? "" : zipSources);
                bindings.putMember("__cpuslot_bus", CHAIN_BUS);
                ctx.eval(PY_PRELUDE_SOURCE);
                ctx.eval(source);
                Value fn = bindings.getMember(entry);
                if (fn == null || !fn.canExecute())
                    throw new IllegalArgumentException("no function " + entry + " in the Python code");
                ctx.eval(Source.newBuilder("python", PY_WRAPPER.formatted(entry), RUNTIME_PY).buildLiteral());
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
        final Value fCall = call, fPoll = poll, fLoop = loop;
        return new Sandbox() {
            volatile boolean cancelled;

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
                }
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
        };
    }

    /** The guest's error on the tenant's stderr, in the language's own shape (Python: a traceback). */
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
