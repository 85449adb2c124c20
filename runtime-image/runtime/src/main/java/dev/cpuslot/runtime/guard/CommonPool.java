package dev.cpuslot.runtime.guard;

/**
 * What {@link Rewriter} rewrites the calls to that would hand a function's work to the common
 * ForkJoinPool, whose threads belong to no activation: a fork runs in place, parallel prefixes
 * sequentially, an asynchronous stage on a thread of the calling activation. No state of its own.
 */
public final class CommonPool {
    private CommonPool() {}

    /**
     * The executor a function's {@code CompletableFuture.*Async} call gets instead of the common
     * pool: each task on a thread of its own, made as if by the calling activation (taken when the
     * call site runs, not when a JDK thread completing the stage hands the task over), so it is
     * counted in the function's thread limit and stops at the activation's deadline.
     */
    public static java.util.concurrent.Executor executor() {
        Activations.Activation a = Activations.ACTIVATION.get();
        ThreadGroup g = Thread.currentThread().getThreadGroup();
        return task -> {
            Activations.Activation prev = Activations.ACTIVATION.get();
            if (a == null) Activations.ACTIVATION.remove();
            else Activations.ACTIVATION.set(a);
            try {
                Thread.ofPlatform().group(g).daemon(true).name("async-task").start(task);
            } finally {
                if (prev == null) Activations.ACTIVATION.remove();
                else Activations.ACTIVATION.set(prev);
            }
        };
    }

    /** A thread of a pool the function made, where a fork stays (the common pool's never runs its code). */
    private static boolean inOwnPool() {
        return Thread.currentThread() instanceof java.util.concurrent.ForkJoinWorkerThread w
                && w.getPool() != java.util.concurrent.ForkJoinPool.commonPool();
    }

    /** {@code ForkJoinTask.fork()}: outside a pool of the function's own, the task runs here (its join finds it done). */
    public static java.util.concurrent.ForkJoinTask<?> fork(java.util.concurrent.ForkJoinTask<?> t) {
        if (inOwnPool()) return t.fork();
        t.quietlyInvoke();
        return t;
    }

    public static void invokeAll(java.util.concurrent.ForkJoinTask<?> t1, java.util.concurrent.ForkJoinTask<?> t2) {
        if (inOwnPool()) java.util.concurrent.ForkJoinTask.invokeAll(t1, t2);
        else { t1.invoke(); t2.invoke(); }
    }

    public static void invokeAll(java.util.concurrent.ForkJoinTask<?>... ts) {
        if (inOwnPool()) java.util.concurrent.ForkJoinTask.invokeAll(ts);
        else for (var t : ts) t.invoke();
    }

    public static <T extends java.util.concurrent.ForkJoinTask<?>> java.util.Collection<T> invokeAll(java.util.Collection<T> ts) {
        if (inOwnPool()) return java.util.concurrent.ForkJoinTask.invokeAll(ts);
        for (var t : ts) t.invoke();
        return ts;
    }

    // Arrays.parallelPrefix, sequentially (the JDK's has no sequential twin)
    public static <T> void parallelPrefix(T[] a, java.util.function.BinaryOperator<T> op) { parallelPrefix(a, 0, a.length, op); }

    public static <T> void parallelPrefix(T[] a, int from, int to, java.util.function.BinaryOperator<T> op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.apply(a[i - 1], a[i]);
    }

    public static void parallelPrefix(long[] a, java.util.function.LongBinaryOperator op) { parallelPrefix(a, 0, a.length, op); }

    public static void parallelPrefix(long[] a, int from, int to, java.util.function.LongBinaryOperator op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.applyAsLong(a[i - 1], a[i]);
    }

    public static void parallelPrefix(double[] a, java.util.function.DoubleBinaryOperator op) { parallelPrefix(a, 0, a.length, op); }

    public static void parallelPrefix(double[] a, int from, int to, java.util.function.DoubleBinaryOperator op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.applyAsDouble(a[i - 1], a[i]);
    }

    public static void parallelPrefix(int[] a, java.util.function.IntBinaryOperator op) { parallelPrefix(a, 0, a.length, op); }

    public static void parallelPrefix(int[] a, int from, int to, java.util.function.IntBinaryOperator op) {
        java.util.Objects.checkFromToIndex(from, to, a.length);
        java.util.Objects.requireNonNull(op);
        for (int i = from + 1; i < to; i++) a[i] = op.applyAsInt(a[i - 1], a[i]);
    }
}
