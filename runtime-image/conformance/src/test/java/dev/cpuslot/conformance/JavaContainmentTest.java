package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * A Java function as a hostile tenant of the shared runtime, against the runtime as its
 * image starts it: it cannot end the runtime, reach JVM-wide state or another function's files,
 * and a runtime serves one owner. Each probe is an action a tenant could deploy.
 */
@DisplayName("Java function containment")
class JavaContainmentTest {

    /** An action {@code example.Probe} whose main runs {@code body} (imports: java.util.*, java.io.*, java.nio.file.*). */
    static String probe(String body) throws Exception {
        return Archives.jar(Map.of("example/Probe.java", """
                package example;
                import com.google.gson.JsonObject;
                import java.io.*;
                import java.nio.file.*;
                import java.util.*;
                public class Probe {
                    public static JsonObject main(JsonObject args) throws Throwable {
                %s
                    }
                }
                """.formatted(body)));
    }

    static JsonObject init(String jar) { return initPayload(jar, "example.Probe", true, null); }

    /**
     * A probe's body that POSTs {@code args.body} to the runtime's own port over loopback at
     * {@code args.path} and returns the answer's {@code code} and {@code body}.
     */
    static final String LOOPBACK_CALL = """
                var u = java.net.URI.create("http://127.0.0.1:" + args.get("port").getAsString() + args.get("path").getAsString()).toURL();
                var h = (java.net.HttpURLConnection) u.openConnection();
                h.setRequestMethod("POST");
                h.setRequestProperty("Content-Type", "application/json");
                h.setDoOutput(true);
                try (var os = h.getOutputStream()) {
                    os.write(args.get("body").getAsString().getBytes(java.nio.charset.StandardCharsets.UTF_8));
                }
                int code = h.getResponseCode();
                InputStream in = code < 400 ? h.getInputStream() : h.getErrorStream();
                JsonObject r = new JsonObject();
                r.addProperty("code", code);
                r.addProperty("body", in == null ? "" : new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8));
                return r;""";

    /** The runtime is still up and serves an action: a fresh /run of a harmless one needs a new container, so ask / (health). */
    static void assertAlive(ActionContainer c) throws Exception {
        Thread.sleep(300); // a dying JVM (halt, signal) is gone by then; no bound on a live one
        assertTrue(c.alive(), "the runtime process died");
        Reply r = c.post("/", "");
        assertEquals(200, r.code(), "health after the probe: " + r.raw());
    }

    /**
     * Probes that would end the runtime or reach past the function: the guard refuses the jar at
     * /init and says which member, or (reflection, which may act on the function's own classes)
     * the call fails with a SecurityException; the runtime lives on. (Before: /init accepted them
     * and /run ended the process or reached JVM-wide state.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {
            "exitViaReflection", "haltViaMethodHandle", "killOwnPid", "runtimeExec", "unsafePutAddress",
            "setOut", "setErr", "setProperty", "timeZoneDefault", "allStackTraces", "ownClassLoader", "nativeLibrary",
            "processHandle", "exitByMethodReference", "haltByMethodReference", "fieldReflection", "deserialization",
            "allStackTracesThroughASubclass", "timeZoneThroughASubclass", "threadWithoutTheActivation",
            "unsafeByName", "unsafeMethodReference", "loadByMethodReference", "loadByReflection", "runtimeLoadLibrary",
            "nativeLinker", "symbolLookup", "arena", "linkerByReflection", "nativeMethodOfItsOwn",
            "commonPool", "parallelStreamByMethodReference", "defaultExecutor", "orTimeout", "workerThreadWithoutTheActivation",
            "threadGroupWalk", "agentSocket", "virtualThread", "startVirtualThread", "virtualThreadExecutor", "cleaner",
            "finalizer", "startByMethodReference", "jdkMethodAsThreadFactory",
            "signalHandler", "signalRaise", "signalByReflection", "shutdownHook", "shutdownHookByMethodReference",
            "shutdownHookByReflection"})
    void aProbeThatWouldEndOrReachTheRuntimeIsRefusedAtInit(String probe) throws Exception {
        assertRefused(probe, refusedProbe(probe));
    }

    /** The body of a probe {@link #aProbeThatWouldEndOrReachTheRuntimeIsRefusedAtInit} lists. */
    static String refusedProbe(String probe) {
        return switch (probe) {
            case "exitViaReflection" -> """
                    Class.forName("java.lang.System").getMethod("exit", int.class).invoke(null, 1);
                    return args;""";
            case "haltViaMethodHandle" -> """
                    java.lang.invoke.MethodHandles.lookup().findVirtual(Runtime.class, "halt",
                        java.lang.invoke.MethodType.methodType(void.class, int.class)).invoke(Runtime.getRuntime(), 1);
                    return args;""";
            case "killOwnPid" -> """
                    new ProcessBuilder("kill", "-9", Long.toString(ProcessHandle.current().pid())).start().waitFor();
                    return args;""";
            case "runtimeExec" -> """
                    Runtime.getRuntime().exec(new String[]{"sh", "-c", "kill -9 $PPID"}).waitFor();
                    return args;""";
            case "unsafePutAddress" -> """
                    java.lang.reflect.Field f = sun.misc.Unsafe.class.getDeclaredField("theUnsafe");
                    f.setAccessible(true);
                    ((sun.misc.Unsafe) f.get(null)).putAddress(0L, 42L);
                    return args;""";
            case "setOut" -> """
                    System.setOut(new PrintStream(new ByteArrayOutputStream()));
                    return args;""";
            case "setErr" -> """
                    System.setErr(new PrintStream(new ByteArrayOutputStream()));
                    return args;""";
            case "setProperty" -> """
                    System.setProperty("user.timezone", "Pacific/Kiritimati");
                    return args;""";
            case "timeZoneDefault" -> """
                    TimeZone.setDefault(TimeZone.getTimeZone("Pacific/Kiritimati"));
                    Locale.setDefault(Locale.JAPAN);
                    return args;""";
            case "allStackTraces" -> """
                    JsonObject r = new JsonObject();
                    for (Thread t : Thread.getAllStackTraces().keySet()) r.addProperty(t.getName(), String.valueOf(t.getContextClassLoader()));
                    return r;""";
            case "ownClassLoader" -> """
                    ClassLoader l = new java.net.URLClassLoader(new java.net.URL[0]);
                    return args;""";
            case "nativeLibrary" -> """
                    System.loadLibrary("c");
                    return args;""";
            case "processHandle" -> """
                    // (the runtime's parent, here the test JVM, would be ProcessHandle.current().parent())
                    args.addProperty("processes", ProcessHandle.allProcesses().count());
                    return args;""";
            case "exitByMethodReference" -> """
                    java.util.function.IntConsumer f = System::exit;
                    f.accept(1);
                    return args;""";
            case "haltByMethodReference" -> """
                    java.util.function.IntConsumer f = Runtime.getRuntime()::halt;
                    f.accept(1);
                    return args;""";
            case "fieldReflection" -> """
                    java.lang.reflect.Field f = Thread.class.getDeclaredField("threadLocals");
                    f.setAccessible(true);
                    args.addProperty("tl", String.valueOf(f.get(Thread.currentThread())));
                    return args;""";
            case "deserialization" -> """
                    new ObjectInputStream(new ByteArrayInputStream(new byte[0])).readObject();
                    return args;""";
            case "allStackTracesThroughASubclass" -> """
                    args.addProperty("threads", T.getAllStackTraces().size());
                    return args;
                    }
                    static class T extends Thread {""";
            case "timeZoneThroughASubclass" -> """
                    Z.setDefault(TimeZone.getTimeZone("Pacific/Kiritimati"));
                    return args;
                    }
                    static abstract class Z extends SimpleTimeZone {
                        Z() { super(0, "z"); }""";
            case "threadWithoutTheActivation" -> """
                    // a thread that does not inherit the activation would escape its thread limit and deadline
                    Thread.ofPlatform().inheritInheritableThreadLocals(false).start(() -> { });
                    return args;""";
            // sun.misc.Unsafe and native access (the JVM grants both to the runtime's own code)
            case "unsafeByName" -> """
                    var k = Class.forName("sun.misc.Unsafe").getDeclaredConstructor();
                    k.setAccessible(true);
                    Object u = k.newInstance();
                    return args;""";
            case "unsafeMethodReference" -> """
                    java.util.function.Supplier<sun.misc.Unsafe> f = sun.misc.Unsafe::getUnsafe;
                    return args;""";
            case "loadByMethodReference" -> """
                    java.util.function.Consumer<String> f = System::load;
                    f.accept("/lib/x86_64-linux-gnu/libc.so.6");
                    return args;""";
            case "loadByReflection" -> """
                    System.class.getMethod("loadLibrary", String.class).invoke(null, "c");
                    return args;""";
            case "runtimeLoadLibrary" -> """
                    Runtime.getRuntime().loadLibrary("c");
                    return args;""";
            case "nativeLinker" -> """
                    var h = java.lang.foreign.Linker.nativeLinker().downcallHandle(
                        java.lang.foreign.Linker.nativeLinker().defaultLookup().find("getpid").orElseThrow(),
                        java.lang.foreign.FunctionDescriptor.of(java.lang.foreign.ValueLayout.JAVA_INT));
                    return args;""";
            case "symbolLookup" -> """
                    java.lang.foreign.SymbolLookup.libraryLookup("libc.so.6", java.lang.foreign.Arena.global());
                    return args;""";
            case "arena" -> """
                    try (var a = java.lang.foreign.Arena.ofConfined()) { a.allocate(8).reinterpret(1 << 20); }
                    return args;""";
            case "linkerByReflection" -> """
                    Object l = Class.forName("java.lang.foreign.Linker").getMethod("nativeLinker").invoke(null);
                    return args;""";
            case "nativeMethodOfItsOwn" -> """
                    System.loadLibrary("probe");
                    args.addProperty("pid", pid());
                    return args;
                    }
                    static native int pid();
                    static {""";
            case "commonPool" -> """
                    java.util.concurrent.ForkJoinPool.commonPool().submit(() -> { }).join();
                    return args;""";
            case "parallelStreamByMethodReference" -> """
                    java.util.function.Function<List<Integer>, java.util.stream.Stream<Integer>> f = List::parallelStream;
                    f.apply(List.of(1)).count();
                    return args;""";
            case "defaultExecutor" -> """
                    new java.util.concurrent.CompletableFuture<String>().defaultExecutor().execute(() -> { });
                    return args;""";
            case "orTimeout" -> """
                    new java.util.concurrent.CompletableFuture<String>().orTimeout(1, java.util.concurrent.TimeUnit.MILLISECONDS)
                            .whenComplete((v, e) -> { for (;;) { } });
                    return args;""";
            case "startByMethodReference" -> """
                    // the JDK would call the thread's start unmarked (a thread made by an ended activation would run on)
                    Runnable later = new Thread(() -> { })::start;
                    later.run();
                    return args;""";
            case "jdkMethodAsThreadFactory" -> """
                    // its threads would be handed to the executor unmarked: a kept one would run on
                    Map<Runnable, Thread> kept = new HashMap<>();
                    java.util.concurrent.ThreadFactory f = kept::get;
                    return args;""";
            case "workerThreadWithoutTheActivation" -> """
                    new java.util.concurrent.ForkJoinPool(1, p -> new java.util.concurrent.ForkJoinWorkerThread(null, p, false) { }, null, false)
                            .submit(() -> { }).join();
                    return args;""";
            case "threadGroupWalk" -> """
                    ThreadGroup g = Thread.currentThread().getThreadGroup();
                    while (g.getParent() != null) g = g.getParent();
                    g.interrupt();
                    return args;""";
            case "agentSocket" -> """
                    try (var ch = java.nio.channels.SocketChannel.open(java.net.StandardProtocolFamily.UNIX)) {
                        ch.connect(java.net.UnixDomainSocketAddress.of(System.getenv().getOrDefault("CPUSLOT_SOCKET", "/run/cpuslot/agent.sock")));
                    }
                    return args;""";
            // threads of no activation: a virtual thread (not in the worker's group), a Cleaner's action (the JDK's thread)
            case "virtualThread" -> """
                    Thread.ofVirtual().name("spinner-virtual").start(() -> { }).join();
                    return args;""";
            case "startVirtualThread" -> """
                    Thread.startVirtualThread(() -> { }).join();
                    return args;""";
            case "virtualThreadExecutor" -> """
                    try (var e = java.util.concurrent.Executors.newVirtualThreadPerTaskExecutor()) { e.submit(() -> { }); }
                    return args;""";
            case "cleaner" -> """
                    java.lang.ref.Cleaner.create().register(new Object(), () -> { });
                    return args;""";
            // its finalize runs on the JVM's finalizer thread, outside any activation, once collected
            case "finalizer" -> """
                    class Spinner {
                        @Override protected void finalize() { for (long i = 0; ; i++) { } }
                    }
                    new Spinner();
                    return args;""";
            // a handler would take SIGTERM from the kubelet's graceful stop; a hook would run in no activation at exit
            case "signalHandler" -> """
                    sun.misc.Signal.handle(new sun.misc.Signal("TERM"), s -> { });
                    return args;""";
            case "signalRaise" -> """
                    sun.misc.Signal.raise(new sun.misc.Signal("TERM"));
                    return args;""";
            case "signalByReflection" -> """
                    Class<?> signal = Class.forName("sun.misc.Signal");
                    Object term = signal.getConstructor(String.class).newInstance("TERM");
                    signal.getMethod("raise", signal).invoke(null, term);
                    return args;""";
            case "shutdownHook" -> """
                    Runtime.getRuntime().addShutdownHook(new Thread(() -> { for (;;) { } }));
                    return args;""";
            case "shutdownHookByMethodReference" -> """
                    java.util.function.Consumer<Thread> f = Runtime.getRuntime()::addShutdownHook;
                    f.accept(new Thread(() -> { for (;;) { } }));
                    return args;""";
            case "shutdownHookByReflection" -> """
                    Runtime.class.getMethod("addShutdownHook", Thread.class).invoke(Runtime.getRuntime(), new Thread(() -> { for (;;) { } }));
                    return args;""";
            default -> throw new IllegalArgumentException(probe);
        };
    }

