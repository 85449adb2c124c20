package dev.cpuslot.runtime;

import com.google.gson.Gson;
import com.google.gson.JsonArray;
import dev.cpuslot.runtime.guard.ActionGuard;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;

import java.io.IOException;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A Java function from a jar, in a class loader of its own (its statics are its own; other
 * functions cannot see them). Gson ({@code com.google.gson}) is shared with the runtime so that
 * OpenWhisk-style actions exchange {@code JsonObject}s without bundling Gson.
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
    private static final Gson GSON = new com.google.gson.GsonBuilder()
            .setObjectToNumberStrategy(com.google.gson.ToNumberPolicy.LONG_OR_DOUBLE).serializeNulls().create();
    /** The running invocation's environment, for code that cannot take a second parameter. */
    public static Map<String, String> currentEnv() {
        Map<String, String> m = ActionGuard.env();
        return m == null ? Map.of() : m;
    }

    private enum Kind { JSON, JSON_ENV, ARRAY, MAP, MAP_ENV }

    private final String name;
    private final Map<String, String> initEnv;
    private final URLClassLoader loader;
    private final Path jar;
    private final MethodHandle handle;
    private final Kind kind;

    public JavaFunction(String name, byte[] jarBytes, String main, Map<String, String> initEnv) throws Exception {
        this.name = name;
        this.initEnv = Map.copyOf(initEnv);
        String cls = main, method = "main";
        int hash = main.indexOf('#');
        if (hash >= 0) {
            cls = main.substring(0, hash);
            method = main.substring(hash + 1);
        }
        jar = Files.createTempFile("cpuslot-fn-", ".jar");
        Files.write(jar, jarBytes);
        loader = new ActionLoader("fn:" + name, new URL[]{jar.toUri().toURL()}, new SharedParent(JavaFunction.class.getClassLoader()));
        if (method.isEmpty()) method = "main";
        Class<?> c;
        // static initialisers run now and see the /init environment through System.getenv
        ActionGuard.setEnv(this.initEnv);
        try {
            c = Class.forName(cls, true, loader);
        } catch (ClassNotFoundException | LinkageError | SecurityException e) {
            close();
            ClassNotFoundException cnf = e instanceof ClassNotFoundException x ? x : new ClassNotFoundException(cls, e);
            cnf.printStackTrace(System.err);
            throw new InitError(ERR_PREFIX + cnf, cnf);
        } finally {
            ActionGuard.setEnv(null);
        }
        Kind k = null;
        Method m = null;
        for (Kind cand : Kind.values()) {
            Class<?>[] params = switch (cand) {
                case JSON -> new Class<?>[]{JsonObject.class};
                case JSON_ENV -> new Class<?>[]{JsonObject.class, Map.class};
                case ARRAY -> new Class<?>[]{JsonArray.class};
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
                ActionGuard.setEnv(env);
                try {
                    JsonObject in = args != null && args.isJsonObject() ? args.getAsJsonObject() : new JsonObject();
                    Object out = switch (kind) {
                        case JSON -> handle.invoke((Object) in.deepCopy());
                        case JSON_ENV -> handle.invoke((Object) in.deepCopy(), (Object) env);
                        case ARRAY -> handle.invoke((Object) (args != null && args.isJsonArray() ? args.getAsJsonArray().deepCopy() : new JsonArray()));
                        case MAP -> handle.invoke((Object) toMap(in));
                        case MAP_ENV -> handle.invoke((Object) toMap(in), (Object) env);
                    };
                    if (out == null) {
                        System.err.println("The action returned null");
                        throw new Function.FunctionError("The action returned null", null);
                    }
                    return toJson(out);
                } catch (Function.FunctionError e) {
                    throw e;
                } catch (Exception | Error e) {
                    if (e instanceof InvocationTargetException ite && ite.getCause() != null) throw new Function.FunctionError(String.valueOf(ite.getCause()), ite.getCause());
                    if (e instanceof VirtualMachineError vme && !(e instanceof StackOverflowError)) throw vme;
                    throw new Function.FunctionError(e.toString(), e);
                } catch (Throwable th) {
                    throw new Function.FunctionError(th.toString(), th);
                } finally {
                    ActionGuard.setEnv(null);
                    t.setContextClassLoader(prev);
                }
            }

            @Override
            public void cancel(Thread worker) { worker.interrupt(); }

            @Override
            public void close() {}
        };
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> toMap(JsonObject o) {
        return (Map<String, Object>) GSON.fromJson(o, LinkedHashMap.class);
    }

    static JsonElement toJson(Object out) {
        if (out == null) return null;
        if (out instanceof JsonElement je) return je;
        // Map/List results (Hydra style): serialise through Gson's tree writer
        return JsonParser.parseString(GSON.toJson(out));
    }

    @Override
    public void close() {
        try {
            loader.close();
        } catch (IOException | RuntimeException ignored) {
        }
        try {
            Files.deleteIfExists(jar);
        } catch (IOException ignored) {
        }
    }

    static final String ERR_PREFIX = "An error has occurred (see logs for details): ";

    /** An /init error whose message is the reply's error text. */
    static final class InitError extends IllegalArgumentException {
        InitError(String msg, Throwable cause) { super(msg, cause); }
    }

    /**
     * Loads an action's classes from its jar with the guarded calls rewritten ({@link ActionGuard}):
     * System.exit cannot end the shared runtime, System.getenv sees the activation's environment.
     */
    static final class ActionLoader extends URLClassLoader {
        static { registerAsParallelCapable(); }

        ActionLoader(String name, URL[] urls, ClassLoader parent) { super(name, urls, parent); }

        @Override
        protected Class<?> findClass(String name) throws ClassNotFoundException {
            String path = name.replace('.', '/') + ".class";
            URL u = findResource(path);
            if (u == null) throw new ClassNotFoundException(name);
            byte[] b;
            try (var in = u.openStream()) {
                b = in.readAllBytes();
            } catch (IOException e) {
                throw new ClassNotFoundException(name, e);
            }
            try {
                b = ActionGuard.rewrite(b, this);
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
            return defineClass(name, b, 0, b.length, (java.security.CodeSource) null);
        }
    }

    /** Parent of every function class loader: the JDK, Gson and the action guard from the runtime, nothing else. */
    static final class SharedParent extends ClassLoader {
        private static final List<String> SHARED = List.of("com.google.gson.", "dev.cpuslot.runtime.guard.");
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
            if (name.startsWith("com/google/gson/") || name.startsWith("dev/cpuslot/runtime/guard/")) return runtime.getResource(name);
            return super.getResource(name);
        }
    }
}
