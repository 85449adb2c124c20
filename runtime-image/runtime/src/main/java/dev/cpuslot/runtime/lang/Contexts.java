package dev.cpuslot.runtime.lang;

import dev.cpuslot.runtime.base.Log;
import org.graalvm.polyglot.Context;
import org.graalvm.polyglot.Engine;
import org.graalvm.polyglot.PolyglotException;
import org.graalvm.polyglot.Source;
import org.graalvm.polyglot.Value;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The polyglot engines and contexts of the process: one shared engine per language, the contexts
 * a function's workers run in (the same options for all, so that they share the engine's code),
 * the spare context made before a function asks for one, and the compiler's warm-up in a context
 * of its own. {@link PolyglotFunction} runs functions in them.
 */
final class Contexts {
    private Contexts() {}

    private static final Map<String, Engine> ENGINES = new ConcurrentHashMap<>();

    /**
     * The shared engine of a language: made once, kept for the process (code caches, compiled
     * code). Its implementation is logged: "Interpreted" means Truffle found no JIT (no JVMCI or
     * no Graal on the upgrade module path) and guest code runs many times slower; Truffle's own
     * warning (engine.WarnInterpreterOnly) says why.
     */
    static Engine engine(String polyglotId) {
        return ENGINES.computeIfAbsent(polyglotId, id -> dev.cpuslot.runtime.guard.RuntimeThreads.makeOnRuntimeThread("polyglot-engine-" + id, () -> {
            Engine e = newEngine(id);
            Log.info("polyglot engine " + id + ": " + e.getImplementationName());
            // Truffle's compiler thread is made by the first context of the process (the first code it
            // runs submits the compiler's start) and, with CompilerIdleDelay 0, never ends: made here, on
            // a runtime thread, never by a worker in its invocation's slot. The next context taken is this one.
            FIRST.put(id, contextBuilder(id, e).build());
            if (!e.getImplementationName().equals("Interpreted")) dev.cpuslot.runtime.exec.CompilerSlot.truffleStarted();
            return e;
        }));
    }

    /** The first context of each engine, made with it, until a spare or a function takes it. */
    private static final Map<String, Context> FIRST = new ConcurrentHashMap<>();

    /**
     * An engine whose compiler thread never ends when idle (engine.CompilerIdleDelay 0; Truffle's
     * default ends it after 10 s, and the next compilation makes a new one on whichever thread
     * submits it: a worker, inside its invocation's slot). The fallback runtime (no JIT) knows no
     * such option.
     */
    private static Engine newEngine(String id) {
        try {
            return Engine.newBuilder(id).allowExperimentalOptions(true).option("engine.CompilerIdleDelay", "0").build();
        } catch (IllegalArgumentException noSuchOption) {
            return Engine.newBuilder(id).build();
        }
    }

    /**
     * Loads a language before the first /init (the image's language is fixed): makes the engine
     * and one context, which the first function of that language takes as its own (a context
     * costs seconds to make for Python), so that /init does not make another.
     */
    static void prewarm(String language, long compilerWarmupMs) {
        String id = polyglotId(language);
        SPARES.computeIfAbsent(id, k -> startSpare(k, compilerWarmupMs, null)).made.exceptionally(e -> null).join();
    }

    /**
     * Guest code of the shapes functions have (recursion, objects built, JSON both ways, a sort
     * with a comparator on a number and a string, string formatting), for the compiler's warm-up:
     * Truffle compiles it within a few hundred calls.
     */
    private static final String JS_WARMUP = PolyglotFunction.guest("warmup.js");
    private static final String PY_WARMUP = PolyglotFunction.guest("warmup.py");

