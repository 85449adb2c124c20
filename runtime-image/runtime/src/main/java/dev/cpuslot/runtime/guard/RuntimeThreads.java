package dev.cpuslot.runtime.guard;

/**
 * The runtime's own threads, kept apart from the activations': a thread made while a worker runs
 * an activation lands in the worker's group, whose threads end with the activation
 * ({@link Activations}), so the runtime makes its threads here.
 *
 * <p>Every one of them is started by one thread, the spawner, which never sits in a slot: Linux
 * starts a new thread in its creator's cgroup, and a worker runs in its activation's slot (a CPU
 * cgroup with the function's quota), so a thread a worker started itself would run on that
 * quota and bill for as long as it lives. The spawner is made when this class is first used,
 * which is before any worker exists (workers are made here), so before any slot is leased; it is
 * never placed, so the threads it starts begin in the runtime's own cgroup.
 */
public final class RuntimeThreads {
    private RuntimeThreads() {}

    /**
     * The group of the runtime's own threads that may be started from a worker (pool workers, jail
     * threads), directly under the JVM's top group: never inside a worker's group, whose threads
     * end with each activation.
     */
    public static final ThreadGroup RUNTIME_THREADS = new ThreadGroup(top(), "cpuslot-runtime");

    /** The threads whose start waits for the spawner. */
    private static final java.util.concurrent.SynchronousQueue<java.util.concurrent.FutureTask<Void>> STARTS = new java.util.concurrent.SynchronousQueue<>();

    /** Starts every runtime thread; never placed in a slot (see the class comment). */
    private static final Thread SPAWNER = spawner();

    /**
     * A daemon thread of the runtime's own, unstarted, wherever the thread that makes it runs: in
     * RUNTIME_THREADS, inheriting no activation (a thread made while a worker runs an activation
     * otherwise lands in the worker's group, and ends with the first activation there that
     * started a thread of its own). Its {@code start()} has the spawner start it.
     */
    public static Thread runtimeThread(String name, Runnable task) {
        return runtimeThread(RUNTIME_THREADS, name, task);
    }

    /** {@link #runtimeThread(String, Runnable)} in {@code group} (one under RUNTIME_THREADS). */
    public static Thread runtimeThread(ThreadGroup group, String name, Runnable task) {
        return new Spawned(group, name, false, task);
    }

    /** A runtime thread, started (by the spawner). */
    public static Thread startRuntimeThread(String name, Runnable task) {
        Thread t = runtimeThread(name, task);
        t.start();
        return t;
    }

    /** Makes runtime threads, each started by the spawner when its {@code start()} is called (the slot client's). */
    public static java.util.concurrent.ThreadFactory factory(String name) {
        java.util.concurrent.atomic.AtomicInteger n = new java.util.concurrent.atomic.AtomicInteger();
        return r -> runtimeThread(name + "-" + n.incrementAndGet(), r);
    }

    /**
     * Makes {@code make}'s value on a runtime thread: what it starts as it is made (the JDK's
     * HTTP client starts its selector thread in the maker's group, and cgroup) is the runtime's,
     * not a worker's.
     */
    public static <T> T makeOnRuntimeThread(String name, java.util.function.Supplier<T> make) {
        return makeOn(RUNTIME_THREADS, name, false, make);
    }

    /**
     * Makes {@code make}'s value on a new daemon thread in {@code group} (started by the spawner)
     * and waits for it, interrupted or not (the value is made once, for everyone, and an
     * interrupt does not stop what makes it); what {@code make} throws is thrown here.
     */
    public static <T> T makeOn(ThreadGroup group, String name, boolean inheritThreadLocals, java.util.function.Supplier<T> make) {
        Object[] out = new Object[1];
        Throwable[] failed = new Throwable[1];
        Thread t = new Spawned(group, name, inheritThreadLocals, () -> {
            try {
                out[0] = make.get();
            } catch (Throwable e) {
                failed[0] = e;
            }
        });
        t.start();
        uninterruptibly(() -> {
            t.join();
            return null;
        });
        if (failed[0] instanceof RuntimeException e) throw e;
        if (failed[0] instanceof Error e) throw e;
        if (failed[0] != null) throw new IllegalStateException(failed[0]);
        @SuppressWarnings("unchecked") T v = (T) out[0];
        return v;
    }

    /**
     * An executor on runtime threads (for the JDK's HTTP clients, whose default one makes threads
     * in the submitter's group), as a cached pool: a task goes to an idle thread of its own, else
     * to a new one, which waits a minute for the next. Not the JDK's pool: it starts its threads
     * itself, from the submitting thread (a worker, in its slot), not through {@code start()}.
     */
    public static java.util.concurrent.Executor runtimeExecutor(String name) {
        return runtimeExecutor(name, Integer.MAX_VALUE, 0);
    }

    /**
     * {@link #runtimeExecutor(String)} with at most {@code maxThreads} threads alive: a task that
     * finds them all busy waits for one, at most {@code maxWaiting} such tasks, and one more is
     * refused ({@link java.util.concurrent.RejectedExecutionException}). The submitter never waits.
     */
    public static java.util.concurrent.Executor runtimeExecutor(String name, int maxThreads, int maxWaiting) {
        return new Pool(name, maxThreads, maxWaiting);
    }

