package dev.cpuslot.runtime.guard;

/**
 * The runtime's own threads, kept apart from the activations': a thread made while a worker runs
 * an activation lands in the worker's group, whose threads end with the activation
 * ({@link Activations}), so the runtime makes its threads here.
 */
public final class RuntimeThreads {
    private RuntimeThreads() {}

    /**
     * The group of the runtime's own threads that may be started from a worker (pool workers, jail
     * threads), directly under the JVM's top group: never inside a worker's group, whose threads
     * end with each activation.
     */
    public static final ThreadGroup RUNTIME_THREADS = new ThreadGroup(top(), "cpuslot-runtime");

    /**
     * A daemon thread of the runtime's own, wherever the thread that starts it runs: in
     * RUNTIME_THREADS, inheriting no activation. A thread made while a worker runs an activation
     * otherwise lands in the worker's group, and ends with the first activation there that
     * started a thread of its own.
     */
    public static Thread.Builder.OfPlatform runtimeThread(String name) {
        return Thread.ofPlatform().daemon().group(RUNTIME_THREADS).inheritInheritableThreadLocals(false).name(name);
    }

    /**
     * Makes {@code make}'s value on a runtime thread: what it starts as it is made (the JDK's
     * HTTP client starts its selector thread in the maker's group) is the runtime's, not a worker's.
     */
    public static <T> T makeOnRuntimeThread(String name, java.util.function.Supplier<T> make) {
        return makeOn(runtimeThread(name), make);
    }

    /**
     * Makes {@code make}'s value on a new thread of {@code thread} and waits for it, interrupted
     * or not (the value is made once, for everyone, and an interrupt does not stop what makes
     * it); what {@code make} throws is thrown here.
     */
    public static <T> T makeOn(Thread.Builder.OfPlatform thread, java.util.function.Supplier<T> make) {
        Object[] out = new Object[1];
        Throwable[] failed = new Throwable[1];
        Thread t = thread.start(() -> {
            try {
                out[0] = make.get();
            } catch (Throwable e) {
                failed[0] = e;
            }
        });
        boolean interrupted = false;
        while (true) {
            try {
                t.join();
                break;
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) Thread.currentThread().interrupt();
        if (failed[0] instanceof RuntimeException e) throw e;
        if (failed[0] instanceof Error e) throw e;
        if (failed[0] != null) throw new IllegalStateException(failed[0]);
        @SuppressWarnings("unchecked") T v = (T) out[0];
        return v;
    }

    /** An executor on runtime threads (for the JDK's HTTP clients, whose default one makes threads in the submitter's group). */
    public static java.util.concurrent.ExecutorService runtimeExecutor(String name) {
        java.util.concurrent.atomic.AtomicInteger n = new java.util.concurrent.atomic.AtomicInteger();
        return java.util.concurrent.Executors.newCachedThreadPool(r -> runtimeThread(name + "-" + n.incrementAndGet()).unstarted(r));
    }

    private static ThreadGroup top() {
        ThreadGroup g = Thread.currentThread().getThreadGroup();
        while (g.getParent() != null) g = g.getParent();
        return g;
    }
}
