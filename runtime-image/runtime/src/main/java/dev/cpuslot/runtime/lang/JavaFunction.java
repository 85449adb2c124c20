package dev.cpuslot.runtime.lang;

import dev.cpuslot.runtime.guard.Activations;
import dev.cpuslot.runtime.guard.FileAccess;
import dev.cpuslot.runtime.guard.HeapShare;
import com.google.gson.JsonElement;
import com.google.gson.JsonParser;

import dev.cpuslot.runtime.guard.Rewriter;
import dev.cpuslot.runtime.guard.SystemCalls;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLConnection;
import java.net.URLStreamHandler;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Collections;
import java.util.Enumeration;
import java.util.HashMap;
import java.util.zip.ZipEntry;
import java.util.zip.ZipInputStream;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.net.URL;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.exec.Function;

/**
 * A Java function from a jar, in a class loader of its own (its statics are its own; other
 * functions cannot see them). The loader sees the JDK, the guard's entry points its rewritten
 * code calls, and nothing else of the runtime: Gson ({@code com.google.gson}, OpenWhisk's
 * {@code JsonObject}) and the chain API are defined again in each function's loader from the
 * runtime's class files (a trusted runtime's jar may ship its own), guarded as the function's own code, and
 * arguments, results and chain calls cross as JSON text ({@link dev.cpuslot.chain.Boundary}).
 *
 * Entry points, in the order looked up (class from {@code main}, method after {@code #},
 * default {@code main}):
 * <ul>
 * <li>{@code public static JsonObject main(JsonObject args)} (OpenWhisk Java convention)</li>
 * <li>{@code public static JsonObject main(JsonObject args, Map<String,String> env)}</li>
 * <li>{@code public static Map<String,Object> main(Map<String,Object> args)} (Graalvisor/Hydra)</li>
 * <li>{@code public static Map<String,Object> main(Map<String,Object> args, Map<String,String> env)}</li>
 * </ul>
 * The JVM cannot give each invocation its own process environment, so the {@code __OW_*} values
 * reach a Java function through the two-argument forms (and {@link #currentEnv()}).
 */
public final class JavaFunction implements Function {
    /** The running invocation's environment, for code that cannot take a second parameter. */
    public static Map<String, String> currentEnv() {
        Map<String, String> m = SystemCalls.env();
        return m == null ? Map.of() : m;
    }

    private enum Kind { JSON, JSON_ENV, ARRAY, MAP, MAP_ENV }

    private final String name;
    private final Map<String, String> initEnv;
    private final ActionLoader loader;
    private final Path tmpdir;
    private final MethodHandle handle;
    private final Kind kind;
    /** The function's own copy of {@link dev.cpuslot.chain.Boundary}: tree, map, text, bind. */
    private final MethodHandle tree, map, text, bind;

    public JavaFunction(String name, byte[] jarBytes, String main, Map<String, String> initEnv) throws Exception {
        this(name, jarBytes, main, initEnv, false);
    }

