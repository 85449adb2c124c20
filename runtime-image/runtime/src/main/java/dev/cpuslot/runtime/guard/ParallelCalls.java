package dev.cpuslot.runtime.guard;

import java.lang.classfile.ClassFile;
import java.lang.classfile.ClassModel;
import java.lang.classfile.CodeBuilder;
import java.lang.classfile.instruction.InvokeInstruction;
import java.lang.constant.ClassDesc;
import java.lang.constant.MethodTypeDesc;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Which calls of a function's code would hand its work to the common ForkJoinPool, whose threads
 * belong to no activation (not counted, not stopped at its deadline), and how {@link Rewriter}
 * rewrites them: parallel streams and {@code Arrays.parallel*} run sequentially, a
 * {@code CompletableFuture.*Async} call gets an executor of the activation's threads
 * ({@link CommonPool} at run time). Its own file as {@link FilePaths} is: one kind of call, found
 * where the function makes it.
 */
final class ParallelCalls {
    private ParallelCalls() {}

    /** How a call that would hand work to the common ForkJoinPool is rewritten. */
    private enum Way { RENAME, GUARD, APPEND_EXECUTOR, NOT_PARALLEL, NO_THRESHOLD }

    record Sequential(Way way, String name, String type) {}

    private static final String EXECUTOR = "Ljava/util/concurrent/Executor;";

    private static final Set<String> INVOKE_ALL = Set.of("(Ljava/util/concurrent/ForkJoinTask;Ljava/util/concurrent/ForkJoinTask;)V",
            "([Ljava/util/concurrent/ForkJoinTask;)V", "(Ljava/util/Collection;)Ljava/util/Collection;");

    /** JDK (or runtime library) class + "|" + type -> whether it is one: the same for every function. */
    private static final Map<String, Boolean> JDK_IS_A = new java.util.concurrent.ConcurrentHashMap<>();

    /**
     * The rewrite of a call that would run the function's code on the common pool's threads (of no
     * activation), or null: parallel streams and {@code Arrays.parallel*} become sequential, a
     * {@code CompletableFuture.*Async} call gets {@link CommonPool#executor()} (a thread of the
     * activation), a fork outside a pool of the function's own runs in place, a
     * {@code ConcurrentHashMap} bulk operation gets the threshold that means sequential.
     */
    static Sequential sequential(String owner, String name, String type, java.util.function.Function<String, byte[]> jar) {
        switch (name) {
            case "parallelStream" -> {
                if (type.startsWith("()") && isA(owner, "java/util/Collection", jar)) return new Sequential(Way.RENAME, "stream", type);
            }
            case "parallel" -> {
                if (type.startsWith("()") && isA(owner, "java/util/stream/BaseStream", jar)) return new Sequential(Way.RENAME, "sequential", type);
            }
            case "parallelSort" -> {
                if (owner.equals("java/util/Arrays")) {
                    return new Sequential(Way.RENAME, "sort", type.replace("[Ljava/lang/Comparable;", "[Ljava/lang/Object;"));
                }
            }
            case "parallelSetAll" -> {
                if (owner.equals("java/util/Arrays")) return new Sequential(Way.RENAME, "setAll", type);
            }
            case "parallelPrefix" -> {
                if (owner.equals("java/util/Arrays")) return new Sequential(Way.GUARD, name, type);
            }
            case "fork" -> {
                if (type.equals("()Ljava/util/concurrent/ForkJoinTask;") && isA(owner, "java/util/concurrent/ForkJoinTask", jar)) {
                    return new Sequential(Way.GUARD, name, "(Ljava/util/concurrent/ForkJoinTask;)Ljava/util/concurrent/ForkJoinTask;");
                }
            }
            case "invokeAll" -> {
                if (INVOKE_ALL.contains(type) && isA(owner, "java/util/concurrent/ForkJoinTask", jar)) return new Sequential(Way.GUARD, name, type);
            }
            case "<init>" -> {
                if (owner.equals("java/util/concurrent/SubmissionPublisher") && type.equals("()V")) {
                    return new Sequential(Way.APPEND_EXECUTOR, name, "(" + EXECUTOR + "I)V");
                }
            }
            default -> {
                if (name.endsWith("Async") && !type.contains(EXECUTOR + ")") && isA(owner, "java/util/concurrent/CompletionStage", jar)) {
                    return new Sequential(Way.APPEND_EXECUTOR, name, type.replace(")", EXECUTOR + ")"));
                }
            }
        }
        if (owner.equals("java/util/stream/StreamSupport") && type.contains("Z)")) return new Sequential(Way.NOT_PARALLEL, name, type);
        // the bulk operations (forEach, search*, reduce*) take the parallelism threshold first
        if (type.startsWith("(J") && (name.startsWith("forEach") || name.startsWith("search") || name.startsWith("reduce"))
                && isA(owner, "java/util/concurrent/ConcurrentHashMap", jar)) {
            return new Sequential(Way.NO_THRESHOLD, name, type);
        }
        return null;
    }

