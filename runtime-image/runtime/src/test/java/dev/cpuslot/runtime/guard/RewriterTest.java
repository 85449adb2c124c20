package dev.cpuslot.runtime.guard;

import org.junit.jupiter.api.Test;

import java.lang.constant.ClassDesc;
import java.lang.constant.MethodTypeDesc;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;

class RewriterTest {
    /**
     * Every call the guard rewrites lands on a method of its guard class, of the type the rewrite emits
     * (the call's, a virtual call's receiver first as an Object): a missing one is a
     * NoSuchMethodError in the function instead of the guard's answer. (Before: Runtime.exit and
     * Runtime.halt were rewritten to methods taking a Runtime, and failed so.)
     */
    @Test
    void everyRewrittenCallHasItsGuardMethod() throws Exception {
        List<String> missing = new ArrayList<>();
        MethodHandles.Lookup lookup = MethodHandles.publicLookup();
        for (Rewriter.Redirect r : Rewriter.REDIRECTS.values()) {
            MethodTypeDesc t = MethodTypeDesc.ofDescriptor(r.type());
            if (r.virtual()) t = t.insertParameterTypes(0, ClassDesc.of("java.lang.Object"));
            MethodType mt = (MethodType) t.resolveConstantDesc(lookup);
            try {
                lookup.findStatic(r.guard(), r.name(), mt);
            } catch (NoSuchMethodException | IllegalAccessException e) {
                missing.add(r.owner() + "." + r.name() + r.type() + " -> " + r.guard().getSimpleName() + "." + r.name() + mt);
            }
        }
        assertEquals(List.of(), missing, "rewritten calls without their guard method");
    }

    /** A function's code that makes every kind of call the guard rewrites to its classes (a module of its own when rewritten). */
    public static final class Calls {
        public static String run() throws Exception {
            long sum = 0;
            for (int i = 0; i < 3; i++) sum += i; // the poll at the backward branch: Activations
            try (var in = new java.io.FileInputStream(new java.io.File("/dev/null"))) { // the path check: FileAccess
                sum += in.read();
            }
            long[] a = {1, 2, 3};
            java.util.Arrays.parallelPrefix(a, Long::sum); // CommonPool
            sum += new Four().fork().join(); // CommonPool.fork
            sum += java.util.concurrent.CompletableFuture.supplyAsync(() -> 5L).get(); // CommonPool.executor
            System.gc(); // SystemCalls
            Thread t = thread();
            t.start(); // the mark of a start: Activations.starting
            t.join();
            return sum + ":" + a[2] + ":" + (System.getenv("PATH") != null);
        }

        /** A thread handed out (as a factory does): its return is marked too. */
        public static Thread thread() { return new Thread(() -> { }); }

        /** Public: the rewritten class is in a loader of its own, a package of its own. */
        public static final class Four extends java.util.concurrent.RecursiveTask<Long> {
            @Override
            protected Long compute() { return 4L; }
        }
    }

    /**
     * A class rewritten by the guard runs: every call the rewrite emits (the poll, the path check,
     * the common pool's replacements, the redirects) resolves to a method of the guard class it
     * names, where a wrong class or name is a NoSuchMethodError in the function.
     */
    @Test
    void rewrittenCallsResolveToTheGuardsClasses() throws Exception {
        String name = Calls.class.getName();
        ClassLoader parent = RewriterTest.class.getClassLoader();
        byte[] bytes;
        try (var in = parent.getResourceAsStream(name.replace('.', '/') + ".class")) {
            bytes = in.readAllBytes();
        }
        byte[] rewritten = Rewriter.rewrite(bytes, parent, false, false, n -> null);
        // every kind of rewrite is there (each a call into the guard): a rewrite that dropped one would pass below
        java.util.Set<String> guardCalls = new java.util.TreeSet<>();
        for (var e : java.lang.classfile.ClassFile.of().parse(rewritten).constantPool()) {
            if (e instanceof java.lang.classfile.constantpool.MemberRefEntry m && m.owner().asInternalName().startsWith("dev/cpuslot/runtime/guard/")) {
                guardCalls.add(m.owner().asInternalName().substring("dev/cpuslot/runtime/guard/".length()) + "." + m.name().stringValue());
            }
        }
        for (String c : List.of("Activations.poll", "Activations.starting", "FileAccess.path", "SystemCalls.gc", "SystemCalls.getenv")) {
            org.junit.jupiter.api.Assertions.assertTrue(guardCalls.stream().anyMatch(g -> g.startsWith(c)), c + " not among " + guardCalls);
        }
        ClassLoader function = new ClassLoader(parent) {
            @Override
            protected Class<?> loadClass(String n, boolean resolve) throws ClassNotFoundException {
                if (!n.equals(name)) return super.loadClass(n, resolve);
                synchronized (getClassLoadingLock(n)) {
                    Class<?> c = findLoadedClass(n);
                    return c != null ? c : defineClass(n, rewritten, 0, rewritten.length);
                }
            }
        };
        Class<?> c = Class.forName(name, true, function);
        assertEquals("11:6:true", c.getMethod("run").invoke(null));
    }
}