    /**
     * The cached pool of {@link #runtimeExecutor}. A task goes to the thread idle the shortest
     * time (its caches warm, as the JDK's SynchronousQueue hands off), else to a new thread, else
     * (at the bound) waits in a queue that every thread looks at before it idles; all under one
     * monitor, so a thread between two tasks is never missed.
     */
    private static final class Pool implements java.util.concurrent.Executor {
        private final String name;
        private final int maxThreads, maxWaiting;
        /** Idle threads, the latest last. */
        private final java.util.ArrayDeque<Idle> idle = new java.util.ArrayDeque<>();
        /** Tasks waiting for a thread: only while none is idle. */
        private final java.util.ArrayDeque<Runnable> queue = new java.util.ArrayDeque<>();
        private int alive, made;

        /** An idle thread, parked until it is handed a task. */
        private static final class Idle {
            final Thread thread = Thread.currentThread();
            /** Set (under the pool's monitor) once, when it is handed a task. */
            volatile Runnable task;
        }

        Pool(String name, int maxThreads, int maxWaiting) {
            this.name = name;
            this.maxThreads = maxThreads;
            this.maxWaiting = maxWaiting;
        }

        @Override
        public void execute(Runnable task) {
            java.util.Objects.requireNonNull(task);
            String thread;
            synchronized (this) {
                Idle w = idle.pollLast();
                if (w != null) {
                    w.task = task;
                    java.util.concurrent.locks.LockSupport.unpark(w.thread);
                    return;
                }
                if (alive >= maxThreads) {
                    if (queue.size() < maxWaiting) {
                        queue.add(task); // the first thread to finish its task takes it
                        return;
                    }
                    throw new java.util.concurrent.RejectedExecutionException(name + ": all " + maxThreads
                            + " threads busy and " + maxWaiting + " tasks waiting");
                }
                alive++;
                thread = name + "-" + ++made;
            }
            try {
                startRuntimeThread(thread, () -> serve(task));
            } catch (RuntimeException | Error e) { // no thread (the pids limit)
                synchronized (this) {
                    alive--;
                }
                throw e;
            }
        }

        /** A thread's life: its first task, then the next, until a minute passes without one. */
        private void serve(Runnable first) {
            Runnable r = first;
            try {
                for (; r != null; r = next()) r.run();
            } finally {
                if (r != null) { // the task threw: this thread ends with it
                    synchronized (this) {
                        alive--;
                    }
                }
            }
        }

        /**
         * The next task, or null after a minute idle (or an interrupt, a function's reach): then
         * this thread is counted out of {@link #alive} as it stops being idle, so no task waits for it.
         */
        private Runnable next() {
            Idle w = new Idle();
            synchronized (this) {
                Runnable r = queue.poll();
                if (r != null) return r;
                idle.addLast(w);
            }
            long deadline = System.nanoTime() + java.util.concurrent.TimeUnit.MINUTES.toNanos(1);
            while (true) {
                Runnable r = w.task;
                if (r != null) return r;
                long left = deadline - System.nanoTime();
                if (left <= 0 || Thread.interrupted()) {
                    synchronized (this) {
                        if (w.task != null) return w.task; // handed one meanwhile
                        idle.remove(w);
                        alive--;
                        return null;
                    }
                }
                java.util.concurrent.locks.LockSupport.parkNanos(this, left);
            }
        }
    }

    /**
     * A daemon thread whose {@code start()}, called from any thread, has the spawner start it
     * and returns once it has (what starting it threw is thrown here). Made by its caller (the
     * group, thread locals and context loader are the caller's to give), started by the spawner.
     */
    private static final class Spawned extends Thread {
        Spawned(ThreadGroup group, String name, boolean inheritThreadLocals, Runnable task) {
            super(group, task, name, 0, inheritThreadLocals);
            setDaemon(true);
        }

        @Override
        public void start() {
            if (Thread.currentThread() == SPAWNER) {
                super.start();
                return;
            }
            java.util.concurrent.FutureTask<Void> start = new java.util.concurrent.FutureTask<>(super::start, null);
            uninterruptibly(() -> {
                STARTS.put(start);
                return null;
            });
            try {
                uninterruptibly(start::get);
            } catch (java.util.concurrent.ExecutionException e) { // not started (started before, no memory for a thread)
                if (e.getCause() instanceof RuntimeException r) throw r;
                if (e.getCause() instanceof Error r) throw r;
                throw new IllegalStateException(e.getCause());
            }
        }
    }

    /** A wait that an interrupt ends early. */
    private interface Wait<T, E extends Exception> {
        T get() throws InterruptedException, E;
    }

    /**
     * What {@code wait} gives, waited for through any interrupt: the runtime's starts and makes
     * are done once, for everyone, whoever is interrupted meanwhile. The interrupt is kept: set
     * again when this returns or throws.
     */
    private static <T, E extends Exception> T uninterruptibly(Wait<T, E> wait) throws E {
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    return wait.get();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
        } finally {
            if (interrupted) Thread.currentThread().interrupt();
        }
    }

    private static Thread spawner() {
        Thread t = Thread.ofPlatform().daemon().group(RUNTIME_THREADS).inheritInheritableThreadLocals(false)
                .name("cpuslot-spawner").unstarted(() -> {
                    while (true) {
                        try {
                            STARTS.take().run(); // what it throws goes back to the caller
                        } catch (Throwable e) { // interrupted (a function's reach: ignored), or no memory: go on
                        }
                    }
                });
        t.start();
        return t;
    }

    private static ThreadGroup top() {
        ThreadGroup g = Thread.currentThread().getThreadGroup();
        while (g.getParent() != null) g = g.getParent();
        return g;
    }
}
