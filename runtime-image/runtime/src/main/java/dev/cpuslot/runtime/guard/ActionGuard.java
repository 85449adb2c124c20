package dev.cpuslot.runtime.guard;

import java.lang.classfile.ClassFile;
import java.lang.classfile.ClassHierarchyResolver;
import java.lang.classfile.ClassModel;
import java.lang.classfile.ClassTransform;
import java.lang.classfile.MethodModel;
import java.lang.classfile.Opcode;
import java.lang.classfile.instruction.InvokeInstruction;
import java.lang.constant.ClassDesc;
import java.lang.constant.MethodTypeDesc;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;

/**
 * What a Java action's classes call instead of the process-wide calls a multi-tenant runtime cannot
 * give one tenant: the runtime rewrites, in every class it loads from an action's jar, the calls
 * {@code System.exit}, {@code Runtime.exit}, {@code Runtime.halt} (to throw a SecurityException, as
 * a SecurityManager used to) and {@code System.getenv} (to see the activation's {@code __OW_*} and
 * /init environment on top of the process's, as the OpenWhisk Java runtime provides them).
 *
 * <p>Shared with every action class loader. Calls made through reflection or method handles are
 * not rewritten (see runtime-image/README.md).
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

    // ---- the rewrite ------------------------------------------------------------------------

    private static final ClassDesc GUARD = ClassDesc.of(ActionGuard.class.getName());
    private static final ClassDesc RUNTIME = ClassDesc.of("java.lang.Runtime");
    private static final MethodTypeDesc I_V = MethodTypeDesc.ofDescriptor("(I)V");
    private static final MethodTypeDesc RT_I_V = MethodTypeDesc.of(java.lang.constant.ConstantDescs.CD_void, RUNTIME,
            java.lang.constant.ConstantDescs.CD_int);

    /** Which guarded call an instruction is, or null. */
    private static String target(InvokeInstruction i) {
        String owner = i.owner().asInternalName(), name = i.name().stringValue(), type = i.type().stringValue();
        if (owner.equals("java/lang/System") && i.opcode() == Opcode.INVOKESTATIC) {
            if (name.equals("exit") && type.equals("(I)V")) return "exit";
            if (name.equals("getenv") && type.equals("(Ljava/lang/String;)Ljava/lang/String;")) return "getenv1";
            if (name.equals("getenv") && type.equals("()Ljava/util/Map;")) return "getenv0";
        }
        if (owner.equals("java/lang/Runtime") && i.opcode() == Opcode.INVOKEVIRTUAL && type.equals("(I)V")
                && (name.equals("exit") || name.equals("halt"))) return "rt" + name;
        return null;
    }

    /**
     * Returns the class with its guarded calls redirected here, or the same bytes when it has none.
     * @param loader resolves the action's own classes when stack maps are recomputed
     */
    public static byte[] rewrite(byte[] classBytes, ClassLoader loader) {
        ClassFile plain = ClassFile.of();
        ClassModel cm = plain.parse(classBytes);
        boolean any = false;
        for (MethodModel m : cm.methods()) {
            if (m.code().isEmpty()) continue;
            for (var e : m.code().get()) {
                if (e instanceof InvokeInstruction i && target(i) != null) {
                    any = true;
                    break;
                }
            }
            if (any) break;
        }
        if (!any) return classBytes;
        ClassFile cf = ClassFile.of(ClassFile.ClassHierarchyResolverOption.of(
                ClassHierarchyResolver.defaultResolver().orElse(ClassHierarchyResolver.ofResourceParsing(loader))));
        return cf.transformClass(cm, ClassTransform.transformingMethodBodies((cob, coe) -> {
            if (coe instanceof InvokeInstruction i) {
                String t = target(i);
                if (t != null) {
                    switch (t) {
                        case "exit" -> cob.invokestatic(GUARD, "exit", I_V);
                        case "getenv1" -> cob.invokestatic(GUARD, "getenv", i.typeSymbol());
                        case "getenv0" -> cob.invokestatic(GUARD, "getenv", i.typeSymbol());
                        case "rtexit" -> cob.invokestatic(GUARD, "exit", RT_I_V);
                        case "rthalt" -> cob.invokestatic(GUARD, "halt", RT_I_V);
                        default -> cob.with(coe);
                    }
                    return;
                }
            }
            cob.with(coe);
        }));
    }
}