    /** The guard's message names the class and the member it refused. */
    @Test
    void theRefusalNamesTheMember() throws Exception {
        String jar = probe("""
                new ProcessBuilder("true").start();
                return args;""");
        with("java", c -> {
            Reply init = c.init(init(jar));
            assertEquals(502, init.code());
            String err = init.body().get("error").getAsString();
            assertTrue(err.contains("example/Probe") && err.contains("java.lang.ProcessBuilder"), err);
        });
    }

    /** What ordinary code compiles to (lambdas, string concatenation, switches, records, loops) passes the guard. */
    @Test
    void ordinaryCodeRuns() throws Exception {
        String jar = probe("""
                record P(String name, int n) {}
                List<P> ps = new ArrayList<>();
                for (int i = 0; i < 5; i++) ps.add(new P("p" + i, i));
                int sum = ps.stream().mapToInt(P::n).sum();
                String kind = switch (args.has("x") ? "x" : "none") { case "x" -> "has x"; default -> "no x"; };
                Path tmp = Files.createTempFile("t", ".txt");
                Files.writeString(tmp, "ok");
                JsonObject r = new JsonObject();
                r.addProperty("sum", sum);
                r.addProperty("kind", kind + " " + ps.get(1));
                r.addProperty("file", Files.readString(tmp));
                r.addProperty("env", String.valueOf(System.getenv("__OW_ACTIVATION_ID") != null));
                return r;""");
        with("java", c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply r = c.run(runPayload(new JsonObject(), Map.of("activation_id", "a1")));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(10, r.body().get("sum").getAsInt());
            assertEquals("no x P[name=p1, n=1]", r.body().get("kind").getAsString());
            assertEquals("ok", r.body().get("file").getAsString());
            assertEquals("true", r.body().get("env").getAsString());
        });
    }

    /** Reflection on the function's own classes works; on the JDK's, the call fails. */
    @Test
    void reflectionActsOnTheFunctionsOwnClassesOnly() throws Exception {
        String jar = probe("""
                JsonObject r = new JsonObject();
                java.lang.reflect.Method own = Probe.class.getDeclaredMethod("secret");
                own.setAccessible(true);
                r.addProperty("own", (String) own.invoke(null));
                try {
                    r.addProperty("jdk", (String) String.class.getMethod("valueOf", int.class).invoke(null, 7));
                } catch (SecurityException e) {
                    r.addProperty("jdk", "refused");
                }
                return r;
                }
                private static String secret() { return "mine";""");
        with("java", c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals("mine", r.body().get("own").getAsString());
            assertEquals("refused", r.body().get("jdk").getAsString());
        });
    }

    /** The trusted mode (runtime configuration, not the function's) turns the guard off. */
    @Test
    void theTrustedModeRunsReflection() throws Exception {
        String jar = probe("""
                JsonObject r = new JsonObject();
                r.addProperty("v", (String) Class.forName("java.lang.String").getMethod("valueOf", int.class).invoke(null, 7));
                return r;""");
        with("java", env("CPUSLOT_JAVA_TRUSTED", "true"), c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals("7", r.body().get("v").getAsString());
        });
    }

    /** A function's own OutOfMemoryError is its activation's 502; the runtime answers the next one. */
    @Test
    void anOutOfMemoryErrorFailsOnlyItsActivation() throws Exception {
        String jar = probe("""
                if (args.has("ok")) return args;
                List<long[]> hog = new ArrayList<>();
                while (true) hog.add(new long[1 << 20]);""");
        with("java", c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply oom = c.run(runPayload(new JsonObject()));
            assertEquals(502, oom.code(), String.valueOf(oom.raw()));
            assertTrue(oom.body().get("error").getAsString().contains("OutOfMemoryError"), String.valueOf(oom.raw()));
            assertAlive(c);
            Reply next = c.run(runPayload(json("{\"ok\":true}")));
            assertEquals(200, next.code(), String.valueOf(next.raw()));
        });
    }

    /**
     * A function that fills the heap while another function is invoked again and again (a small
     * heap, so the JVM is full often): the hog's activation fails alone, every other invocation and
     * the runtime's HTTP front go on.
     */
    @Test
    void anOutOfMemoryErrorLeavesTheOtherFunctionsServed() throws Exception {
        String hog = probe("""
                List<long[]> hog = new ArrayList<>();
                while (true) hog.add(new long[1 << 16]);""");
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;");
        with("java", env("JAVA_TOOL_OPTIONS", "-Xmx256m"), c -> {
            assertEquals(200, register(c, "hog", jarFile(c, "hog", hog), null).code());
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            for (int round = 0; round < 3; round++) {
                var hogReply = new java.util.concurrent.CompletableFuture<Reply>();
                Thread t = Thread.ofPlatform().start(() -> {
                    try {
                        hogReply.complete(invoke(c, "hog"));
                    } catch (Throwable e) {
                        hogReply.completeExceptionally(e);
                    }
                });
                int hellos = 0;
                while (!hogReply.isDone() || hellos < 5) {
                    Reply h = invoke(c, "hello");
                    assertEquals(200, h.code(), "hello while the hog runs (round " + round + "): " + h.raw());
                    hellos++;
                }
                t.join();
                Reply r = hogReply.get();
                assertEquals(502, r.code(), String.valueOf(r.raw()));
                assertTrue(r.raw().toString().contains("OutOfMemoryError"), String.valueOf(r.raw()));
            }
            assertAlive(c);
        });
    }

    /**
     * Waits until {@code left} names no thread, at most 60 s, and asserts it then: empty twice in
     * a row, 200 ms apart, since a spinner blocked at one look is not one that has ended.
     */
    static void awaitNoThreads(java.util.concurrent.Callable<List<String>> left, String what) throws Exception {
        long until = System.nanoTime() + 60_000_000_000L;
        List<String> l = left.call();
        while (!l.isEmpty() && System.nanoTime() < until) {
            Thread.sleep(100);
            l = left.call();
            if (l.isEmpty()) {
                Thread.sleep(200);
                l = left.call();
            }
        }
        assertEquals(List.of(), l, what);
    }

    /** Names of the runtime's threads whose name starts with prefix (from /proc). */
    static List<String> threads(ActionContainer c, String prefix) throws Exception { return threads(c, prefix, false); }

    /** The same, only those running or runnable (state R): a thread blocked in a queue uses no CPU. */
    static List<String> threads(ActionContainer c, String prefix, boolean runnableOnly) throws Exception {
        List<String> l = new java.util.ArrayList<>();
        try (var s = Files.list(Path.of("/proc/" + c.pid() + "/task"))) {
            for (Path t : (Iterable<Path>) s::iterator) {
                try {
                    String n = Files.readString(t.resolve("comm")).trim();
                    String stat = Files.readString(t.resolve("stat"));
                    boolean runnable = stat.substring(stat.lastIndexOf(')') + 2).startsWith("R");
                    if (n.startsWith(prefix) && (runnable || !runnableOnly)) l.add(n);
                } catch (java.io.IOException gone) {
                }
            }
        }
        return l;
    }

    /**
     * A loop that ignores interrupts ends at its deadline: the 502 comes at the deadline and the
     * worker thread that ran it ends too (before: it spun on, burning CPU, for the process's life).
     */
    @Test
    void aLoopThatIgnoresInterruptsEndsAtItsDeadline() throws Exception {
        String spin = probe("""
                long x = 1;
                while (x != 0) { x = x * 31 + 7; if (Thread.interrupted()) x |= 1; }
                return args;""");
        with("java", c -> {
            assertEquals(200, c.init(init(spin)).code());
            Reply r = c.run(runPayload(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 1500))));
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            awaitNoThreads(() -> threads(c, "fn-"), "the activation's worker still runs 60 s after its deadline");
        });
    }

    /**
     * Threads the activation started (directly or through an executor it made) stop at its
     * deadline too, whatever they do with interrupts: none is left running (an executor's thread
     * may stay, blocked on its queue).
     */
    @Test
    void threadsAnActivationStartedEndAtItsDeadline() throws Exception {
        String spin = probe("""
                Runnable r = () -> { long x = 1; while (x != 0) { x = x * 31 + 7; if (Thread.interrupted()) x |= 1; } };
                Thread.ofPlatform().name("spinner-own").start(r);
                java.util.concurrent.Executors.newFixedThreadPool(2, t -> new Thread(t, "spinner-pool")).submit(r);
                r.run();
                return args;""");
        with("java", c -> {
            assertEquals(200, c.init(init(spin)).code());
            Reply r = c.run(runPayload(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 1500))));
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            awaitNoThreads(() -> threads(c, "spinner", true), "threads the activation started still run 60 s after its deadline");
        });
    }

    /**
     * Threads an activation started end with it when it returns, not only at a deadline: spinning
     * ones (ignoring interrupts), one in a thread group of its own, a task on a ForkJoinPool of its
     * own, and one that sleeps again after each interrupt and spins when it wakes. None runs on
     * after the 200 (before: they spun on for the process's life, in the slot the next invocation
     * of the worker leases).
     */
    @Test
    void threadsAnActivationStartedEndWhenItReturns() throws Exception {
        String spin = probe("""
                Runnable spin = () -> { long x = 1; while (x != 0) { x = x * 31 + 7; if (Thread.interrupted()) x |= 1; } };
                Thread.ofPlatform().name("spinner-ret-1").start(spin);
                new Thread(spin, "spinner-ret-2").start();
                new Thread(new ThreadGroup("its-own"), spin, "spinner-group").start();
                new java.util.concurrent.ForkJoinPool(2).submit(() -> { Thread.currentThread().setName("spinner-fj"); spin.run(); });
                new Thread(() -> {
                    for (int i = 0; i < 3; i++) { try { Thread.sleep(2000); } catch (InterruptedException e) { } }
                    spin.run();
                }, "spinner-sleepy").start();
                return args;""");
        with("java", c -> {
            assertEquals(200, c.init(init(spin)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            awaitNoThreads(() -> leftAfterReturn(c), "threads the activation started still run (or the sleeper lives) 60 s after it returned");
            Reply again = c.run(runPayload(new JsonObject()));
            assertEquals(200, again.code(), "the function's next activation: " + again.raw());
        });
    }

    /**
     * A thread an activation made but did not start, kept in a static and started by a later
     * activation of the function (by its own {@code start()}, through a subclass's
     * {@code super.start()}, or by an executor of the later one whose factory hands it over, so the
     * JDK starts it), stops at once: it belongs to the activation that made it, which has ended.
     * Before: it spun on after the later activation returned (that one had made no thread, so its
     * end looked for none, and the poll was off), for the process's life.
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"start", "builder", "subclass", "factory"})
    void aThreadMadeByAnEndedActivationDoesNotRunOn(String how) throws Exception {
        String jar = Archives.jar(Map.of("example/Probe.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Probe {
                    static Thread kept;
                    static final Runnable SPIN = () -> { long x = 1; while (x != 0) { x = x * 31 + 7; if (Thread.interrupted()) x |= 1; } };
                    static final class Own extends Thread {
                        Own() { super(SPIN, "spinner-made-a"); }
                        void go() { super.start(); }
                    }
                    public static JsonObject main(JsonObject args) throws Throwable {
                        String how = args.get("how").getAsString();
                        if (!args.has("later")) { // the first activation makes it and returns
                            kept = switch (how) {
                                case "builder" -> Thread.ofPlatform().name("spinner-made-a").unstarted(SPIN);
                                case "subclass" -> new Own();
                                default -> new Thread(SPIN, "spinner-made-a");
                            };
                            return args;
                        }
                        switch (how) { // a later one starts it
                            case "subclass" -> ((Own) kept).go();
                            case "factory" -> java.util.concurrent.Executors.newSingleThreadExecutor(r -> kept).execute(() -> { });
                            default -> kept.start();
                        }
                        return args;
                    }
                }
                """));
        with("java", c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply a = c.run(runPayload(json("{\"how\":\"" + how + "\"}")));
            assertEquals(200, a.code(), String.valueOf(a.raw()));
            Reply b = c.run(runPayload(json("{\"how\":\"" + how + "\",\"later\":true}")));
            assertTrue(b.code() == 200 || b.code() == 502, String.valueOf(b.raw()));
            awaitNoThreads(() -> threads(c, "spinner-made", true), "a thread made by an ended activation, started by a later one, still runs 60 s after that returned");
            Reply again = c.run(runPayload(json("{\"how\":\"" + how + "\"}")));
            assertEquals(200, again.code(), "the function's next activation: " + again.raw());
        });
    }

    /** The spinners still running, and the sleeper alive in any state (it must end, not only sleep). */
    private static List<String> leftAfterReturn(ActionContainer c) throws Exception {
        List<String> l = new java.util.ArrayList<>(threads(c, "spinner", true));
        for (String t : threads(c, "spinner-sleepy")) if (!l.contains(t)) l.add(t);
        return l;
    }

    /**
     * Work a function hands to the JDK's common {@code ForkJoinPool} (a parallel stream,
     * {@code CompletableFuture.runAsync/supplyAsync} without an executor, {@code Arrays.parallel*})
     * ends at its deadline like the function's own threads: none spins on after the 502. The pool's
     * parallelism is raised (the JDK uses no pool for {@code runAsync} with a parallelism of 1, as
     * on a 2-core machine). Before: the pool's threads, of no activation, spun on for the process's life.
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"parallelStream", "streamParallel", "runAsync", "supplyAsyncThenApplyAsync", "parallelSetAll",
            "concurrentHashMapForEach", "fork"})
    void workOnTheCommonPoolEndsAtTheDeadline(String probe) throws Exception {
        String body = """
                Thread main = Thread.currentThread();
                Runnable spin = () -> {
                    if (Thread.currentThread() != main) Thread.currentThread().setName("spinner-common");
                    long x = 1; while (x != 0) { x = x * 31 + 7; if (Thread.interrupted()) x |= 1; }
                };
                %s
                return args;""".formatted(switch (probe) {
            case "parallelStream" -> "List.of(1, 2, 3, 4, 5, 6, 7, 8).parallelStream().forEach(i -> spin.run());";
            case "streamParallel" -> "java.util.stream.IntStream.range(0, 8).parallel().forEach(i -> spin.run());";
            case "runAsync" -> "java.util.concurrent.CompletableFuture.runAsync(spin); spin.run();";
            case "supplyAsyncThenApplyAsync" -> """
                    java.util.concurrent.CompletableFuture.supplyAsync(() -> 1).thenApplyAsync(i -> { spin.run(); return i; });
                    spin.run();""";
            case "parallelSetAll" -> "int[] a = new int[1 << 16]; Arrays.parallelSetAll(a, i -> { spin.run(); return i; });";
            case "concurrentHashMapForEach" -> """
                    var m = new java.util.concurrent.ConcurrentHashMap<Integer, Integer>();
                    for (int i = 0; i < 64; i++) m.put(i, i);
                    m.forEach(1, (k, v) -> spin.run());""";
            case "fork" -> "java.util.concurrent.ForkJoinTask.adapt(spin).fork(); spin.run();";
            default -> throw new IllegalArgumentException(probe);
        });
        with("java", env("JAVA_TOOL_OPTIONS", "-Djava.util.concurrent.ForkJoinPool.common.parallelism=4"), c -> {
            assertEquals(200, c.init(init(probe(body))).code());
            Reply r = c.run(runPayload(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 1500))));
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            awaitNoThreads(() -> threads(c, "spinner", true), "work the activation gave the common pool still runs 60 s after its deadline");
        });
    }

    /** Ordinary parallel code still computes what it did (sequentially, on the activation's threads). */
    @Test
    void parallelCodeStillComputesItsResult() throws Exception {
        String jar = probe("""
                long sum = java.util.stream.LongStream.rangeClosed(1, 100_000).parallel().sum();
                int listSum = List.of(1, 2, 3, 4).parallelStream().mapToInt(Integer::intValue).sum();
                int[] a = {5, 3, 1, 4, 2};
                Arrays.parallelSort(a);
                Integer[] b = {5, 3, 1, 4, 2};
                Arrays.parallelSort(b);
                long[] p = {1, 2, 3, 4};
                Arrays.parallelPrefix(p, Long::sum);
                String async = java.util.concurrent.CompletableFuture.supplyAsync(() -> "a")
                        .thenApplyAsync(s -> s + "b").thenCombineAsync(java.util.concurrent.CompletableFuture.supplyAsync(() -> "c"), String::concat).get();
                var m = new java.util.concurrent.ConcurrentHashMap<Integer, Integer>();
                for (int i = 1; i <= 10; i++) m.put(i, i);
                class Fib extends java.util.concurrent.RecursiveTask<Integer> {
                    final int n; Fib(int n) { this.n = n; }
                    protected Integer compute() {
                        if (n < 2) return n;
                        Fib f1 = new Fib(n - 1); f1.fork();
                        return new Fib(n - 2).compute() + f1.join();
                    }
                }
                JsonObject r = new JsonObject();
                r.addProperty("sum", sum);
                r.addProperty("listSum", listSum);
                r.addProperty("sorted", Arrays.toString(a) + Arrays.toString(b));
                r.addProperty("prefix", Arrays.toString(p));
                r.addProperty("async", async);
                r.addProperty("chm", m.reduceValuesToLong(1, Integer::longValue, 0L, Long::sum));
                r.addProperty("fib", new Fib(15).invoke());
                r.addProperty("ownPool", new java.util.concurrent.ForkJoinPool(2).invoke(new Fib(15)));
                return r;""");
        with("java", env("JAVA_TOOL_OPTIONS", "-Djava.util.concurrent.ForkJoinPool.common.parallelism=4"), c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            assertEquals(5_000_050_000L, r.body().get("sum").getAsLong());
            assertEquals(10, r.body().get("listSum").getAsInt());
            assertEquals("[1, 2, 3, 4, 5][1, 2, 3, 4, 5]", r.body().get("sorted").getAsString());
            assertEquals("[1, 3, 6, 10]", r.body().get("prefix").getAsString());
            assertEquals("abc", r.body().get("async").getAsString());
            assertEquals(55, r.body().get("chm").getAsLong());
            assertEquals(610, r.body().get("fib").getAsInt());
            assertEquals(610, r.body().get("ownPool").getAsInt());
        });
    }

    /**
     * Threads the activation started that are blocked at its deadline (in a sleep, in a queue's
     * take) are interrupted then: they end, and their count is free for the function's next
     * activation (a limit of 2 threads here). Before: they stayed blocked for the process's life
     * and the next activation could start no thread.
     */
    @Test
    void threadsBlockedAtTheDeadlineEndAndFreeTheirCount() throws Exception {
        String blocker = probe("""
                if (args.has("again")) {
                    for (int i = 0; i < 2; i++) { Thread t = new Thread(() -> { }); t.start(); t.join(); }
                    return args;
                }
                Thread.ofPlatform().name("blocked-sleep").start(() -> {
                    try { Thread.sleep(600_000); } catch (InterruptedException e) { }
                });
                Thread.ofPlatform().name("blocked-take").start(() -> {
                    try { new java.util.concurrent.LinkedBlockingQueue<String>().take(); } catch (InterruptedException e) { }
                });
                Thread.sleep(600_000);
                return args;""");
        with("java", env("CPUSLOT_JAVA_MAX_THREADS", "2"), c -> {
            assertEquals(200, c.init(init(blocker)).code());
            Reply r = c.run(runPayload(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 1500))));
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            awaitNoThreads(() -> threads(c, "blocked-"), "threads blocked at the deadline still live 60 s after it");
            Reply again = c.run(runPayload(json("{\"again\":true}")));
            assertEquals(200, again.code(), "the function's next activation: " + again.raw());
        });
    }

    /**
     * A function cannot fill the process with threads: one that starts 1000 sleeping threads
     * (half directly, half through a cached executor, whose threads the JDK starts) is refused past
     * its limit (CPUSLOT_JAVA_MAX_THREADS, 64 by default) with a clear error that fails its
     * activation; another function beside it still answers (before: 1000 threads stayed).
     */
    @Test
    void theThreadsAFunctionStartsAreBounded() throws Exception {
        String starter = probe("""
                Runnable nap = () -> { try { Thread.sleep(600_000); } catch (InterruptedException e) { } };
                var pool = java.util.concurrent.Executors.newCachedThreadPool(t -> new Thread(t, "sleeper-pool"));
                for (int i = 0; i < 500; i++) {
                    new Thread(nap, "sleeper-own").start();
                    pool.execute(nap);
                }
                return args;""");
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;");
        with("java", c -> {
            assertEquals(200, register(c, "starter", jarFile(c, "starter", starter), null).code());
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            Reply r = invoke(c, "starter");
            int started = threads(c, "sleeper").size();
            assertTrue(started <= 64, started + " threads of the function live in the runtime (its limit: 64)");
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            assertTrue(r.raw().toString().contains("CPUSLOT_JAVA_MAX_THREADS"), String.valueOf(r.raw()));
            Reply h = invoke(c, "hello");
            assertEquals(200, h.code(), "the other function: " + h.raw());
            // a second activation of the same function gets no more: the limit is the function's
            assertEquals(502, invoke(c, "starter").code());
            assertTrue(threads(c, "sleeper").size() <= 64, "the function's threads after a second activation");
            // threads that ended free their count: 300 started one after the other all run
            String churn = probe("""
                    int n = 0;
                    for (int i = 0; i < 300; i++) {
                        int[] ran = new int[1];
                        Thread t = new Thread(() -> ran[0] = 1);
                        t.start();
                        t.join();
                        n += ran[0];
                    }
                    args.addProperty("ran", n);
                    return args;""");
            assertEquals(200, register(c, "churn", jarFile(c, "churn", churn), null).code());
            Reply ch = invoke(c, "churn");
            assertEquals(200, ch.code(), String.valueOf(ch.raw()));
            assertTrue(ch.raw().toString().contains("300"), String.valueOf(ch.raw()));
            assertAlive(c);
        });
    }

    /**
     * Prints each line in two parts with a pause between them, on both streams, and once from a
     * thread it starts: concurrent activations would splice their lines into each other's.
     */
    static final String PRINTER = """
            String id = args.get("id").getAsString();
            for (int i = 0; i < 3; i++) {
                System.out.print(id + " out " + i + " begins, ");
                System.err.print(id + " err " + i + " begins, ");
                Thread.sleep(20);
                System.out.println("ends");
                System.err.println("ends");
            }
            Thread t = new Thread(() -> System.out.println(id + " out from its thread"));
            t.start();
            t.join();
            return args;""";

    /**
     * Output per activation: concurrent OpenWhisk activations of one action each get
     * their stdout and stderr as one block of whole lines, ended by the sentinel on each stream,
     * however their prints interleave in time (before: parts of lines of different activations
     * spliced together, and a sentinel in the middle of another activation's line).
     */
    @Test
    void eachConcurrentActivationsOutputIsItsOwnBlockEndedByTheSentinel() throws Exception {
        String jar = probe(PRINTER);
        int n = 8;
        String[] logs = with("java", env("__OW_ALLOW_CONCURRENT", "true"), c -> {
            assertEquals(200, c.init(init(jar)).code());
            List<JsonObject> runs = new java.util.ArrayList<>();
            for (int i = 0; i < n; i++) runs.add(runPayload(json("{\"id\":\"act" + i + "\"}")));
            for (Reply r : c.runMultiple(runs)) assertEquals(200, r.code(), String.valueOf(r.raw()));
        });
        List<String> ids = java.util.stream.IntStream.range(0, n).mapToObj(i -> "act" + i).toList();
        assertBlocks(logs[0], "out", ids, 4, true);
        assertBlocks(logs[1], "err", ids, 3, true);
    }

    /**
     * Output per activation across functions: two functions of one runtime (Hydra), invoked at
     * the same time, one of them hostile (it closes System.out and System.err, then prints): each
     * invocation's lines are whole and together, and no function removes another's lines from
     * the process's stdout (before: lines spliced, and after the close every later line was gone).
     */
    @Test
    void aFunctionCannotTakeOrRemoveAnothersOutput() throws Exception {
        String printer = probe(PRINTER);
        String closer = probe("""
                System.out.close();
                System.err.close();
                System.out.println("closer was here");
                return args;""");
        int n = 6;
        String[] logs = with("java", c -> {
            assertEquals(200, register(c, "printer", jarFile(c, "printer", printer), null).code());
            assertEquals(200, register(c, "closer", jarFile(c, "closer", closer), null).code());
            assertEquals(200, invoke(c, "closer", "{}").code());
            try (var ex = java.util.concurrent.Executors.newVirtualThreadPerTaskExecutor()) {
                List<java.util.concurrent.Future<Reply>> fs = new java.util.ArrayList<>();
                for (int i = 0; i < n; i++) {
                    String id = "fn" + i;
                    fs.add(ex.submit(() -> invoke(c, "printer", "{\"id\":\"" + id + "\"}")));
                    fs.add(ex.submit(() -> invoke(c, "closer", "{}")));
                }
                for (var f : fs) assertEquals(200, f.get().code(), String.valueOf(f.get().raw()));
            }
        });
        List<String> ids = java.util.stream.IntStream.range(0, n).mapToObj(i -> "fn" + i).toList();
        assertBlocks(logs[0], "out", ids, 4, false);
        assertBlocks(logs[1], "err", ids, 3, false);
    }

    /**
     * An activation's output is held until it ends, at most CPUSLOT_ACTIVATION_LOG_BYTES: past
     * that it is cut, OpenWhisk's truncation line ends its stderr, and the sentinels follow.
     */
    @Test
    void anActivationsOutputIsCutAtItsLimit() throws Exception {
        String jar = probe("""
                for (int i = 0; i < 100; i++) System.out.println("line " + i + " of a long log.............................");
                return args;""");
        String[] logs = with("java", env("CPUSLOT_ACTIVATION_LOG_BYTES", "1000"), c -> {
            assertEquals(200, c.init(init(jar)).code());
            assertEquals(200, c.run(runPayload(new JsonObject())).code());
        });
        String out = logs[0].replace(SENTINEL + "\n", "");
        assertTrue(out.startsWith("line 0 of a long log") && out.length() <= 1001, "stdout: " + logs[0]);
        assertTrue(logs[0].endsWith("\n" + SENTINEL + "\n"), "stdout: " + logs[0]);
        assertEquals("Logs were truncated because the total bytes size exceeds the limit of 1000 bytes.\n" + SENTINEL + "\n", logs[1]);
    }

    /**
     * Each id's lines on the stream are whole ({@code <id> <stream> <i> begins, ends}, and the
     * line from its thread), all {@code lines} of them, one after the other; with sentinels, the
     * line after an activation's last is the sentinel.
     */
    static void assertBlocks(String stream, String name, List<String> ids, int lines, boolean sentinels) {
        List<String> all = List.of(stream.split("\n"));
        for (String id : ids) {
            List<Integer> at = new java.util.ArrayList<>();
            for (int k = 0; k < all.size(); k++) if (all.get(k).contains(id + " ")) at.add(k);
            for (int k : at) {
                String l = all.get(k);
                assertTrue(l.matches(id + " " + name + " \\d begins, ends") || l.equals(id + " out from its thread"),
                        name + " line " + k + " is not one whole line of " + id + ": '" + l + "'\n" + stream);
            }
            assertEquals(lines, at.size(), id + "'s lines on " + name + ":\n" + stream);
            assertEquals(at.get(0) + lines - 1, at.get(lines - 1), id + "'s lines on " + name + " are not together:\n" + stream);
            if (sentinels) {
                assertTrue(at.get(lines - 1) + 1 < all.size() && all.get(at.get(lines - 1) + 1).equals(SENTINEL),
                        "the line after " + id + "'s last on " + name + " is not the sentinel:\n" + stream);
            }
        }
    }

    static Reply invoke(ActionContainer c, String name, String arguments) throws Exception {
        JsonObject o = new JsonObject();
        o.addProperty("name", name);
        o.addProperty("arguments", arguments);
        return c.post("/", o.toString());
    }

    /** Writes the function's jar to a file (for Hydra /register?url=file:). */
    static Path jarFile(ActionContainer c, String name, String base64) throws Exception {
        Path p = c.dir.resolve(name + ".jar");
        Files.write(p, Base64.getDecoder().decode(base64));
        return p;
    }

    static Reply register(ActionContainer c, String name, Path jar, String owner) throws Exception {
        return c.post("/register?name=" + name + "&language=java&entryPoint=example.Probe&url=" + jar.toUri()
                + (owner == null ? "" : "&owner=" + owner), "");
    }

    static Reply invoke(ActionContainer c, String name) throws Exception {
        JsonObject o = new JsonObject();
        o.addProperty("name", name);
        o.addProperty("arguments", "{}");
        return c.post("/", o.toString());
    }

    /**
     * A function's {@code System.gc()} and {@code Runtime.gc()} collect nothing: each would stop
     * every tenant's threads for a full collection of the shared heap (the JVM collects when it
     * needs to). The gc log shows no collection for them, and a bystander's hello latency during a
     * 5 s storm is printed beside the quiet one. (Before: one full collection per call, and the
     * bystander's hello went from a few ms to tens or hundreds.)
     */
    @Test
    void aFunctionsExplicitCollectionsStopNoOne() throws Exception {
        String storm = probe("""
                long until = System.nanoTime() + 5_000_000_000L;
                int n = 0;
                while (System.nanoTime() < until) { System.gc(); Runtime.getRuntime().gc(); n += 2; }
                args.addProperty("calls", n);
                return args;""");
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;");
        Path log = Path.of(System.getProperty("cpuslot.work", "target/conformance")).toAbsolutePath()
                .resolve("gc-" + ProcessHandle.current().pid() + "-" + System.nanoTime() + ".log");
        Files.createDirectories(log.getParent());
        with("java", env("JAVA_TOOL_OPTIONS", "-Xlog:gc:file=" + log), c -> {
            assertEquals(200, register(c, "storm", jarFile(c, "storm", storm), null).code());
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            List<Long> quiet = new java.util.ArrayList<>(), during = new java.util.ArrayList<>();
            for (int i = 0; i < 60; i++) quiet.add(timed(c, "hello"));
            var f = java.util.concurrent.CompletableFuture.supplyAsync(() -> {
                try {
                    return invoke(c, "storm");
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            while (!f.isDone()) during.add(timed(c, "hello"));
            Reply s = f.get(120, java.util.concurrent.TimeUnit.SECONDS);
            assertEquals(200, s.code(), String.valueOf(s.raw()));
            System.out.printf("bystander hello p50/p99: quiet %.2f/%.2f ms, during a System.gc() storm %.2f/%.2f ms (%d calls; %s)%n",
                    ChainBenchmark.pct(quiet, 50) / 1e6, ChainBenchmark.pct(quiet, 99) / 1e6,
                    ChainBenchmark.pct(during, 50) / 1e6, ChainBenchmark.pct(during, 99) / 1e6, during.size(), s.raw());
            long explicit = Files.readAllLines(log).stream().filter(l -> l.contains("System.gc()")).count();
            assertEquals(0, explicit, "collections the function's System.gc() calls made (gc log " + log + ")");
        });
    }

    /**
     * What a function keeps in its statics goes with it: a Hydra function holding 60 % of the heap
     * in a static, once deregistered, leaves room for another that holds as much (its class loader
     * and everything it reaches are collected), and a bystander is served throughout.
     */
    @Test
    void aFunctionsRetainedHeapGoesWhenItIsDeregistered() throws Exception {
        String hog = probe("""
                HOLD = new byte[(int) (Runtime.getRuntime().maxMemory() / 10 * 6)];
                args.addProperty("held", HOLD.length);
                return args;
                }
                static byte[] HOLD;
                static {""");
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;");
        with("java", env("JAVA_TOOL_OPTIONS", "-Xmx256m"), c -> {
            Path jar = jarFile(c, "hog", hog);
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            assertEquals(200, register(c, "hog1", jar, null).code());
            Reply first = invoke(c, "hog1");
            assertEquals(200, first.code(), String.valueOf(first.raw()));
            assertEquals(200, invoke(c, "hello").code(), "a bystander beside the hog");
            assertEquals(200, c.post("/deregister?name=hog1", "").code());
            assertEquals(200, register(c, "hog2", jar, null).code());
            Reply second = invoke(c, "hog2");
            assertEquals(200, second.code(), "a second hog after the first was deregistered: " + second.raw());
            assertEquals(200, invoke(c, "hello").code(), "a bystander beside the second hog");
        });
    }

    private static long timed(ActionContainer c, String name) throws Exception {
        long t0 = System.nanoTime();
        Reply r = invoke(c, name);
        assertEquals(200, r.code(), String.valueOf(r.raw()));
        return System.nanoTime() - t0;
    }

    /**
     * A function cannot use the runtime's control endpoints over the network: a Java function that
     * POSTs {@code /deregister} of another function, or {@code /register} of a new one, to the
     * runtime's own port on loopback gets 403, and nothing changes; the same requests from outside
     * the process still work. (Before: 200, the other function was gone and the planted one served.)
     */
    @Test
    void aFunctionCannotUseTheControlEndpointsOverLoopback() throws Exception {
        String caller = probe(LOOPBACK_CALL);
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;");
        with("java", c -> {
            Path helloJar = jarFile(c, "hello", hello);
            assertEquals(200, register(c, "caller", jarFile(c, "caller", caller), null).code());
            assertEquals(200, register(c, "victim", helloJar, null).code());
            for (String path : List.of("/deregister?name=victim",
                    "/register?name=planted&language=java&entryPoint=example.Probe&url=" + helloJar.toUri(),
                    "/warmup?name=victim")) {
                JsonObject a = new JsonObject();
                a.addProperty("port", c.port());
                a.addProperty("path", path);
                a.addProperty("body", "");
                JsonObject o = new JsonObject();
                o.addProperty("name", "caller");
                o.addProperty("arguments", a.toString());
                Reply r = c.post("/", o.toString());
                assertEquals(200, r.code(), path + ": " + r.raw());
                assertEquals(403, r.body().getAsJsonObject("result").get("code").getAsInt(), "a function's " + path + " over loopback: " + r.raw());
            }
            assertEquals(200, invoke(c, "victim").code(), "the other function after the probes");
            assertEquals(404, invoke(c, "planted").code(), "a function the probe registered");
            assertEquals(200, c.post("/deregister?name=victim", "").code(), "the same request from outside the process");
        });
    }

    /**
     * The invocation endpoints ({@code /init}, {@code /run}, {@code POST /}) do not answer a
     * connection of the runtime's own process either: a function cannot run its action with
     * arguments of its choosing, nor another function, as the platform. The platform's calls come
     * from another process (here the test's, over loopback, as Knative's queue-proxy does) and are
     * served. (Before: the function's /run ran the action again, its Knative POST / too, and its
     * Hydra POST / ran another function.)
     */
    @Test
    void aFunctionCannotUseTheInvocationEndpointsOverLoopback() throws Exception {
        String caller = probe("""
                if (args.has("inner")) {
                    JsonObject r = new JsonObject();
                    r.addProperty("ran", "the inner call");
                    return r;
                }
                """ + LOOPBACK_CALL);
        String refused = "the runtime's own process";
        List<String> answered = new java.util.ArrayList<>(); // the calls that were not refused
        // OpenWhisk (concurrent, so that an overlapping /run would be taken) and Knative's single entrypoint
        with("java", env("__OW_ALLOW_CONCURRENT", "true"), c -> {
            assertEquals(200, c.post("/init", init(caller).toString()).code());
            JsonObject inner = new JsonObject();
            inner.addProperty("inner", true);
            Map<String, String> bodies = new java.util.LinkedHashMap<>();
            bodies.put("/run", runPayload(inner).toString());
            bodies.put("/", runPayload(inner).toString());
            bodies.put("/init", init(caller).toString());
            for (Map.Entry<String, String> e : bodies.entrySet()) {
                JsonObject a = new JsonObject();
                a.addProperty("port", c.port());
                a.addProperty("path", e.getKey());
                a.addProperty("body", e.getValue());
                Reply r = c.post("/run", runPayload(a).toString());
                assertEquals(200, r.code(), e.getKey() + ": " + r.raw());
                if (r.body().get("code").getAsInt() != 403 || !r.body().get("body").getAsString().contains(refused))
                    answered.add("POST " + e.getKey() + ": " + r.raw());
            }
            JsonObject inner2 = new JsonObject();
            inner2.addProperty("inner", true);
            assertEquals("the inner call", c.post("/run", runPayload(inner2).toString()).body().get("ran").getAsString(),
                    "the platform's /run after the probes");
        });
        // Hydra: another function of the same owner
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"world\"); return r;");
        with("java", c -> {
            assertEquals(200, register(c, "caller", jarFile(c, "caller", caller), null).code());
            assertEquals(200, register(c, "victim", jarFile(c, "victim", hello), null).code());
            JsonObject a = new JsonObject();
            a.addProperty("port", c.port());
            a.addProperty("path", "/");
            JsonObject call = new JsonObject();
            call.addProperty("name", "victim");
            call.addProperty("arguments", "{}");
            a.addProperty("body", call.toString());
            Reply r = invoke(c, "caller", a.toString());
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            JsonObject got = r.body().getAsJsonObject("result");
            if (got.get("code").getAsInt() != 403 || !got.get("body").getAsString().contains(refused))
                answered.add("Hydra POST /: " + r.raw());
            assertEquals(200, invoke(c, "victim").code(), "the platform's call of the other function");
        });
        assertEquals(List.of(), answered, "a function's calls over loopback that were not refused as the runtime's own");
    }

    /**
     * With CPUSLOT_CONTROL_TOKEN_FILE (for a relay in the pod, such as Knative's queue-proxy, which
     * forwards what a function sends it), the control endpoints need the file's token, and no
     * function can read the file.
     */
    @Test
    void theControlEndpointsNeedTheTokenAndNoFunctionReadsIt() throws Exception {
        Path token = Files.createTempFile("control", ".token");
        Files.writeString(token, "s3cret-" + System.nanoTime() + "\n");
        String reader = probe("""
                args.addProperty("token", Files.readString(Path.of(args.get("file").getAsString())));
                return args;""");
        try {
            with("java", env("CPUSLOT_CONTROL_TOKEN_FILE", token.toString()), c -> {
                Path jar = jarFile(c, "reader", reader);
                Reply no = register(c, "reader", jar, null);
                assertEquals(403, no.code(), "/register without the token: " + no.raw());
                Reply wrong = c.post("/register?name=reader&language=java&entryPoint=example.Probe&url=" + jar.toUri(), "",
                        Map.of("X-Cpuslot-Control-Token", "guess"));
                assertEquals(403, wrong.code(), "/register with another token: " + wrong.raw());
                Reply ok = c.post("/register?name=reader&language=java&entryPoint=example.Probe&url=" + jar.toUri(), "",
                        Map.of("X-Cpuslot-Control-Token", Files.readString(token).strip()));
                assertEquals(200, ok.code(), "/register with the token: " + ok.raw());
                JsonObject a = new JsonObject();
                a.addProperty("file", token.toString());
                JsonObject o = new JsonObject();
                o.addProperty("name", "reader");
                o.addProperty("arguments", a.toString());
                Reply r = c.post("/", o.toString());
                assertFalse(r.raw().toString().contains("s3cret"), "a function read the control token: " + r.raw());
                assertTrue(r.raw().toString().contains("the runtime's own"), String.valueOf(r.raw()));
            });
        } finally {
            Files.deleteIfExists(token);
        }
    }

    /**
     * The process boundary holds between owners as within one: in a runtime of several owners
     * ({@code CPUSLOT_OWNER=*}), mallory's functions that would reach the agent socket, walk to the
     * top thread group, end the process or hook its exit are refused at {@code /register}; her
     * function's control and invocation calls over loopback get 403; her threads end when her
     * activation returns; her OutOfMemoryError is her activation's. Alice's function answers after
     * each, and her function is still hers.
     */
    @Test
    void theProcessBoundaryHoldsBetweenOwners() throws Exception {
        String hello = probe("JsonObject r = new JsonObject(); r.addProperty(\"hello\", \"alice\"); return r;");
        String caller = probe(LOOPBACK_CALL);
        String spin = probe("""
                Runnable spin = () -> { long x = 1; while (x != 0) { x = x * 31 + 7; if (Thread.interrupted()) x |= 1; } };
                new Thread(spin, "spinner-owner-1").start();
                new Thread(new ThreadGroup("its-own"), spin, "spinner-owner-2").start();
                return args;""");
        String hog = probe("""
                List<long[]> hog = new ArrayList<>();
                while (true) hog.add(new long[1 << 16]);""");
        with("java", env("CPUSLOT_OWNER", "*", "JAVA_TOOL_OPTIONS", "-Xmx256m"), c -> {
            Path helloJar = jarFile(c, "hello", hello);
            assertEquals(200, register(c, "victim", helloJar, "alice").code());
            java.util.function.Consumer<String> aliceAnswers = after -> {
                try {
                    Reply r = invoke(c, "victim");
                    assertEquals(200, r.code(), "alice's function after " + after + ": " + r.raw());
                    assertEquals("alice", r.body().getAsJsonObject("result").get("hello").getAsString(), after + ": " + r.raw());
                } catch (Exception e) {
                    throw new AssertionError("alice's function after " + after, e);
                }
            };
            for (String p : List.of("agentSocket", "threadGroupWalk", "exitByMethodReference", "shutdownHook")) {
                Reply r = register(c, p, jarFile(c, p, probe(refusedProbe(p))), "mallory");
                assertNotEquals(200, r.code(), "mallory's " + p + " probe registered: " + r.raw());
                assertTrue(r.raw().toString().contains("not allowed to a function in a shared runtime"), p + ": " + r.raw());
                aliceAnswers.accept(p);
            }

            assertEquals(200, register(c, "caller", jarFile(c, "caller", caller), "mallory").code());
            JsonObject hydraCall = new JsonObject();
            hydraCall.addProperty("name", "victim");
            hydraCall.addProperty("arguments", "{}");
            for (String path : List.of("/deregister?name=victim&owner=alice",
                    "/register?name=victim&language=java&entryPoint=example.Probe&owner=alice&url=" + helloJar.toUri(), "/")) {
                JsonObject a = new JsonObject();
                a.addProperty("port", c.port());
                a.addProperty("path", path);
                a.addProperty("body", path.equals("/") ? hydraCall.toString() : "");
                Reply r = invoke(c, "caller", a.toString());
                assertEquals(200, r.code(), path + ": " + r.raw());
                assertEquals(403, r.body().getAsJsonObject("result").get("code").getAsInt(), "mallory's " + path + " over loopback: " + r.raw());
                aliceAnswers.accept("mallory's " + path);
            }

            assertEquals(200, register(c, "spin", jarFile(c, "spin", spin), "mallory").code());
            assertEquals(200, invoke(c, "spin").code());
            awaitNoThreads(() -> threads(c, "spinner-owner", true), "mallory's threads still run 60 s after her activation returned");
            aliceAnswers.accept("mallory's spinners");

            assertEquals(200, register(c, "hog", jarFile(c, "hog", hog), "mallory").code());
            Reply h = invoke(c, "hog");
            assertEquals(502, h.code(), String.valueOf(h.raw()));
            assertTrue(h.raw().toString().contains("OutOfMemoryError"), String.valueOf(h.raw()));
            aliceAnswers.accept("mallory's OutOfMemoryError");
            assertAlive(c);
        });
    }

    /**
     * Where the platform never uses the control endpoints (Knative's and OpenWhisk's recipes set
     * {@code CPUSLOT_CONTROL_ENDPOINTS=false}), they answer no one: not the platform's own
     * process, not a holder of a control token; the invocations are served as before.
     */
    @Test
    void controlEndpointsTurnedOffAnswerNoOne() throws Exception {
        Path token = Files.createTempFile("control", ".token");
        Files.writeString(token, "s3cret-" + System.nanoTime() + "\n");
        String hello = probe("""
                args.addProperty("hello", "world");
                return args;""");
        try {
            with("java", env("CPUSLOT_CONTROL_ENDPOINTS", "false", "CPUSLOT_CONTROL_TOKEN_FILE", token.toString()), c -> {
                Path jar = jarFile(c, "hello", hello);
                Map<String, String> withToken = Map.of("X-Cpuslot-Control-Token", Files.readString(token).strip());
                for (String path : List.of("/register?name=hello&language=java&entryPoint=example.Probe&url=" + jar.toUri(),
                        "/deregister?name=hello", "/warmup")) {
                    Reply r = c.post(path, "", withToken);
                    assertEquals(403, r.code(), path + " with the control endpoints off: " + r.raw());
                    assertTrue(r.raw().toString().contains("CPUSLOT_CONTROL_ENDPOINTS"), path + ": " + r.raw());
                }
                assertEquals(200, c.init(init(hello)).code());
                Reply run = c.run(runPayload(new JsonObject()));
                assertEquals(200, run.code(), String.valueOf(run.raw()));
                assertEquals("world", run.body().get("hello").getAsString(), String.valueOf(run.raw()));
            });
        } finally {
            Files.deleteIfExists(token);
        }
    }

    /**
     * Each function has its own temporary directory (java.io.tmpdir, File.createTempFile,
     * Files.createTempFile), removed with the function; no function's jar is a file another can read.
     */
    @Test
    void eachFunctionHasItsOwnTemporaryDirectory() throws Exception {
        String writer = probe("""
                Path f = Files.createTempFile("secret", ".txt");
                Files.writeString(f, "mine");
                File g = File.createTempFile("secret", ".bin");
                JsonObject r = new JsonObject();
                r.addProperty("tmpdir", System.getProperty("java.io.tmpdir"));
                r.addProperty("file", f.toString());
                r.addProperty("file2", g.getPath());
                return r;""");
        String reader = probe("""
                JsonObject r = new JsonObject();
                String dir = System.getProperty("java.io.tmpdir");
                r.addProperty("tmpdir", dir);
                StringBuilder sb = new StringBuilder();
                try (var s = Files.list(Path.of(dir))) { s.forEach(p -> sb.append(p.getFileName()).append(' ')); }
                r.addProperty("list", sb.toString());
                return r;""");
        with("java", c -> {
            assertEquals(200, register(c, "writer", jarFile(c, "writer", writer), null).code());
            assertEquals(200, register(c, "reader", jarFile(c, "reader", reader), null).code());
            JsonObject w = invoke(c, "writer").body().getAsJsonObject("result");
            JsonObject r = invoke(c, "reader").body().getAsJsonObject("result");
            String jvmTmp = c.dir.resolve("tmp").toString();
            String wDir = w.get("tmpdir").getAsString(), rDir = r.get("tmpdir").getAsString();
            assertNotEquals(jvmTmp, wDir, "the writer's java.io.tmpdir is the JVM's");
            assertNotEquals(wDir, rDir, "two functions share a temporary directory");
            assertTrue(w.get("file").getAsString().startsWith(wDir + "/"), w.toString());
            assertTrue(w.get("file2").getAsString().startsWith(wDir + "/"), w.toString());
            assertFalse(r.get("list").getAsString().contains("secret"), r.toString());
            // no jar of any function lies in the runtime's temporary directory for others to read
            try (var s = Files.walk(c.dir.resolve("tmp"))) {
                List<Path> jars = s.filter(p -> p.toString().endsWith(".jar")).toList();
                assertEquals(List.of(), jars, "function jars on disk");
            }
            assertTrue(Files.isDirectory(Path.of(wDir)));
            assertEquals(200, c.post("/deregister?name=writer", "").code());
            assertFalse(Files.exists(Path.of(wDir)), "the writer's temporary directory outlived it");
        });
    }

    /** A runtime serves one owner: /register from another owner is refused with 403. */
    @Test
    void aRegisterFromAnotherOwnerIsRefused() throws Exception {
        String hello = probe("return args;");
        with("java", c -> {
            Path jar = jarFile(c, "hello", hello);
            assertEquals(200, register(c, "a", jar, "alice").code());
            assertEquals(200, register(c, "a2", jar, "alice").code());
            Reply bob = register(c, "b", jar, "bob");
            assertEquals(403, bob.code(), String.valueOf(bob.raw()));
            assertTrue(bob.body().get("error").getAsString().contains("alice"), String.valueOf(bob.raw()));
            assertEquals(404, invoke(c, "b").code());
        });
    }

    /** The configured owner: another is refused from the first /register on. */
    @Test
    void theConfiguredOwnerIsTheOnlyOne() throws Exception {
        String hello = probe("return args;");
        with("java", env("CPUSLOT_OWNER", "alice"), c -> {
            Path jar = jarFile(c, "hello", hello);
            assertEquals(403, register(c, "b", jar, "bob").code());
            assertEquals(200, register(c, "a", jar, "alice").code());
        });
    }

    /** An OpenWhisk runtime serves the namespace of its first activation; another namespace's /run gets 403. */
    @Test
    void anActivationFromAnotherNamespaceIsRefused() throws Exception {
        String hello = probe("return args;");
        with("java", c -> {
            assertEquals(200, c.init(init(hello)).code());
            assertEquals(200, c.run(runPayload(new JsonObject(), Map.of("namespace", "alice"))).code());
            Reply bob = c.run(runPayload(new JsonObject(), Map.of("namespace", "bob")));
            assertEquals(403, bob.code(), String.valueOf(bob.raw()));
            assertEquals(200, c.run(runPayload(new JsonObject(), Map.of("namespace", "alice"))).code());
        });
    }

    /**
     * File access by path: a function reads and writes what the OS lets the runtime
     * process, but not the process itself ({@code /proc}, {@code /sys}, devices but the harmless
     * ones), not the runtime's temporary directory (its log, other functions' directories) outside
     * its own, and it cannot make links or reach the file system below the paths it names. Each
     * probe either is refused at /init (a call no function needs) or fails at /run with a
     * SecurityException naming the path; the runtime lives on. (Before: /proc/self/environ and the
     * runtime's log were read, /proc/self/mem opened for writing, the standard output closed.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {
            "procSelfEnviron", "procSelfMemWrite", "procThroughFile", "procThroughRelativePath", "procThroughDevFd",
            "procThroughChannel", "procThroughScanner", "procThroughUrl", "runtimeLog", "listRuntimeTmp",
            "sysfs", "closeStandardOutput", "symlink", "hardLink", "fileSystemProvider", "deleteRuntimeLog"})
    void aFunctionCannotReachTheProcessOrTheRuntimesFilesByPath(String probe) throws Exception {
        String parent = "Path.of(System.getProperty(\"java.io.tmpdir\")).getParent()";
        // the runtime's log: where CPUSLOT_LOG says (the tests' runtimes log to a file of their own)
        String log = "Path.of(System.getenv(\"CPUSLOT_LOG\").substring(\"file:\".length()))";
        String body = switch (probe) {
            case "procSelfEnviron" -> """
                    args.addProperty("env", Files.readString(Path.of("/proc/self/environ")));
                    return args;""";
            case "procSelfMemWrite" -> """
                    try (RandomAccessFile f = new RandomAccessFile("/proc/self/mem", "rw")) { f.seek(4096); f.write(0); }
                    return args;""";
            case "procThroughFile" -> """
                    args.addProperty("fds", String.join(",", new File("/proc/self/fd").list()));
                    return args;""";
            case "procThroughRelativePath" -> """
                    Path p = Path.of(System.getProperty("java.io.tmpdir")).relativize(Path.of("/proc/self/environ"));
                    args.addProperty("env", new String(new FileInputStream(System.getProperty("java.io.tmpdir") + "/" + p).readAllBytes()));
                    return args;""";
            case "procThroughDevFd" -> """
                    try (FileOutputStream o = new FileOutputStream("/dev/fd/1", true)) { o.write("XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX\\n".getBytes()); }
                    return args;""";
            case "procThroughChannel" -> """
                    try (var ch = java.nio.channels.FileChannel.open(Path.of("/proc/self/maps"))) { args.addProperty("size", ch.size()); }
                    return args;""";
            case "procThroughScanner" -> """
                    args.addProperty("line", new Scanner(new File("/proc/self/cmdline")).nextLine());
                    return args;""";
            case "procThroughUrl" -> """
                    try (InputStream in = new java.net.URI("file:///proc/self/environ").toURL().openStream()) { args.addProperty("n", in.readAllBytes().length); }
                    return args;""";
            case "runtimeLog" -> """
                    args.addProperty("log", Files.readString(%s));
                    return args;""".formatted(log);
            case "listRuntimeTmp" -> """
                    try (var s = Files.list(%s)) { args.addProperty("n", s.count()); }
                    return args;""".formatted(parent);
            case "deleteRuntimeLog" -> """
                    args.addProperty("deleted", %s.toFile().delete());
                    return args;""".formatted(log);
            case "sysfs" -> """
                    try (var s = Files.list(Path.of("/sys/fs/cgroup"))) { args.addProperty("n", s.count()); }
                    return args;""";
            case "closeStandardOutput" -> """
                    new FileOutputStream(FileDescriptor.out).close();
                    return args;""";
            case "symlink" -> """
                    Path l = Path.of(System.getProperty("java.io.tmpdir"), "l");
                    Files.createSymbolicLink(l, Path.of("/proc/self/environ"));
                    args.addProperty("env", Files.readString(l));
                    return args;""";
            case "hardLink" -> """
                    Files.createLink(Path.of(System.getProperty("java.io.tmpdir"), "l"), %s);
                    return args;""".formatted(log);
            case "fileSystemProvider" -> """
                    Path p = Path.of("/proc/self/environ");
                    try (InputStream in = p.getFileSystem().provider().newInputStream(p)) { args.addProperty("n", in.readAllBytes().length); }
                    return args;""";
            default -> throw new IllegalArgumentException(probe);
        };
        assertRefused(probe, body);
    }

    /**
     * XML external entities: a function's own XML parser (DOM, SAX, StAX, schema
     * validation), even one the function tells to allow external access, does not read a file
     * through an entity that its file calls may not read (the runtime's log here). Each probe
     * fails; the runtime lives on. (Before: the JDK's parsers read it.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"dom", "sax", "stax", "domAllowedByTheFunction", "saxReaderAllowedByTheFunction",
            "staxAllowedByTheFunction"})
    void anXmlParserReadsNoFileThroughAnExternalEntity(String probe) throws Exception {
        // the runtime's log: its file calls may not read it (the path check refuses it)
        String xml = """
                String log = System.getenv("CPUSLOT_LOG").substring("file:".length());
                String xml = "<?xml version=\\"1.0\\"?><!DOCTYPE x [<!ENTITY e SYSTEM \\"file://" + log + "\\">]><x>&e;</x>";
                InputStream in = new ByteArrayInputStream(xml.getBytes());
                """;
        String all = "javax.xml.XMLConstants.ACCESS_EXTERNAL_DTD, \"all\"";
        String body = xml + switch (probe) {
            case "dom" -> """
                    args.addProperty("read", javax.xml.parsers.DocumentBuilderFactory.newInstance().newDocumentBuilder().parse(in).getDocumentElement().getTextContent());
                    return args;""";
            case "sax" -> """
                    StringBuilder sb = new StringBuilder();
                    javax.xml.parsers.SAXParserFactory.newInstance().newSAXParser().parse(in, new org.xml.sax.helpers.DefaultHandler() {
                        @Override public void characters(char[] ch, int start, int length) { sb.append(ch, start, length); }
                    });
                    args.addProperty("read", sb.toString());
                    return args;""";
            case "stax" -> """
                    var r = javax.xml.stream.XMLInputFactory.newInstance().createXMLStreamReader(in);
                    StringBuilder sb = new StringBuilder();
                    while (r.hasNext()) { if (r.next() == javax.xml.stream.XMLStreamConstants.CHARACTERS) sb.append(r.getText()); }
                    args.addProperty("read", sb.toString());
                    return args;""";
            case "domAllowedByTheFunction" -> """
                    var f = javax.xml.parsers.DocumentBuilderFactory.newInstance();
                    f.setAttribute(%s);
                    args.addProperty("read", f.newDocumentBuilder().parse(in).getDocumentElement().getTextContent());
                    return args;""".formatted(all);
            case "saxReaderAllowedByTheFunction" -> """
                    org.xml.sax.XMLReader r = javax.xml.parsers.SAXParserFactory.newInstance().newSAXParser().getXMLReader();
                    r.setProperty(%s);
                    StringBuilder sb = new StringBuilder();
                    r.setContentHandler(new org.xml.sax.helpers.DefaultHandler() {
                        @Override public void characters(char[] ch, int start, int length) { sb.append(ch, start, length); }
                    });
                    r.parse(new org.xml.sax.InputSource(in));
                    args.addProperty("read", sb.toString());
                    return args;""".formatted(all);
            case "staxAllowedByTheFunction" -> """
                    var f = javax.xml.stream.XMLInputFactory.newInstance();
                    f.setProperty(%s);
                    var r = f.createXMLStreamReader(in);
                    StringBuilder sb = new StringBuilder();
                    while (r.hasNext()) { if (r.next() == javax.xml.stream.XMLStreamConstants.CHARACTERS) sb.append(r.getText()); }
                    args.addProperty("read", sb.toString());
                    return args;""".formatted(all);
            default -> throw new IllegalArgumentException(probe);
        };
        String jar = probe(body);
        with("java", c -> {
            Reply init = c.init(init(jar));
            Reply run = init.code() == 200 ? c.run(runPayload(new JsonObject())) : null;
            assertAlive(c);
            String seen = init.raw() + " " + (run == null ? "" : run.raw());
            assertFalse(seen.contains("cpuslot-runtime"), "the " + probe + " parser read the runtime's log: " + seen);
            assertTrue(init.code() != 200 || run.code() == 502, "the " + probe + " probe was not refused: " + seen);
        });
    }

    /**
     * XML catalogs: a catalog file is opened by the parser itself, past the path checks a
     * function's file calls get, so a function may not name one (the runtime's log here) on any
     * of the JDK's parsers, nor use the catalog API. Each probe is refused; the runtime lives on.
     * (Before: every parser took the property, and the catalog API was open.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"dom", "saxReader", "stax", "schema", "catalogApi"})
    void aFunctionCannotNameAnXmlCatalog(String probe) throws Exception {
        String log = "\"file://\" + System.getenv(\"CPUSLOT_LOG\").substring(\"file:\".length())";
        String files = "\"javax.xml.catalog.files\", " + log;
        String body = switch (probe) {
            case "dom" -> """
                    javax.xml.parsers.DocumentBuilderFactory.newInstance().setAttribute(%s);
                    return args;""".formatted(files);
            case "saxReader" -> """
                    javax.xml.parsers.SAXParserFactory.newInstance().newSAXParser().getXMLReader().setProperty(%s);
                    return args;""".formatted(files);
            case "stax" -> """
                    javax.xml.stream.XMLInputFactory.newInstance().setProperty(%s);
                    return args;""".formatted(files);
            case "schema" -> """
                    javax.xml.validation.SchemaFactory.newInstance(javax.xml.XMLConstants.W3C_XML_SCHEMA_NS_URI).setProperty(%s);
                    return args;""".formatted(files);
            case "catalogApi" -> """
                    var r = javax.xml.catalog.CatalogManager.catalogResolver(javax.xml.catalog.CatalogFeatures.defaults(), java.net.URI.create(%s));
                    args.addProperty("read", String.valueOf(r.resolveEntity(null, "urn:x")));
                    return args;""".formatted(log);
            default -> throw new IllegalArgumentException(probe);
        };
        assertRefused(probe, body);
    }

    /**
     * GraalPy's standard library and its bytecode (.pyc), which the image ships beside the jar
     * (polyglot/, PolyglotCache) and every Python function of the runtime imports: a Java function
     * can neither plant a module or a .pyc there nor read it (before: nothing but the file's owner
     * kept it out, and the tests' runtime runs as root). The probes write, list and read there.
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"plantPyc", "replaceModule", "listCache"})
    void aFunctionCannotChangeThePythonLibraryOtherFunctionsImport(String probe) throws Exception {
        // the cache the runtime took beside its jar (the image's /opt/cpuslot/polyglot), or
        // Truffle's default when the build made none
        String cache = "(System.getProperty(\"polyglot.engine.userResourceCache\") != null"
                + " ? Path.of(System.getProperty(\"polyglot.engine.userResourceCache\"))"
                + " : Path.of(System.getProperty(\"user.home\"), \".cache\", \"org.graalvm.polyglot\"))";
        String body = switch (probe) {
            case "plantPyc" -> """
                    Path d = %s.resolve("python/__pycache__");
                    Files.createDirectories(d);
                    Files.write(d.resolve("json.graalpy250-312.pyc"), new byte[16]);
                    return args;""".formatted(cache);
            case "replaceModule" -> """
                    Files.writeString(%s.resolve("planted.py"), "import os\\n");
                    return args;""".formatted(cache);
            case "listCache" -> """
                    try (var s = Files.list(%s)) { args.addProperty("n", s.count()); }
                    return args;""".formatted(cache);
            default -> throw new IllegalArgumentException(probe);
        };
        assertRefused(probe, body);
    }

    /** What a function may do with files: its own temporary directory, the image's files, the harmless devices. */
    @Test
    void aFunctionUsesItsOwnFilesAndTheImages() throws Exception {
        String jar = probe("""
                Path dir = Path.of(System.getProperty("java.io.tmpdir"));
                Path f = dir.resolve("data.txt");
                Files.writeString(f, "mine");
                try (Writer w = new FileWriter(f.toFile(), true)) { w.write("+more"); }
                try (RandomAccessFile r = new RandomAccessFile(f.toString(), "rw")) { r.seek(0); r.write('M'); }
                args.addProperty("own", Files.readString(f));
                args.addProperty("listed", new File(dir.toString()).list().length);
                Files.createDirectories(dir.resolve("a/b"));
                Files.move(f, dir.resolve("a/b/moved.txt"));
                args.addProperty("moved", Files.exists(dir.resolve("a/b/moved.txt")));
                args.addProperty("image", Files.readAllLines(Path.of("/etc/passwd")).isEmpty() ? "empty" : "read");
                byte[] b = new byte[8];
                try (InputStream in = new FileInputStream("/dev/urandom")) { args.addProperty("random", in.read(b)); }
                try (OutputStream o = new FileOutputStream("/dev/null")) { o.write(b); }
                return args;""");
        with("java", c -> {
            assertEquals(200, c.init(init(jar)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            JsonObject o = r.body().getAsJsonObject();
            assertEquals("Mine+more", o.get("own").getAsString(), String.valueOf(r.raw()));
            assertEquals("read", o.get("image").getAsString(), String.valueOf(r.raw()));
            assertTrue(o.get("moved").getAsBoolean(), String.valueOf(r.raw()));
            assertEquals(8, o.get("random").getAsInt(), String.valueOf(r.raw()));
        });
    }

    /** One function cannot read another's temporary files, even by their exact path. */
    @Test
    void aFunctionCannotReadAnothersFileByItsPath() throws Exception {
        String writer = probe("""
                Path f = Files.createTempFile("secret", ".txt");
                Files.writeString(f, "mine");
                args.addProperty("file", f.toString());
                return args;""");
        String reader = probe("""
                args.addProperty("read", Files.readString(Path.of(args.get("file").getAsString())));
                return args;""");
        with("java", c -> {
            assertEquals(200, register(c, "writer", jarFile(c, "writer", writer), null).code());
            assertEquals(200, register(c, "reader", jarFile(c, "reader", reader), null).code());
            String file = invoke(c, "writer").body().getAsJsonObject("result").get("file").getAsString();
            JsonObject o = new JsonObject();
            o.addProperty("name", "reader");
            JsonObject a = new JsonObject();
            a.addProperty("file", file);
            o.addProperty("arguments", a.toString());
            Reply r = c.post("/", o.toString());
            assertFalse(String.valueOf(r.raw()).contains("\"read\":\"mine\""), "the reader read the writer's file: " + r.raw());
            assertTrue(String.valueOf(r.raw()).contains("not allowed to a function in a shared runtime"), String.valueOf(r.raw()));
        });
    }

    /**
     * The probe's action is refused at /init, or its /run fails (502) with the guard's refusal;
     * either way the runtime lives on.
     */
    static void assertRefused(String probe, String body) throws Exception {
        String jar = probe(body);
        with("java", c -> {
            Reply init = c.init(init(jar));
            Reply run = init.code() == 200 ? c.run(runPayload(new JsonObject())) : null;
            assertAlive(c);
            Reply refused = init.code() == 200 ? run : init;
            assertEquals(502, refused.code(), "/init of the " + probe + " probe: " + init.code() + " " + init.raw()
                    + ", then /run: " + (run == null ? "-" : run.code() + " " + run.raw()));
            String err = refused.body().get("error").getAsString();
            assertTrue(err.contains("not allowed to a function in a shared runtime"), err);
        });
    }
}