    /** Emits the rewrite of call i; {@code pool}: the guard class the rewritten call goes to ({@link CommonPool}). */
    static void emit(CodeBuilder cob, InvokeInstruction i, Sequential q, ClassDesc pool) {
        switch (q.way()) {
            case RENAME -> cob.invoke(i.opcode(), i.owner().asSymbol(), q.name(), MethodTypeDesc.ofDescriptor(q.type()), i.isInterface());
            case GUARD -> cob.invokestatic(pool, q.name(), MethodTypeDesc.ofDescriptor(q.type()));
            case APPEND_EXECUTOR -> {
                cob.invokestatic(pool, "executor", MethodTypeDesc.of(ClassDesc.of("java.util.concurrent.Executor")));
                if (q.name().equals("<init>")) cob.loadConstant(java.util.concurrent.Flow.defaultBufferSize());
                cob.invoke(i.opcode(), i.owner().asSymbol(), q.name(), MethodTypeDesc.ofDescriptor(q.type()), i.isInterface());
            }
            case NOT_PARALLEL -> { // the last argument, parallel: false
                cob.pop();
                cob.iconst_0();
                cob.with(i);
            }
            case NO_THRESHOLD -> { // the first argument, the parallelism threshold: Long.MAX_VALUE (sequential)
                List<ClassDesc> ps = i.typeSymbol().parameterList();
                int[] slots = new int[ps.size()];
                for (int k = ps.size() - 1; k >= 1; k--) {
                    java.lang.classfile.TypeKind t = java.lang.classfile.TypeKind.from(ps.get(k));
                    slots[k] = cob.allocateLocal(t);
                    cob.storeLocal(t, slots[k]);
                }
                cob.pop2();
                cob.loadConstant(Long.MAX_VALUE);
                for (int k = 1; k < ps.size(); k++) cob.loadLocal(java.lang.classfile.TypeKind.from(ps.get(k)), slots[k]);
                cob.with(i);
            }
        }
    }

    /** Whether the class (the function's or a library's) is or extends or implements the JDK type (internal names). */
    private static boolean isA(String owner, String type, java.util.function.Function<String, byte[]> jar) {
        java.util.ArrayDeque<String> todo = new java.util.ArrayDeque<>(List.of(owner));
        Set<String> seen = new HashSet<>();
        while (!todo.isEmpty() && seen.size() < 256) {
            String c = todo.poll();
            if (c.equals(type)) return true;
            if (!seen.add(c) || c.startsWith("[")) continue;
            byte[] b = jar.apply(c + ".class");
            if (b != null) {
                ClassModel m = ClassFile.of().parse(b);
                m.superclass().ifPresent(s -> todo.add(s.asInternalName()));
                m.interfaces().forEach(x -> todo.add(x.asInternalName()));
                continue;
            }
            Boolean known = JDK_IS_A.get(c + "|" + type);
            if (known == null) {
                known = jdkIsA(c, type);
                if (known != null) JDK_IS_A.put(c + "|" + type, known); // only classes that exist: a bounded set
            }
            if (Boolean.TRUE.equals(known)) return true;
        }
        return false;
    }

    /** Null when no such class. */
    private static Boolean jdkIsA(String c, String type) {
        for (ClassLoader l : new ClassLoader[] {ClassLoader.getPlatformClassLoader(), ParallelCalls.class.getClassLoader()}) {
            try {
                Class<?> k = Class.forName(c.replace('/', '.'), false, l);
                return Class.forName(type.replace('/', '.'), false, ClassLoader.getPlatformClassLoader()).isAssignableFrom(k);
            } catch (ClassNotFoundException | LinkageError notThere) {
            }
        }
        return null;
    }
}
