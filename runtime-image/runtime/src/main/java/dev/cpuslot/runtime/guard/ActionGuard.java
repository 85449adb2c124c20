package dev.cpuslot.runtime.guard;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileAttribute;
import java.lang.management.ManagementFactory;
import java.lang.reflect.AccessibleObject;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Member;
import java.lang.reflect.Method;
import java.lang.management.MemoryPoolMXBean;
import java.lang.management.MemoryType;
import java.lang.management.MemoryUsage;
import java.util.List;
import java.util.Collections;
import java.util.Set;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.HashMap;
import java.util.Map;

/**
 * What a Java action's classes call instead of the process-wide calls a multi-tenant runtime cannot
 * give one tenant ({@link Rewriter} redirects them here): {@code System.exit}, {@code Runtime.exit},
 * {@code Runtime.halt} throw a SecurityException (as a SecurityManager used to);
 * {@code System.getenv} sees the activation's {@code __OW_*} and /init environment on top of the
 * process's, as the OpenWhisk Java runtime provides them; {@code java.io.tmpdir} and the
 * temporary-file calls give the function's own directory.
 *
 * <p>Shared with every action class loader; functions cannot call it themselves (the guard refuses
 * references to the runtime's classes).
 */
public final class ActionGuard {
    private ActionGuard() {}

    private static final ThreadLocal<Map<String, String>> ENV = new ThreadLocal<>();

    /** Sets the calling thread's action environment (null clears it). */
    public static void setEnv(Map<String, String> env) {
        if (env == null) ENV.remove();
        else ENV.set(env);
    }

    public static Map<String, String> env() { return ENV.get(); }

    public static void exit(int status) {
        throw new SecurityException("System.exit(" + status + ") called by the action: not allowed in a shared runtime");
    }

    public static void exit(Runtime rt, int status) {
        throw new SecurityException("Runtime.exit(" + status + ") called by the action: not allowed in a shared runtime");
    }

    public static void halt(Runtime rt, int status) {
        throw new SecurityException("Runtime.halt(" + status + ") called by the action: not allowed in a shared runtime");
    }

    public static String getenv(String name) {
        Map<String, String> e = ENV.get();
        if (e != null && name != null) {
            String v = e.get(name);
            if (v != null) return v;
        }
        return System.getenv(name);
    }

    public static Map<String, String> getenv() {
        Map<String, String> e = ENV.get();
        if (e == null || e.isEmpty()) return System.getenv();
        Map<String, String> m = new HashMap<>(System.getenv());
        m.putAll(e);
        return Collections.unmodifiableMap(m);
    }

    // ---- the poll at every backward branch of a function's code -------------------------------

    /** Set while any thread is to be stopped or the heap is nearly full: the poll's fast path reads only this. */
    private static volatile boolean alert;
    private static volatile boolean pressure;
    /** One activation: every thread it starts inherits it, so all of them stop at its deadline. */
    private static final class Activation {
        volatile boolean cancelled;
    }

    private static final InheritableThreadLocal<Activation> ACTIVATION = new InheritableThreadLocal<>();
    /** Worker -> its running activation (for the caller that cancels it at the deadline). */
    private static final Map<Thread, Activation> RUNNING = new ConcurrentHashMap<>();
    /** Until then the alert stays on after a cancel: the activation's other threads poll within it. */
    private static volatile long alertUntil;
    /** How long after a deadline the alert stays on for the threads an activation started. */
    private static final long ALERT_NANOS = 30_000_000_000L;
    /** Bytes the calling thread had allocated when its activation began. */
    private static final ThreadLocal<long[]> START = new ThreadLocal<>();
    private static final com.sun.management.ThreadMXBean THREADS =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
    private static final long MAX_HEAP = Runtime.getRuntime().maxMemory();
    /** Under pressure, a function thread that allocated more than this in its activation is stopped. */
    private static volatile long share = MAX_HEAP / 8;