    /**
     * Runs guest code in a context of its own (closed after: no function sees it) until
     * {@code budgetMs} of wall time have passed since it began, so that HotSpot compiles the Graal
     * compiler itself (Java bytecode on a stock JDK) and Truffle the language's built-ins before
     * the first function's calls pay for it. A call under way at the end is cancelled (the context
     * closed under it): under load one call can take seconds. Its CPU is bounded by that time: this
     * thread plus the compiler threads, whose number image/jvm-options-jit fixes. Returns the
     * number of calls that finished.
     */
    static int warmCompiler(String id, long budgetMs) {
        if (budgetMs <= 0) return 0;
        long t0 = System.nanoTime(), until = t0 + budgetMs * 1_000_000L;
        int calls = 0;
        Context c = contextBuilder(id, engine(id)).build();
        Thread stop = dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("compiler-warmup-stop", () -> {
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
    private static final Map<String, Spare> SPARES = new ConcurrentHashMap<>();

    /**
     * How long a spare waits for the first call of the function that took the one before it: making
     * it allocates about a young generation's worth, and a collection then pauses every thread,
     * that call's too; a function not called by then does not hold it back for longer.
     */
    private static volatile long spareWaitMs = 1000;

    /** Sets {@link #spareWaitMs} (tests), returning what it was. */
    static long spareWaitMs(long ms) {
        long was = spareWaitMs;
        spareWaitMs = ms;
        return was;
    }

    private static final Map<String, java.util.concurrent.atomic.AtomicInteger> SPARES_MADE = new ConcurrentHashMap<>();

    /** How many spares of a language were made (tests). */
    static int sparesMade(String language) {
        var n = SPARES_MADE.get(polyglotId(language));
        return n == null ? 0 : n.get();
    }

    /**
     * A spare under way: {@code made} when it is; {@code start} opens when it may begin (a
     * function's first call has ended, or a function asks for the spare now), null when at once.
     */
    private record Spare(java.util.concurrent.CompletableFuture<Context> made, java.util.concurrent.CountDownLatch start) {
        void open() {
            if (start != null) start.countDown();
        }
    }
    private static final java.util.concurrent.atomic.AtomicInteger PREWARMED_TAKEN = new java.util.concurrent.atomic.AtomicInteger();

    /** How many contexts functions took prewarmed (tests). */
    static int prewarmedContextsTaken() { return PREWARMED_TAKEN.get(); }

    /**
     * Makes a spare on a thread of the runtime's own: not the caller's (a worker's thread group,
     * its activation's output), so that no function is charged for it nor sees it.
     */
    private static Spare startSpare(String id) {
        return startSpare(id, 0, new java.util.concurrent.CountDownLatch(1));
    }

    /**
     * A spare, after {@code start} opens or {@link #spareWaitMs} (null: at once), then after
     * {@code compilerWarmupMs} of {@link #warmCompiler} (the prewarm's, before the first /init takes it).
     */
    private static Spare startSpare(String id, long compilerWarmupMs, java.util.concurrent.CountDownLatch start) {
        var f = new java.util.concurrent.CompletableFuture<Context>();
        dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("prewarm-" + id, () -> {
                    try {
                        if (start != null) start.await(spareWaitMs, java.util.concurrent.TimeUnit.MILLISECONDS);
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
        return new Spare(f, start);
    }

    /**
     * A function's first call in a context it took has ended: the next spare of its language may
     * be made now (it waits at most {@link #spareWaitMs} for this).
     */
    static void firstCallEnded(String polyglotId) {
        Spare s = SPARES.get(polyglotId);
        if (s != null) s.open();
    }

    private static Context spareContext(String id) {
        long t0 = System.nanoTime();
        Engine engine = engine(id);
        Context c = FIRST.remove(id);
        if (c == null) c = contextBuilder(id, engine).build();
        try {
            // under the prelude's own names: the function's globals get no name from the prewarm
            c.eval(id, id.equals("python") ? "import _json as __cpuslot__json, posix as __cpuslot_posix, sys as __cpuslot_sys\n" : "JSON.stringify({})");
        } catch (RuntimeException e) {
            c.close(true);
            throw e;
        }
        SPARES_MADE.computeIfAbsent(id, k -> new java.util.concurrent.atomic.AtomicInteger()).incrementAndGet();
        Log.info("prewarmed a " + id + " context in " + (System.nanoTime() - t0) / 1_000_000 + " ms");
        return c;
    }

    /**
     * The language's spare context (waiting for it when under way: two contexts made at once would
     * each take twice as long), then the next spare started, to be made after the taker's first
     * call ({@link #firstCallEnded}); a new context when none was started or it failed.
     */
    static Context newContext(String polyglotId, Engine engine) {
        Spare s = SPARES.remove(polyglotId);
        Context c = null;
        if (s != null) {
            s.open(); // asked for now: made now, if it was waiting
            try {
                c = s.made.join();
            } catch (java.util.concurrent.CompletionException | java.util.concurrent.CancellationException e) {
                c = null; // logged by the prewarm; make one here
            }
        }
        SPARES.computeIfAbsent(polyglotId, Contexts::startSpare);
        if (c != null) {
            PREWARMED_TAKEN.incrementAndGet();
            return c;
        }
        c = FIRST.remove(polyglotId);
        return c != null ? c : contextBuilder(polyglotId, engine).build();
    }

    static String polyglotId(String language) {
        return switch (language) {
            case "javascript", "js", "nodejs" -> "js";
            case "python", "py" -> "python";
            default -> throw new IllegalArgumentException("unsupported language " + language);
        };
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
    static Context.Builder contextBuilder(String polyglotId, Engine engine) {
        Context.Builder b = Context.newBuilder(polyglotId).engine(engine)
                .out(STDOUT).err(STDERR) // the tenant's streams (the engine is shared)
                .allowAllAccess(false)
                .allowCreateThread(false)
                .allowNativeAccess(false);
        // no default SIGINT handler of GraalPy's: process signals are the runtime's. No async actions:
        // GraalPy waits for them (weak reference callbacks, signals, its native finalizer) on four
        // platform threads of each context's (0.5 MB of stacks), and runs them only on the thread that
        // initialised the context, a spare's runtime thread that has ended: never on a worker.
        // (Experimental options are allowed for this builder's own: guest code sets no option.)
        if (polyglotId.equals("python")) b.option("python.ForceImportSite", "false").option("python.Executable", "python3")
                .option("python.InstallSignalHandlers", "false")
                .allowExperimentalOptions(true).option("python.NoAsyncActions", "true");
        return b;
    }
}