    /**
     * @param trusted the guard rewrites but refuses nothing (CPUSLOT_JAVA_TRUSTED: a runtime for
     *                trusted code only)
     */
    public JavaFunction(String name, byte[] jarBytes, String main, Map<String, String> initEnv, boolean trusted) throws Exception {
        this.name = name;
        this.initEnv = Map.copyOf(initEnv);
        String cls = main, method = "main";
        int hash = main.indexOf('#');
        if (hash >= 0) {
            cls = main.substring(0, hash);
            method = main.substring(hash + 1);
        }
        // the jar stays in memory: no file another function could read
        Map<String, byte[]> entries = unzip(jarBytes);
        if (!trusted) {
            // the jar's copy of a library is set aside for the runtime's, as OpenWhisk's Java runtime
            // (its loader asks its parent first) does: Gson reflects on fields, which the function's
            // own code may not, and a function's copy of the boundary is not the boundary
            entries.keySet().removeIf(JavaFunction::isLibrary);
            for (Map.Entry<String, byte[]> e : entries.entrySet()) {
                if (!e.getKey().endsWith(".class") || e.getKey().startsWith("META-INF/")) continue;
                String why;
                try {
                    why = Rewriter.refusal(e.getValue(), entries::get);
                } catch (IllegalArgumentException bad) {
                    why = e.getKey() + " is not a class file: " + bad.getMessage();
                }
                if (why != null) {
                    System.err.println(why);
                    throw new InitError(ERR_PREFIX + "java.lang.SecurityException: " + why, null);
                }
            }
        }
        // its own temporary directory (java.io.tmpdir, createTempFile), removed with it
        tmpdir = Files.createTempDirectory("cpuslot-fn-", PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rwx------")));
        loader = new ActionLoader("fn:" + name, entries, trusted, new SharedParent(JavaFunction.class.getClassLoader()));
        MethodHandle[] b;
        try {
            b = boundary(loader);
        } catch (ReflectiveOperationException | LinkageError e) {
            close();
            throw new InitError(ERR_PREFIX + "the function API cannot be loaded: " + e, e);
        }
        tree = b[0];
        map = b[1];
        text = b[2];
        bind = b[3];
        FileAccess.setTmpdir(loader, tmpdir);
        if (method.isEmpty()) method = "main";
        Class<?> c;
        // static initialisers run now, as an activation of the function's (their loops stop at the
        // load's deadline, the threads they start end with the load), and see the /init
        // environment through System.getenv
        Thread self = Thread.currentThread();
        ClassLoader prev = self.getContextClassLoader();
        self.setContextClassLoader(loader);
        SystemCalls.setEnv(this.initEnv);
        Activations.begin(loader);
        try {
            // in the function's slot from here (a slot refused when the runtime fails closed: an init error)
            dev.cpuslot.runtime.exec.Load.onCancel(() -> Activations.cancel(self));
            c = Class.forName(cls, true, loader);
        } catch (ClassNotFoundException | LinkageError | SecurityException | Activations.Stopped e) {
            close();
            ClassNotFoundException cnf = e instanceof ClassNotFoundException x ? x : new ClassNotFoundException(cls, e);
            cnf.printStackTrace(System.err);
            throw new InitError(ERR_PREFIX + cnf, cnf);
        } finally {
            Activations.end();
            SystemCalls.setEnv(null);
            self.setContextClassLoader(prev);
        }
        Kind k = null;
        Method m = null;
        // the function's own Gson types (its copy, or the one its jar ships)
        Class<?> fnObject, fnArray;
        try {
            fnObject = Class.forName("com.google.gson.JsonObject", false, loader);
            fnArray = Class.forName("com.google.gson.JsonArray", false, loader);
        } catch (ClassNotFoundException | LinkageError e) {
            close();
            throw new InitError(ERR_PREFIX + "the function API cannot be loaded: " + e, e);
        }
        for (Kind cand : Kind.values()) {
            Class<?>[] params = switch (cand) {
                case JSON -> new Class<?>[]{fnObject};
                case JSON_ENV -> new Class<?>[]{fnObject, Map.class};
                case ARRAY -> new Class<?>[]{fnArray};
                case MAP -> new Class<?>[]{Map.class};
                case MAP_ENV -> new Class<?>[]{Map.class, Map.class};
            };
            try {
                Method mm = c.getMethod(method, params);
                if (Modifier.isStatic(mm.getModifiers())) {
                    k = cand;
                    m = mm;
                    break;
                }
            } catch (NoSuchMethodException ignored) {
            }
        }
        if (m == null) {
            close();
            // the OpenWhisk Java runtime's text: the JsonObject signature it looked for
            NoSuchMethodException e = new NoSuchMethodException(cls + "." + method + "(com.google.gson.JsonObject)");
            e.printStackTrace(System.err);
            throw new InitError(ERR_PREFIX + e, e);
        }
        kind = k;
        handle = MethodHandles.publicLookup().unreflect(m).asType(
                MethodType.methodType(Object.class, m.getParameterTypes().length == 1
                        ? new Class<?>[]{Object.class} : new Class<?>[]{Object.class, Object.class}));
        // the boundary's first use here, at /init or /register, not in the first call: its reader,
        // writer and chain binding are classes the function's loader defines, links and runs in the
        // interpreter the first time (none of the function's code runs)
        try {
            Object empty = k == Kind.MAP || k == Kind.MAP_ENV ? map.invoke("{}") : tree.invoke(k == Kind.ARRAY ? "[]" : "{}");
            text.invoke(empty);
            bind.invoke((java.util.function.Function<String[], String[]>) JavaFunction::chain);
            bind.invoke((Object) null);
        } catch (Throwable e) {
            close();
            throw new InitError(ERR_PREFIX + "the function API cannot be loaded: " + e, e);
        }
    }

    @Override public String name() { return name; }
    @Override public String language() { return "java"; }
    @Override public Map<String, String> initEnv() { return initEnv; }

    @Override
    public Sandbox newSandbox() {
        return new Sandbox() {
            @Override
            public JsonElement invoke(JsonElement args, Map<String, String> env) throws Exception {
                Thread t = Thread.currentThread();
                ClassLoader prev = t.getContextClassLoader();
                t.setContextClassLoader(loader);
                SystemCalls.setEnv(env);
                Activations.begin(loader);
                boolean bound = false;
                try {
                    HeapShare.check(); // a function over its share of a nearly full heap fails here
                    // JSON as text both ways: the function's objects are of its own Gson
                    String in = kind == Kind.ARRAY ? (args != null && args.isJsonArray() ? args.toString() : "[]")
                            : args != null && args.isJsonObject() ? args.toString() : "{}";
                    Object fnArgs = kind == Kind.MAP || kind == Kind.MAP_ENV ? map.invoke(in) : tree.invoke(in);
                    bind.invoke((java.util.function.Function<String[], String[]>) JavaFunction::chain);
                    bound = true;
                    Object out = switch (kind) {
                        case JSON, ARRAY, MAP -> handle.invoke(fnArgs);
                        case JSON_ENV, MAP_ENV -> handle.invoke(fnArgs, (Object) env);
                    };
                    if (out == null) {
                        System.err.println("The action returned null");
                        throw new Function.FunctionError("The action returned null", null);
                    }
                    return JsonParser.parseString((String) text.invoke(out));
                } catch (Function.FunctionError e) {
                    throw e;
                } catch (OutOfMemoryError e) {
                    // the function's own: its objects are unreachable once its frames are gone,
                    // so the runtime and the other functions go on; only this activation fails
                    throw new Function.FunctionError(e.toString(), null);
                } catch (Exception | Error e) {
                    if (e instanceof InvocationTargetException ite && ite.getCause() != null) throw new Function.FunctionError(String.valueOf(ite.getCause()), ite.getCause());
                    if (e instanceof VirtualMachineError vme && !(e instanceof StackOverflowError)) throw vme;
                    throw new Function.FunctionError(e.toString(), e);
                } catch (Throwable th) {
                    throw new Function.FunctionError(th.toString(), th);
                } finally {
                    if (bound) {
                        try {
                            bind.invoke((Object) null);
                        } catch (Throwable ignored) { // its own copy's ThreadLocal: nothing else to undo
                        }
                    }
                    Activations.end();
                    SystemCalls.setEnv(null);
                    t.setContextClassLoader(prev);
                }
            }

            @Override
            public void cancel(Thread worker) {
                Activations.cancel(worker); // its loops stop at their next backward branch
                worker.interrupt();
            }

            @Override
            public void close() {}
        };
    }

    /** The function's copy of Boundary's tree, map, text and bind. */
    private static MethodHandle[] boundary(ClassLoader loader) throws ReflectiveOperationException {
        Class<?> b = Class.forName("dev.cpuslot.chain.Boundary", true, loader);
        MethodHandles.Lookup l = MethodHandles.publicLookup();
        MethodType fromText = MethodType.methodType(Object.class, String.class);
        return new MethodHandle[]{
                l.findStatic(b, "tree", fromText), l.findStatic(b, "map", fromText),
                l.findStatic(b, "text", MethodType.methodType(String.class, Object.class)),
                l.findStatic(b, "bind", MethodType.methodType(void.class, java.util.function.Function.class))};
    }

    /** A Java function's chain call, as text ({@link dev.cpuslot.chain.Boundary#bind}), on the runtime's chain of this thread. */
    private static String[] chain(String[] req) {
        try {
            JsonElement a = JsonParser.parseString(req[2]);
            if (req[0].equals("async")) {
                dev.cpuslot.chain.Chain.callAsync(req[1], a);
                return new String[]{null, null};
            }
            JsonElement r = dev.cpuslot.chain.Chain.call(req[1], a);
            return new String[]{null, r == null ? "null" : r.toString()};
        } catch (dev.cpuslot.chain.ChainException e) {
            return new String[]{e.kind().name(), e.detail()};
        } catch (RuntimeException e) {
            return new String[]{dev.cpuslot.chain.ChainException.Kind.NO_CONTEXT.name(), "bad arguments: " + e.getMessage()};
        }
    }

    @Override
    public void close() {
        if (loader != null) {
            FileAccess.setTmpdir(loader, null);
            loader.close();
        }
        deleteTree(tmpdir);
    }

    private static void deleteTree(Path root) {
        if (root == null) return;
        try (var w = Files.walk(root)) {
            for (Path p : w.sorted(java.util.Comparator.reverseOrder()).toList()) Files.deleteIfExists(p);
        } catch (IOException | RuntimeException e) {
            Log.warn("could not remove a function's temporary directory " + root + ": " + e);
        }
    }

    private static Map<String, byte[]> unzip(byte[] jar) throws IOException {
        Map<String, byte[]> m = new HashMap<>();
        try (ZipInputStream z = new ZipInputStream(new ByteArrayInputStream(jar))) {
            for (ZipEntry e; (e = z.getNextEntry()) != null; ) {
                if (!e.isDirectory()) m.putIfAbsent(e.getName(), z.readAllBytes());
            }
        } catch (IOException | IllegalArgumentException e) {
            throw new InitError(ERR_PREFIX + "the jar cannot be read: " + e, e);
        }
        return m;
    }

    static final String ERR_PREFIX = "An error has occurred (see logs for details): ";

    /** An /init error whose message is the reply's error text. */
    static final class InitError extends IllegalArgumentException {
        InitError(String msg, Throwable cause) { super(msg, cause); }
    }

    /**
     * Loads an action's classes from its jar's bytes with the guard applied ({@link Rewriter}):
     * System.exit cannot end the shared runtime, System.getenv sees the activation's environment,
     * and (unless trusted) a class that reaches past the function is refused.
     */
    static final class ActionLoader extends ClassLoader {
        static { registerAsParallelCapable(); }

        private volatile Map<String, byte[]> entries;
        private final boolean trusted;
        private final URLStreamHandler handler = new URLStreamHandler() {
            @Override
            protected URLConnection openConnection(URL u) throws IOException {
                String path = URI.create(u.toExternalForm()).getPath();
                byte[] b = path == null || path.isEmpty() ? null : entry(path.substring(1));
                if (b == null) throw new java.io.FileNotFoundException(u.toString());
                return new URLConnection(u) {
                    @Override public void connect() {}
                    @Override public InputStream getInputStream() { return new ByteArrayInputStream(b); }
                    @Override public long getContentLengthLong() { return b.length; }
                };
            }
        };

        /**
         * The jar ships none of the libraries' packages: every class a library class names is the
         * runtime's or the JDK's, so its rewrite is the same in every such loader and is shared
         * ({@link #rewrittenLibrary}).
         */
        private final boolean plainLibraries;
        /** The libraries the jar ships (a trusted runtime's): theirs whole, none of the runtime's classes mixed in. */
        private final List<String> shipped;

        ActionLoader(String name, Map<String, byte[]> entries, boolean trusted, ClassLoader parent) {
            super(name, parent);
            this.entries = entries;
            this.trusted = trusted;
            this.shipped = LIBRARIES.stream().filter(l -> entries.keySet().stream().anyMatch(f -> f.startsWith(l))).toList();
            this.plainLibraries = shipped.isEmpty();
        }

        private byte[] entry(String name) {
            Map<String, byte[]> m = entries;
            if (m == null) return null;
            byte[] b = m.get(name);
            return b != null || shipped.stream().anyMatch(name::startsWith) ? b : library(name);
        }

        @Override
        protected Class<?> findClass(String name) throws ClassNotFoundException {
            String file = name.replace('.', '/') + ".class";
            Map<String, byte[]> m = entries;
            boolean own = m != null && m.containsKey(file); // else a copy of the runtime's library
            byte[] b = entry(file);
            if (b == null) throw new ClassNotFoundException(name);
            try {
                b = !own && plainLibraries ? rewrittenLibrary(file, b, this, trusted)
                        : Rewriter.rewrite(b, this, trusted, !trusted && own, this::entry);
            } catch (Rewriter.Refused e) {
                throw e;
            } catch (RuntimeException e) {
                throw new ClassNotFoundException(name + " (cannot be prepared: " + e + ")", e);
            }
            int dot = name.lastIndexOf('.');
            if (dot > 0) {
                String pkg = name.substring(0, dot);
                if (getDefinedPackage(pkg) == null) {
                    try {
                        definePackage(pkg, null, null, null, null, null, null, null);
                    } catch (IllegalArgumentException ignored) { // defined concurrently
                    }
                }
            }
            return defineClass(name, b, 0, b.length, (java.security.ProtectionDomain) null);
        }

        @Override
        protected URL findResource(String name) {
            if (entry(name) == null) return null;
            try {
                // an opaque URL of this loader's entry: no file behind it
                return URL.of(new URI("cpuslot-fn", null, "/" + name, null), handler);
            } catch (URISyntaxException | java.net.MalformedURLException e) {
                return null;
            }
        }

        @Override
        protected Enumeration<URL> findResources(String name) {
            URL u = findResource(name);
            return Collections.enumeration(u == null ? List.of() : List.of(u));
        }

        void close() { entries = null; }
    }

    /** What every function gets its own copy of, from the runtime's class files: Gson and the function API. */
    private static final List<String> LIBRARIES = List.of("com/google/gson/", "dev/cpuslot/chain/");
    private static final Map<String, byte[]> LIBRARY_BYTES = new java.util.concurrent.ConcurrentHashMap<>();

    /**
     * Library class files as the guard rewrites them for a function's loader, by trust: each new
     * function defines the library classes it uses again, and rewriting them took more than half
     * of a serving runtime's first call of a new Java function (9 of 17 ms). Each function still
     * defines its own classes from these bytes, which nothing writes to, and the JVM verifies
     * them in each loader.
     */
    private static final Map<String, byte[]> REWRITTEN = new java.util.concurrent.ConcurrentHashMap<>(),
            REWRITTEN_TRUSTED = new java.util.concurrent.ConcurrentHashMap<>();

    /** {@code file}'s bytes {@code b}, a library class, rewritten for {@code loader} (one that ships no library class). */
    static byte[] rewrittenLibrary(String file, byte[] b, ActionLoader loader, boolean trusted) {
        Map<String, byte[]> cache = trusted ? REWRITTEN_TRUSTED : REWRITTEN;
        byte[] r = cache.get(file);
        if (r == null) {
            // outside the map's lock: a rewrite reads other class files through the loader
            r = Rewriter.rewrite(b, loader, trusted, false, loader::entry);
            byte[] raced = cache.putIfAbsent(file, r);
            if (raced != null) r = raced;
        }
        return r;
    }

    private static boolean isLibrary(String file) {
        return LIBRARIES.stream().anyMatch(file::startsWith);
    }

    /** A class file of a library every function gets a copy of, or null. */
    static byte[] library(String file) {
        if (!file.endsWith(".class") || !isLibrary(file)) return null;
        return LIBRARY_BYTES.computeIfAbsent(file, f -> {
            try (InputStream in = JavaFunction.class.getClassLoader().getResourceAsStream(f)) {
                return in == null ? null : in.readAllBytes();
            } catch (IOException e) {
                return null;
            }
        });
    }

    /**
     * Parent of every function class loader: the JDK and the guard's entry points that the
     * rewritten code calls (a function cannot name them: the guard refuses the runtime's package,
     * and its reflection acts on its own classes), nothing else.
     */
    static final class SharedParent extends ClassLoader {
        private static final List<String> SHARED = List.of("dev.cpuslot.runtime.guard.");
        private final ClassLoader runtime;

        SharedParent(ClassLoader runtime) {
            super("cpuslot-shared", ClassLoader.getPlatformClassLoader());
            this.runtime = runtime;
        }

        @Override
        protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
            for (String p : SHARED) if (name.startsWith(p)) return runtime.loadClass(name);
            return super.loadClass(name, resolve);
        }

        @Override
        public URL getResource(String name) {
            if (name.startsWith("dev/cpuslot/runtime/guard/")) return runtime.getResource(name);
            return super.getResource(name);
        }
    }
}