    static {
        // The old generation holds what survived collections: nearly full, it is a function's
        // live data, not garbage. Sampled often, so a function filling the heap is stopped (at its
        // next backward branch) before the runtime's own threads find no memory.
        List<MemoryPoolMXBean> old = ManagementFactory.getMemoryPoolMXBeans().stream()
                .filter(p -> p.getType() == MemoryType.HEAP && p.isCollectionUsageThresholdSupported()
                        && !p.getName().contains("Eden") && !p.getName().contains("Survivor"))
                .toList();
        Thread.ofPlatform().daemon().name("cpuslot-heap-watch").start(() -> {
            while (true) {
                try {
                    Thread.sleep(5);
                    long used = 0, max = 0;
                    for (MemoryPoolMXBean p : old) {
                        MemoryUsage u = p.getUsage();
                        used += u.getUsed();
                        max += u.getMax() > 0 ? u.getMax() : u.getCommitted();
                    }
                    heapUsed(used, max > 0 ? max : MAX_HEAP);
                    if (alert) calm();
                } catch (InterruptedException e) {
                    return;
                } catch (Throwable e) { // an OutOfMemoryError of its own: go on watching
                }
            }
        });
    }

    private static void heapUsed(long used, long max) {
        boolean high = used > max / 10 * 7, low = used < max / 10 * 5;
        if (high && !pressure) {
            pressure = true;
            alert = true;
        } else if (low && pressure) {
            pressure = false;
            calm();
        }
    }

    /** Sets the share of the heap a function thread may allocate in one activation before it is stopped under pressure. */
    public static void setShare(long bytes) { share = bytes; }

    /** The calling (worker) thread starts an activation. */
    public static void begin() {
        Activation a = new Activation();
        ACTIVATION.set(a);
        RUNNING.put(Thread.currentThread(), a);
        START.set(new long[] {THREADS.getCurrentThreadAllocatedBytes()});
    }

    /** The calling (worker) thread ended its activation. */
    public static void end() {
        RUNNING.remove(Thread.currentThread());
        ACTIVATION.remove();
        START.remove();
        calm();
    }

    /** Clears the alert when nothing is pending; a cancel or pressure racing with it sets it again. */
    private static void calm() {
        if (busy()) return;
        alert = false;
        if (busy()) alert = true;
    }

    private static boolean busy() { return pressure || System.nanoTime() - alertUntil < 0; }

    /** The activation on this worker passed its deadline: its code stops at its next backward branch. */
    public static void cancel(Thread worker) {
        Activation a = RUNNING.get(worker);
        if (a == null) return;
        a.cancelled = true;
        alertUntil = System.nanoTime() + ALERT_NANOS;
        alert = true;
    }

    /** Inserted by the guard before every backward branch of a function's code. */
    public static void poll() {
        if (alert) slowPoll();
    }

    private static void slowPoll() {
        Activation a = ACTIVATION.get();
        if (a != null && a.cancelled) throw new Stopped("the activation passed its deadline");
        if (pressure) {
            long[] st = START.get();
            long allocated = THREADS.getCurrentThreadAllocatedBytes() - (st == null ? 0 : st[0]);
            if (allocated > share) {
                throw new OutOfMemoryError("the function allocated " + (allocated >> 20) + " MiB in this activation while the"
                        + " runtime's heap is nearly full (its share: " + (share >> 20) + " MiB)");
            }
        }
    }

    /** Ends a function's code at its deadline (thrown again at every backward branch if it is caught). */
    public static final class Stopped extends Error {
        Stopped(String msg) { super(msg, null, false, false); }
    }

    // ---- reflection on the function's own classes only ---------------------------------------

    /** The function class that called the guard (the rewritten call site). */
    private static Class<?> caller() {
        return WALKER.walk(s -> s.map(StackWalker.StackFrame::getDeclaringClass)
                .filter(c -> c != ActionGuard.class).findFirst().orElse(ActionGuard.class));
    }

