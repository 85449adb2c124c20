package dev.cpuslot.runtime.guard;

import java.lang.classfile.ClassFile;
import java.lang.classfile.ClassHierarchyResolver;
import java.lang.classfile.ClassModel;
import java.lang.classfile.CodeBuilder;
import java.lang.classfile.CodeElement;
import java.lang.classfile.CodeTransform;
import java.lang.classfile.MethodModel;
import java.lang.classfile.MethodTransform;
import java.lang.classfile.Label;
import java.lang.classfile.instruction.BranchInstruction;
import java.lang.classfile.instruction.LabelTarget;
import java.lang.classfile.instruction.ReturnInstruction;
import java.lang.classfile.instruction.LookupSwitchInstruction;
import java.lang.classfile.instruction.TableSwitchInstruction;
import java.lang.constant.ConstantDescs;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.lang.classfile.Opcode;
import java.lang.classfile.constantpool.ClassEntry;
import java.lang.classfile.constantpool.InvokeDynamicEntry;
import java.lang.classfile.constantpool.MethodTypeEntry;
import java.lang.classfile.constantpool.MemberRefEntry;
import java.lang.classfile.constantpool.MethodHandleEntry;
import java.lang.classfile.constantpool.PoolEntry;
import java.lang.classfile.instruction.InvokeInstruction;
import java.lang.constant.ClassDesc;
import java.lang.constant.MethodTypeDesc;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The load-time guard on a Java function's bytecode. Every class loaded from a function's jar is
 * first checked, then rewritten:
 * <ul>
 * <li><b>Refused</b> (the jar is rejected at /init, naming class and member): any reference to a
 * member that could end the runtime or reach past the function: reflection on fields, method
 * handles and their lookups
 * ({@code java.lang.invoke} but the bootstraps javac emits for lambdas and string concatenation),
 * {@code sun.*}, {@code jdk.internal.*}, {@code com.sun.*} (so {@code sun.misc.Unsafe}), the
 * foreign-function API and {@code System/Runtime.load*}, process start and process handles, class
 * loaders of its own, the JVM-wide defaults (standard streams, system properties, default time
 * zone, locale, uncaught-exception handler, network and security defaults, shutdown hooks), other
 * threads ({@code Thread.getAllStackTraces}, {@code enumerate}), threads that would not end with
 * their activation (virtual threads, {@code Cleaner}s), management, JFR, scripting, JNDI,
 * {@code java.beans} (reflective calls by name), Java deserialization and XSLT (code the guard
 * never saw), and the runtime's own classes. A method handle
 * constant to a rewritten member is refused too.</li>
 * <li><b>Rewritten</b> to the guard's classes: {@code Method.invoke}, {@code Constructor/Class.newInstance},
 * {@code setAccessible} (allowed on the function's own classes only: {@link OwnReflection}), {@code System.exit},
 * {@code Runtime.exit/halt} (a SecurityException), {@code System.gc}, {@code Runtime.gc} (nothing), {@code System.getenv}
 * (the activation's environment: {@link SystemCalls}), {@code System.getProperty/getProperties} and the temporary-file
 * calls (the function's own temporary directory: {@link FileAccess}), {@code setAttribute/setProperty} of the JDK's
 * XML parsers (no {@code accessExternal*} value but {@code ""}: {@link XmlParsers}); a check of every file path
 * before the JDK call that names it ({@link FilePaths}, {@link FileAccess}); the poll at every backward branch
 * ({@link Activations#poll}); the mark of every {@code start()} call and every thread a method returns
 * ({@link Activations#starting}: a thread made by an activation that has ended stops when started).</li>
 * <li><b>Kept off the common ForkJoinPool</b> (its threads belong to no activation: {@link ParallelCalls}):
 * parallel streams and {@code Arrays.parallel*} run sequentially, {@code CompletableFuture.*Async}
 * gets an executor of the activation's threads.</li>
 * </ul>
 * Reflection by name cannot be told apart at load time, so it is checked when it acts; a runtime
 * that hosts only trusted code may turn the refusals and that check off (CPUSLOT_JAVA_TRUSTED,
 * runtime-image/README.md).
 */
public final class Rewriter {
    private Rewriter() {}

    /** A class refused by the guard: the reply's error names why. */
    public static final class Refused extends SecurityException {
        public Refused(String msg) { super(msg); }
    }

    static final String NOT_ALLOWED = "not allowed to a function in a shared runtime";

    /** Packages no function may reference (class or member). */
    private static final List<String> DENIED_PACKAGES = List.of(
            "sun/", "jdk/internal/", "com/sun/", "jdk/jfr/", "jdk/jshell/", "java/lang/foreign/", "java/lang/instrument/",
            "java/lang/management/", "javax/management/", "java/beans/", "javax/script/", "javax/naming/", "java/rmi/",
            "javax/tools/", "dev/cpuslot/runtime/",
            // file systems below the paths a function names (a provider opens any path unchecked)
            "java/nio/file/spi/");

    /** Classes no function may call at all. */
    private static final Set<String> DENIED_CLASSES = Set.of(
            "java/lang/ProcessBuilder", "java/lang/ProcessBuilder$Redirect", "java/lang/Process", "java/lang/ProcessHandle",
            "java/lang/ProcessHandle$Info", "java/net/URLClassLoader", "java/security/SecureClassLoader",
            "java/lang/invoke/MethodHandleProxies",
            // deserialization gadgets and XSLT extension functions run code the guard never saw
            "java/io/ObjectInputStream", "javax/xml/transform/TransformerFactory", "javax/xml/transform/sax/SAXTransformerFactory",
            // catalogs: files a resolver opens itself, past the path checks
            "javax/xml/catalog/CatalogManager",
            // the process's own descriptors (closing FileDescriptor.out ends every tenant's logs); opening
            // relative to a directory descriptor; a log file named by a pattern (%t: the runtime's directory)
            "java/io/FileDescriptor", "java/nio/file/SecureDirectoryStream", "java/util/logging/FileHandler",
            // a Unix socket: the node agent's is the runtime's control plane (the slot protocol)
            "java/net/UnixDomainSocketAddress");

    /** owner -> members no function may call (or take a handle to). */
    private static final Map<String, Set<String>> DENIED_MEMBERS = Map.ofEntries(
            Map.entry("java/lang/System", Set.of("setOut", "setErr", "setIn", "setProperty", "setProperties", "clearProperty",
                    "load", "loadLibrary", "setSecurityManager", "console")),
            Map.entry("java/lang/Runtime", Set.of("exec", "load", "loadLibrary", "addShutdownHook", "removeShutdownHook")),
            // above its own group are the runtime's threads and every other activation's (interrupt())
            Map.entry("java/lang/ThreadGroup", Set.of("enumerate", "getParent")),
            // a thread that does not inherit the activation escapes its thread limit and deadline
            Map.entry("java/lang/Thread$Builder", Set.of("inheritInheritableThreadLocals")),
            Map.entry("java/lang/Thread$Builder$OfPlatform", Set.of("inheritInheritableThreadLocals")),
            // a virtual thread is in no worker's group, and a Cleaner runs its actions on a JDK thread of
            // no activation: neither would end with the activation that started it
            Map.entry("java/lang/Thread", Set.of("getAllStackTraces", "enumerate", "setDefaultUncaughtExceptionHandler",
                    "ofVirtual", "startVirtualThread")),
            Map.entry("java/util/concurrent/Executors", Set.of("newVirtualThreadPerTaskExecutor")),
            Map.entry("java/lang/ref/Cleaner", Set.of("create")),
            Map.entry("java/lang/ClassLoader", Set.of("<init>", "defineClass", "defineClass1", "defineClass2", "resolveClass",
                    "setDefaultAssertionStatus", "setClassAssertionStatus", "setPackageAssertionStatus")),
            // a link would make a checked path name an unchecked file
            Map.entry("java/nio/file/Files", Set.of("createSymbolicLink", "createLink")),
            Map.entry("java/util/TimeZone", Set.of("setDefault")),
            Map.entry("java/util/Locale", Set.of("setDefault")),
            Map.entry("java/net/CookieHandler", Set.of("setDefault")),
            Map.entry("java/net/ProxySelector", Set.of("setDefault")),
            Map.entry("java/net/ResponseCache", Set.of("setDefault")),
            Map.entry("java/net/Authenticator", Set.of("setDefault")),
            Map.entry("java/net/URL", Set.of("setURLStreamHandlerFactory")),
            Map.entry("java/net/URLConnection", Set.of("setContentHandlerFactory", "setFileNameMap", "setDefaultUseCaches",
                    "setDefaultAllowUserInteraction", "setDefaultRequestProperty")),
            Map.entry("java/net/HttpURLConnection", Set.of("setFollowRedirects")),
            Map.entry("java/net/Socket", Set.of("setSocketImplFactory")),
            Map.entry("java/net/ServerSocket", Set.of("setSocketFactory")),
            Map.entry("java/net/DatagramSocket", Set.of("setDatagramSocketImplFactory")),
            Map.entry("javax/net/ssl/HttpsURLConnection", Set.of("setDefaultHostnameVerifier", "setDefaultSSLSocketFactory")),
            Map.entry("javax/net/ssl/SSLContext", Set.of("setDefault")),
            Map.entry("java/security/Security", Set.of("setProperty", "addProvider", "insertProviderAt", "removeProvider")),
            Map.entry("java/security/Policy", Set.of("setPolicy")),
            Map.entry("java/util/logging/LogManager", Set.of("reset", "readConfiguration", "updateConfiguration", "addLogger")),
            // loggers are JVM-wide by name: a handler, filter, parent or resource bundle of one function's
            // on another's logger (or the root, every function's) sees that function's records
            Map.entry("java/util/logging/Logger", Set.of("addHandler", "removeHandler", "getHandlers", "setFilter", "setParent",
                    "setUseParentHandlers", "setResourceBundle")),
            Map.entry("java/lang/invoke/MethodHandles$Lookup", Set.of()),
            // the common ForkJoinPool's threads belong to no activation (the other ways there are rewritten: ParallelCalls);
            // a stage completed by the JDK's delay scheduler runs its dependents there
            Map.entry("java/util/concurrent/ForkJoinPool", Set.of("commonPool")),
            Map.entry("java/util/concurrent/CompletableFuture", Set.of("defaultExecutor", "delayedExecutor", "orTimeout",
                    "completeOnTimeout")));

    /** The bootstraps javac emits (lambdas, string concatenation); the rest of java.lang.invoke is refused. */
    private static final Set<String> ALLOWED_INVOKE = Set.of("java/lang/invoke/LambdaMetafactory", "java/lang/invoke/StringConcatFactory");

    /** Why a reference to owner.name is refused, or null. */
    static String deniedMember(String owner, String name, String type) {
        for (String p : DENIED_PACKAGES) if (owner.startsWith(p)) return "its classes";
        if (DENIED_CLASSES.contains(owner)) return "its members";
        // reflection: looking is allowed; acting (invoke, newInstance, setAccessible) is
        // redirected to a check that the member is the function's own; fields are refused
        if (owner.equals("java/lang/reflect/Field")) return "reflection on fields";
        if (owner.startsWith("java/lang/reflect/") && name.equals("setAccessible") && type.startsWith("([")) return "reflection";
        if (owner.startsWith("java/lang/invoke/") && !ALLOWED_INVOKE.contains(owner)) return "method handles";
        if (owner.equals("java/lang/Thread") && name.equals("<init>") && type.endsWith("JZ)V")) return "a thread that escapes its activation";
        if (owner.equals("java/util/concurrent/ForkJoinWorkerThread") && name.equals("<init>") && type.endsWith("Z)V")) {
            return "a thread that escapes its activation";
        }
        if (owner.equals("java/util/logging/Logger") && name.equals("getLogger") && type.startsWith("(Ljava/lang/String;Ljava/lang/String;)")) {
            return "a JVM-wide call"; // sets the resource bundle of a logger another function may use
        }
        Set<String> m = DENIED_MEMBERS.get(owner);
        if (m != null && m.contains(name)) return "a JVM-wide call";
        if (owner.equals("java/net/URLClassLoader") || owner.equals("java/security/SecureClassLoader")) return "class loaders";
        return null;
    }

    /** Why a class reference is refused, or null (only packages: a type alone reaches nothing). */
    static String deniedClass(String owner) {
        for (String p : DENIED_PACKAGES) if (owner.startsWith(p)) return "its classes";
        return null;
    }

    // ---- rewritten calls --------------------------------------------------------------------

    /** A JDK call and the guard class whose static method of the same name it is rewritten to. */
    record Redirect(String owner, String name, String type, boolean virtual, boolean guardOnly, Class<?> guard) {}

    private static final String XML_SET = "(Ljava/lang/String;Ljava/lang/Object;)V";

    /** owner.name+type (JVM form) -> the guard's method of the same name (a virtual call gets its receiver first). */
    static final Map<String, Redirect> REDIRECTS = Map.ofEntries(
            redirect("java/lang/System", "exit", "(I)V", false, SystemCalls.class),
            redirect("java/lang/Runtime", "exit", "(I)V", true, SystemCalls.class),
            redirect("java/lang/Runtime", "halt", "(I)V", true, SystemCalls.class),
            // a full collection of the shared heap stops every tenant's threads
            redirect("java/lang/System", "gc", "()V", false, SystemCalls.class),
            redirect("java/lang/Runtime", "gc", "()V", true, SystemCalls.class),
            redirect("java/lang/System", "getenv", "(Ljava/lang/String;)Ljava/lang/String;", false, SystemCalls.class),
            redirect("java/lang/System", "getenv", "()Ljava/util/Map;", false, SystemCalls.class),
            redirect("java/lang/System", "getProperty", "(Ljava/lang/String;)Ljava/lang/String;", false, FileAccess.class),
            redirect("java/lang/System", "getProperty", "(Ljava/lang/String;Ljava/lang/String;)Ljava/lang/String;", false, FileAccess.class),
            redirect("java/lang/System", "getProperties", "()Ljava/util/Properties;", false, FileAccess.class),
            redirect("java/io/File", "createTempFile", "(Ljava/lang/String;Ljava/lang/String;)Ljava/io/File;", false, FileAccess.class),
            redirect("java/io/File", "createTempFile", "(Ljava/lang/String;Ljava/lang/String;Ljava/io/File;)Ljava/io/File;", false, FileAccess.class),
            redirect("java/nio/file/Files", "createTempFile",
                    "(Ljava/lang/String;Ljava/lang/String;[Ljava/nio/file/attribute/FileAttribute;)Ljava/nio/file/Path;", false, FileAccess.class),
            redirect("java/nio/file/Files", "createTempDirectory",
                    "(Ljava/lang/String;[Ljava/nio/file/attribute/FileAttribute;)Ljava/nio/file/Path;", false, FileAccess.class),
            reflect("java/lang/reflect/Method", "invoke", "(Ljava/lang/Object;[Ljava/lang/Object;)Ljava/lang/Object;", OwnReflection.class),
            reflect("java/lang/reflect/Constructor", "newInstance", "([Ljava/lang/Object;)Ljava/lang/Object;", OwnReflection.class),
            reflect("java/lang/Class", "newInstance", "()Ljava/lang/Object;", OwnReflection.class),
            reflect("java/lang/reflect/Method", "setAccessible", "(Z)V", OwnReflection.class),
            reflect("java/lang/reflect/Constructor", "setAccessible", "(Z)V", OwnReflection.class),
            reflect("java/lang/reflect/Executable", "setAccessible", "(Z)V", OwnReflection.class),
            reflect("java/lang/reflect/AccessibleObject", "setAccessible", "(Z)V", OwnReflection.class),
            reflect("java/lang/reflect/Method", "trySetAccessible", "()Z", OwnReflection.class),
            reflect("java/lang/reflect/Constructor", "trySetAccessible", "()Z", OwnReflection.class),
            reflect("java/lang/reflect/Executable", "trySetAccessible", "()Z", OwnReflection.class),
            reflect("java/lang/reflect/AccessibleObject", "trySetAccessible", "()Z", OwnReflection.class),
            // an XML parser the function tells to read external entities or schemas (the runtime
            // turns that off for every parser: XmlParsers.secureXml)
            reflect("javax/xml/parsers/DocumentBuilderFactory", "setAttribute", XML_SET, XmlParsers.class),
            reflect("javax/xml/parsers/SAXParser", "setProperty", XML_SET, XmlParsers.class),
            reflect("org/xml/sax/XMLReader", "setProperty", XML_SET, XmlParsers.class),
            reflect("javax/xml/stream/XMLInputFactory", "setProperty", XML_SET, XmlParsers.class),
            reflect("javax/xml/validation/SchemaFactory", "setProperty", XML_SET, XmlParsers.class),
            reflect("javax/xml/validation/Validator", "setProperty", XML_SET, XmlParsers.class),
            reflect("javax/xml/validation/ValidatorHandler", "setProperty", XML_SET, XmlParsers.class));

    private static Map.Entry<String, Redirect> redirect(String owner, String name, String type, boolean virtual, Class<?> guard) {
        return Map.entry(owner + "." + name + type, new Redirect(owner, name, type, virtual, false, guard));
    }

    /** A redirect that only the guard makes (a trusted runtime leaves the call as it is). */
    private static Map.Entry<String, Redirect> reflect(String owner, String name, String type, Class<?> guard) {
        return Map.entry(owner + "." + name + type, new Redirect(owner, name, type, true, true, guard));
    }

    /** The guard's classes the rewritten code calls (named only: loading them here starts nothing). */
    private static final ClassDesc ACTIVATIONS = desc(Activations.class), FILE_ACCESS = desc(FileAccess.class),
            COMMON_POOL = desc(CommonPool.class);

    private static ClassDesc desc(Class<?> c) { return ClassDesc.of(c.getName()); }

    private static Redirect redirectOf(MemberRefEntry m) {
        return REDIRECTS.get(m.owner().asInternalName() + "." + m.name().stringValue() + m.type().stringValue());
    }

    /**
     * The class and its superclasses (internal names): through the function's jar, then the JDK.
     * A member named through a subclass ({@code MyThread.getAllStackTraces()}) is the JDK's.
     */
    private static List<String> lineage(String owner, java.util.function.Function<String, byte[]> jar) {
        List<String> l = new ArrayList<>();
        String c = owner;
        for (int depth = 0; c != null && depth < 64; depth++) {
            l.add(c);
            byte[] b = jar.apply(c + ".class");
            if (b != null) {
                c = ClassFile.of().parse(b).superclass().map(ClassEntry::asInternalName).orElse(null);
                continue;
            }
            try {
                Class<?> k = Class.forName(c.replace('/', '.'), false, ClassLoader.getPlatformClassLoader());
                for (Class<?> s = k.getSuperclass(); s != null; s = s.getSuperclass()) l.add(s.getName().replace('.', '/'));
            } catch (ClassNotFoundException | LinkageError notJdk) {
            }
            break;
        }
        return l;
    }

    /** A call of a {@code start()} (a thread's, or any other: the mark looks at what it starts). */
    private static boolean isStart(String name, String type) { return name.equals("start") && type.equals("()V"); }

    /** A JDK class that is no thread (its {@code start()} starts none): the function's own classes and interfaces may be threads. */
    private static boolean jdkNonThread(String owner, java.util.function.Function<String, byte[]> jar) {
        List<String> l = lineage(owner, jar);
        return jar.apply(owner + ".class") == null && !l.contains("java/lang/Thread")
                && (owner.startsWith("java/") || owner.startsWith("javax/") || owner.startsWith("jdk/"));
    }

    /** A lambda (or method reference) whose method returns a thread (a thread factory) implemented by a JDK method. */
    private static boolean jdkThreadFactory(InvokeDynamicEntry d, java.util.function.Function<String, byte[]> jar) {
        var args = d.bootstrap().arguments();
        if (!d.bootstrap().bootstrapMethod().reference().owner().asInternalName().equals("java/lang/invoke/LambdaMetafactory")
                || args.size() < 2 || !(args.get(0) instanceof MethodTypeEntry sam) || !(args.get(1) instanceof MethodHandleEntry impl)) {
            return false;
        }
        ClassDesc r = sam.asSymbol().returnType();
        if (!r.isClassOrInterface()) return false;
        String ret = r.descriptorString();
        return lineage(ret.substring(1, ret.length() - 1), jar).contains("java/lang/Thread")
                && jar.apply(impl.reference().owner().asInternalName() + ".class") == null;
    }

    /** Whether the method returns a thread (a factory's {@code newThread}, whose caller may start it). */
    private static boolean returnsThread(MethodModel m, java.util.function.Function<String, byte[]> jar) {
        ClassDesc r = m.methodTypeSymbol().returnType();
        if (!r.isClassOrInterface()) return false;
        String name = r.descriptorString();
        return lineage(name.substring(1, name.length() - 1), jar).contains("java/lang/Thread");
    }

    /** The refusal for this class, or null: every constant-pool reference is looked at, whatever uses it. */
    static String check(ClassModel cm, java.util.function.Function<String, byte[]> jar) {
        String self = cm.thisClass().asInternalName();
        Map<String, List<String>> lineages = new HashMap<>();
        // a File of its own could name one path to the check and another to the JDK
        if (lineage(self, jar).contains("java/io/File")) {
            return self + " extends java.io.File (a file path checked at each use): " + NOT_ALLOWED
                    + " (a runtime for trusted code only may set CPUSLOT_JAVA_TRUSTED=true)";
        }
        // the JVM's finalizer thread runs it, outside any activation: not stopped, not counted
        for (MethodModel m : cm.methods()) {
            if (m.methodName().equalsString("finalize") && m.methodType().equalsString("()V")
                    && !m.flags().has(java.lang.reflect.AccessFlag.STATIC)) {
                return self + " overrides finalize() (run by the JVM's finalizer thread, outside any activation): " + NOT_ALLOWED
                        + " (a runtime for trusted code only may set CPUSLOT_JAVA_TRUSTED=true)";
            }
        }
        for (PoolEntry e : cm.constantPool()) {
            String why = null, what = null;
            if (e instanceof MemberRefEntry m) {
                String owner = m.owner().asInternalName();
                if (redirectOf(m) != null) continue;
                for (String a : lineages.computeIfAbsent(owner, o -> lineage(o, jar))) {
                    why = deniedMember(a, m.name().stringValue(), m.type().stringValue());
                    if (why != null) break;
                }
                what = owner.replace('/', '.') + "." + m.name().stringValue();
            } else if (e instanceof ClassEntry c && !c.asInternalName().startsWith("[")) {
                why = deniedClass(c.asInternalName());
                what = c.asInternalName().replace('/', '.');
            } else if (e instanceof MethodHandleEntry h && (redirectOf(h.reference()) != null
                    || ParallelCalls.sequential(h.reference().owner().asInternalName(), h.reference().name().stringValue(),
                            h.reference().type().stringValue(), jar) != null)) {
                why = "a method handle to a guarded call";
                what = h.reference().owner().asInternalName().replace('/', '.') + "." + h.reference().name().stringValue();
            } else if (e instanceof MethodHandleEntry h && FilePaths.checked(h.reference().owner().asInternalName(),
                    h.reference().name().stringValue(), h.reference().type().stringValue()) != null) {
                why = "a method reference to file access, which is checked at the call: write a lambda";
                what = h.reference().owner().asInternalName().replace('/', '.') + "." + h.reference().name().stringValue();
            } else if (e instanceof MethodHandleEntry h && isStart(h.reference().name().stringValue(), h.reference().type().stringValue())
                    && !jdkNonThread(h.reference().owner().asInternalName(), jar)) {
                why = "a method reference to a thread's start, which is marked at the call: write a lambda";
                what = h.reference().owner().asInternalName().replace('/', '.') + "." + h.reference().name().stringValue();
            } else if (e instanceof InvokeDynamicEntry d && jdkThreadFactory(d, jar)) {
                // a factory's threads are marked as the function's code returns them (markStart); a JDK method's return is not
                why = "a JDK method as a thread factory, whose threads are marked as the function's code returns them: write a lambda";
                what = ((MethodHandleEntry) d.bootstrap().arguments().get(1)).reference().owner().asInternalName().replace('/', '.')
                        + "." + ((MethodHandleEntry) d.bootstrap().arguments().get(1)).reference().name().stringValue();
            }
            if (why != null) {
                return self + " uses " + what + " (" + why + "): " + NOT_ALLOWED
                        + " (a runtime for trusted code only may set CPUSLOT_JAVA_TRUSTED=true)";
            }
        }
        return null;
    }

    /**
     * Checks the class (unless trusted) and returns it with its guarded calls redirected to
     * the guard's classes, or the same bytes when it has none.
     * @param loader resolves the function's own classes when stack maps are recomputed
     * @param jar the function's jar: entry name -> bytes (its classes' superclasses)
     * @throws Refused when the class references what the guard refuses
     */
    public static byte[] rewrite(byte[] classBytes, ClassLoader loader, boolean trusted,
                                 java.util.function.Function<String, byte[]> jar) {
        return rewrite(classBytes, loader, trusted, !trusted, jar);
    }

    /**
     * The same, with the refusal check apart: a library the runtime gives a function a copy of
     * (Gson, the chain API: {@code JavaFunction}) is rewritten as the function's own code, so its
     * reflection acts on the function's classes only, but not refused for what it names (Gson
     * names {@code Field}).
     */
    public static byte[] rewrite(byte[] classBytes, ClassLoader loader, boolean trusted, boolean refuse,
                                 java.util.function.Function<String, byte[]> jar) {
        ClassFile plain = ClassFile.of();
        ClassModel cm = plain.parse(classBytes);
        if (refuse) {
            String why = check(cm, jar);
            if (why != null) throw new Refused(why);
        }
        if (trusted && !hasRedirect(cm, true)) return classBytes; // a trusted runtime's classes are not polled
        ClassFile cf = ClassFile.of(ClassFile.ClassHierarchyResolverOption.of(
                ClassHierarchyResolver.defaultResolver().orElse(ClassHierarchyResolver.ofResourceParsing(loader))));
        // one pass over each method body (the class API applies one body transform per method)
        return cf.transformClass(cm, (clb, cle) -> {
            if (cle instanceof MethodModel m && m.code().isPresent()) {
                // a thread handed out (a factory's) may be started by its caller: marked (Activations.starting)
                boolean marksReturn = !trusted && returnsThread(m, jar);
                clb.transformMethod(m, MethodTransform.transformingCode(guarded(trusted, marksReturn, jar)));
            } else {
                clb.with(cle);
            }
        });
    }

    /** The rewrite of one method body: the poll at backward branches, the marks of starts, the redirects. */
    private static CodeTransform guarded(boolean trusted, boolean marksReturn, java.util.function.Function<String, byte[]> jar) {
        return new CodeTransform() {
            /** Labels already bound in this method: a branch to one of them goes backward. */
            private final Set<Label> seen = new HashSet<>();

            @Override
            public void accept(CodeBuilder cob, CodeElement coe) {
                if (coe instanceof LabelTarget lt) seen.add(lt.label());
                boolean back = switch (coe) {
                    case BranchInstruction b -> seen.contains(b.target());
                    case LookupSwitchInstruction l -> seen.contains(l.defaultTarget()) || l.cases().stream().anyMatch(c -> seen.contains(c.target()));
                    case TableSwitchInstruction t -> seen.contains(t.defaultTarget()) || t.cases().stream().anyMatch(c -> seen.contains(c.target()));
                    default -> false;
                };
                // a loop stops at its deadline or when it fills the heap (Activations.poll)
                if (back && !trusted) cob.invokestatic(ACTIVATIONS, "poll", MethodTypeDesc.of(ConstantDescs.CD_void));
                // a thread started: one an ended activation made stops at once (Activations.starting)
                if (!trusted && coe instanceof InvokeInstruction i && i.opcode() != Opcode.INVOKESTATIC
                        && isStart(i.name().stringValue(), i.type().stringValue())) markStart(cob);
                if (marksReturn && coe instanceof ReturnInstruction r && r.opcode() == Opcode.ARETURN) markStart(cob);
                redirect(cob, coe, trusted, jar);
            }
        };
    }

    /** The object on top of the stack (a thread about to start) is marked: {@link Activations#starting}. */
    private static void markStart(CodeBuilder cob) {
        cob.dup();
        cob.invokestatic(ACTIVATIONS, "starting", MethodTypeDesc.of(ConstantDescs.CD_void, ConstantDescs.CD_Object));
    }

    private static boolean hasRedirect(ClassModel cm, boolean trusted) {
        for (PoolEntry e : cm.constantPool()) {
            if (e instanceof MemberRefEntry m && redirectOf(m) != null && !(trusted && redirectOf(m).guardOnly())) return true;
        }
        return false;
    }

    private static void redirect(CodeBuilder cob, CodeElement coe, boolean trusted, java.util.function.Function<String, byte[]> jar) {
        if (!trusted && coe instanceof InvokeInstruction i) {
            ParallelCalls.Sequential q = ParallelCalls.sequential(i.owner().asInternalName(), i.name().stringValue(), i.type().stringValue(), jar);
            if (q != null) {
                ParallelCalls.emit(cob, i, q, COMMON_POOL);
                return;
            }
        }
        if (!trusted && coe instanceof InvokeInstruction i) {
            FilePaths.Check c = FilePaths.checked(i.owner().asInternalName(), i.name().stringValue(), i.type().stringValue());
            if (c != null && redirectOf(i.method()) == null) {
                FilePaths.emit(cob, i, c, FILE_ACCESS);
                cob.with(coe);
                return;
            }
        }
        {
            if (coe instanceof InvokeInstruction i && (i.opcode() == Opcode.INVOKESTATIC || i.opcode() == Opcode.INVOKEVIRTUAL
                    || i.opcode() == Opcode.INVOKEINTERFACE)) {
                Redirect r = redirectOf(i.method());
                if (r != null && r.virtual() == (i.opcode() != Opcode.INVOKESTATIC) && !(trusted && r.guardOnly())) {
                    MethodTypeDesc t = i.typeSymbol();
                    if (r.virtual()) t = t.insertParameterTypes(0, ClassDesc.of("java.lang.Object"));
                    cob.invokestatic(desc(r.guard()), r.name(), t);
                    return;
                }
            }
            cob.with(coe);
        }
    }

    /** Checks only (for a whole jar at /init): the refusal, or null. @param jar entry name -> bytes */
    public static String refusal(byte[] classBytes, java.util.function.Function<String, byte[]> jar) {
        return check(ClassFile.of().parse(classBytes), jar);
    }
}
