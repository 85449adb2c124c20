package dev.cpuslot.runtime.guard;

import java.lang.reflect.AccessibleObject;
import java.lang.reflect.Constructor;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Member;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.lang.reflect.RecordComponent;

/**
 * Reflection that acts ({@code invoke}, {@code newInstance}, {@code setAccessible}): rewritten here
 * and allowed on the calling function's own classes only, since a reflective call by name cannot
 * be told apart at load time. Also finds that calling function for the other guard classes.
 */
public final class OwnReflection {
    private OwnReflection() {}

    private static final StackWalker WALKER = StackWalker.getInstance(StackWalker.Option.RETAIN_CLASS_REFERENCE);

    /** The function class that called the guard (the rewritten call site): the first frame outside the guard's classes. */
    static Class<?> caller() {
        return WALKER.walk(s -> s.map(StackWalker.StackFrame::getDeclaringClass)
                .filter(c -> !guard(c)).findFirst().orElse(OwnReflection.class));
    }

    /** A class of the guard's own (a function's loader delegates this package to the runtime's, and defines none in it). */
    private static boolean guard(Class<?> c) {
        return c.getClassLoader() == OwnReflection.class.getClassLoader() && c.getPackageName().equals(OwnReflection.class.getPackageName());
    }

    /** Reflection may act only on members of the calling function's own classes. */
    private static void own(Class<?> target, String what) {
        ClassLoader l = caller().getClassLoader();
        if (target == null || target.getClassLoader() != l || !FileAccess.function(l)) {
            throw new SecurityException(what + " of " + (target == null ? "null" : target.getName())
                    + ": reflection on other than the function's own classes is not allowed to a function in a shared runtime");
        }
    }

    public static Object invoke(Object method, Object target, Object[] args) throws IllegalAccessException, InvocationTargetException {
        Method m = (Method) method;
        if (!recordShape(m)) own(m.getDeclaringClass(), "Method.invoke");
        return m.invoke(target, args);
    }

    /**
     * A read of a record's shape ({@code Class.isRecord}, {@code getRecordComponents}, a
     * {@code RecordComponent}'s name, type or accessor): Gson, compiled for Java 7, calls them by
     * reflection to bind a function's records and classes. Each only describes a class, as the
     * direct call would, and none depends on its caller; an accessor it returns is invoked under
     * the rule above.
     */
    private static boolean recordShape(Method m) {
        if (m.getParameterCount() != 0 || Modifier.isStatic(m.getModifiers())) return false;
        Class<?> d = m.getDeclaringClass();
        return d == Class.class ? m.getName().equals("isRecord") || m.getName().equals("getRecordComponents")
                : d == RecordComponent.class;
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
}