    /** Reflection may act only on members of the calling function's own classes. */
    private static void own(Class<?> target, String what) {
        ClassLoader l = caller().getClassLoader();
        if (target == null || target.getClassLoader() != l || !TMP.containsKey(l)) {
            throw new SecurityException(what + " of " + (target == null ? "null" : target.getName())
                    + ": reflection on other than the function's own classes is not allowed to a function in a shared runtime");
        }
    }

    public static Object invoke(Object method, Object target, Object[] args) throws IllegalAccessException, InvocationTargetException {
        Method m = (Method) method;
        own(m.getDeclaringClass(), "Method.invoke");
        return m.invoke(target, args);
    }

    public static Object newInstance(Object constructor, Object[] args)
            throws InstantiationException, IllegalAccessException, InvocationTargetException {
        Constructor<?> c = (Constructor<?>) constructor;
        own(c.getDeclaringClass(), "Constructor.newInstance");
        return c.newInstance(args);
    }

    public static Object newInstance(Object cls) throws InstantiationException, IllegalAccessException {
        Class<?> c = (Class<?>) cls;
        own(c, "Class.newInstance");
        try {
            return c.getDeclaredConstructor().newInstance();
        } catch (NoSuchMethodException e) {
            throw new InstantiationException(c.getName() + " has no constructor without parameters");
        } catch (InvocationTargetException e) {
            throw new IllegalStateException(e.getCause());
        }
    }

    public static void setAccessible(Object member, boolean flag) {
        own(((Member) member).getDeclaringClass(), "setAccessible");
        ((AccessibleObject) member).setAccessible(flag);
    }

    public static boolean trySetAccessible(Object member) {
        own(((Member) member).getDeclaringClass(), "trySetAccessible");
        return ((AccessibleObject) member).trySetAccessible();
    }

    // ---- the function's own temporary directory ----------------------------------------------

    /** Each function's class loader -> its temporary directory (removed with the function). */
    private static final Map<ClassLoader, Path> TMP = new ConcurrentHashMap<>();
    private static final StackWalker WALKER = StackWalker.getInstance(StackWalker.Option.RETAIN_CLASS_REFERENCE);

    /** Gives the function whose classes the loader defines its own temporary directory (null removes it). */
    public static void setTmpdir(ClassLoader function, Path dir) {
        if (dir == null) TMP.remove(function);
        else TMP.put(function, dir);
    }

    /**
     * The calling function's temporary directory: found from the class that made the call (the
     * rewritten call site), so threads the function starts have it too.
     */
    private static Path tmpdir() {
        Class<?> caller = caller();
        Path p = TMP.get(caller.getClassLoader());
        if (p == null) throw new SecurityException("no temporary directory for " + caller.getName());
        return p;
    }

    public static String getProperty(String key) {
        if ("java.io.tmpdir".equals(key)) return tmpdir().toString();
        return System.getProperty(key);
    }

    public static String getProperty(String key, String def) {
        if ("java.io.tmpdir".equals(key)) return tmpdir().toString();
        return System.getProperty(key, def);
    }

    /** A copy: a function cannot change the JVM's properties through it. */
    public static Properties getProperties() {
        Properties p = new Properties();
        p.putAll(System.getProperties());
        p.setProperty("java.io.tmpdir", tmpdir().toString());
        return p;
    }

    public static File createTempFile(String prefix, String suffix) throws IOException {
        return File.createTempFile(prefix, suffix, tmpdir().toFile());
    }

    public static File createTempFile(String prefix, String suffix, File dir) throws IOException {
        return File.createTempFile(prefix, suffix, dir != null ? dir : tmpdir().toFile());
    }

    public static Path createTempFile(String prefix, String suffix, FileAttribute<?>... attrs) throws IOException {
        return Files.createTempFile(tmpdir(), prefix, suffix, attrs);
    }

    public static Path createTempDirectory(String prefix, FileAttribute<?>... attrs) throws IOException {
        return Files.createTempDirectory(tmpdir(), prefix, attrs);
    }
}
