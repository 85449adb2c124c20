package dev.cpuslot.runtime.guard;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileAttribute;
import java.util.Collections;
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
        Class<?> caller = WALKER.walk(s -> s.map(StackWalker.StackFrame::getDeclaringClass)
                .filter(c -> c != ActionGuard.class).findFirst().orElse(ActionGuard.class));
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
