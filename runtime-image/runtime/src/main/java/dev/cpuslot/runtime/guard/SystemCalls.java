package dev.cpuslot.runtime.guard;

import java.util.Collections;
import java.util.HashMap;
import java.util.Map;

/**
 * The process-wide JDK calls a Java function's code makes that a multi-tenant runtime cannot give
 * one tenant ({@link Rewriter} redirects them here): {@code System.exit}, {@code Runtime.exit},
 * {@code Runtime.halt} throw a SecurityException (as a SecurityManager used to); {@code System.gc}
 * does nothing; {@code System.getenv} sees the activation's {@code __OW_*} and /init environment on
 * top of the process's, as the OpenWhisk Java runtime provides them. Its own class so that the
 * environment (the one state here, per thread) is set and read in one place.
 */
public final class SystemCalls {
    private SystemCalls() {}

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

    // Runtime.exit/halt: the rewritten call passes its receiver as an Object (as Runtime.gc())
    public static void exit(Object runtime, int status) {
        throw new SecurityException("Runtime.exit(" + status + ") called by the action: not allowed in a shared runtime");
    }

    public static void halt(Object runtime, int status) {
        throw new SecurityException("Runtime.halt(" + status + ") called by the action: not allowed in a shared runtime");
    }

    /**
     * {@code System.gc()} of a function: nothing. A collection of the shared heap would stop every
     * tenant's threads (a storm of them took a bystander's hello from a few ms to hundreds); the
     * JVM collects when it needs to.
     */
    public static void gc() {}

    public static void gc(Object runtime) {} // Runtime.gc(): the rewritten call passes its receiver as an Object

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
}
