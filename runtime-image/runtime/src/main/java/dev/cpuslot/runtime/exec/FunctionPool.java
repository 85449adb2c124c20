package dev.cpuslot.runtime.exec;

import com.google.gson.JsonElement;
import dev.cpuslot.runtime.guard.Activations;
import dev.cpuslot.runtime.guard.RuntimeThreads;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.Ending;
import dev.cpuslot.slot.ReleaseOutcome;
import dev.cpuslot.slot.SlotClient;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;

import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BooleanSupplier;
import dev.cpuslot.runtime.base.Metrics;

/**
 * A bounded pool of workers for one function. Each worker is a platform thread that owns one
 * sandbox and runs one invocation at a time: it takes a CPU slot for the invocation (the slot
 * client places this very thread), runs the function, and ends the lease with its outcome
 * ({@link SlotLease#end}: the slot client decides what is read and sent before the answer and
 * what after it).
 *
 * <p>At the deadline the caller gets an error at once; the worker's sandbox is cancelled
 * (polyglot contexts are closed, Java threads interrupted), its slot is released with outcome
 * TIMEOUT once the worker has left it (no other invocation gets a slot where a thread of an
 * ended invocation still runs: {@link HeldSlot}), and the worker is retired (a Java function that
 * ignores interrupts keeps its thread, counted as abandoned, until it returns).
 */
public final class FunctionPool implements AutoCloseable {
    /**
     * What the caller gets back. {@code usageLater} null: {@code usage} is the invocation's final
     * figure. Otherwise the slot's counters are read after the caller has its answer (the task did
     * not ask for its usage in the reply): {@code usage} is {@link Usage#NONE} and
     * {@code usageLater} completes with the measured usage once the worker has read them.
     */
    public record Outcome(JsonElement result, String error, boolean timedOut, SlotLease lease, Usage usage,
                          long runNanos, CompletableFuture<Usage> usageLater) {
        public Outcome(JsonElement result, String error, boolean timedOut, SlotLease lease, Usage usage, long runNanos) {
            this(result, error, timedOut, lease, usage, runNanos, null);
        }
    }

    /**
     * One invocation handed to a worker; {@code hop}: its place in a chain (null: no chain calls);
     * {@code usageInReply}: the caller needs the invocation's usage in its {@link Outcome} (read
     * before the outcome is handed back); false: the counters are read after (see
     * {@link Outcome#usageLater()}).
     */
    public record Task(JsonElement args, Map<String, String> env, long quotaMilli, String action, String activationId,
                       Hop hop, boolean usageInReply) {
        public Task(JsonElement args, Map<String, String> env, long quotaMilli, String action, String activationId) {
            this(args, env, quotaMilli, action, activationId, null, true);
        }
        public Task(JsonElement args, Map<String, String> env, long quotaMilli, String action, String activationId,
                    Hop hop) {
            this(args, env, quotaMilli, action, activationId, hop, true);
        }
    }

    private final Function fn;
    private final int max;
    private final long idleNanos;
    private final SlotClient slots;
    private final Metrics metrics;
    private final Semaphore permits;
    private final ConcurrentLinkedDeque<Worker> idle = new ConcurrentLinkedDeque<>();
    private final AtomicInteger live = new AtomicInteger(), busy = new AtomicInteger();
    private final AtomicLong created = new AtomicLong(), abandoned = new AtomicLong();
    private volatile boolean closed;
    private static final AtomicLong WORKER_IDS = new AtomicLong();

    private final Runaways runaways;
    /** Added to on every invocation with a slot: held rather than looked up each time. */
    private final io.prometheus.metrics.core.datapoints.CounterDataPoint acquireSeconds, releaseSeconds;
    private final io.prometheus.metrics.core.datapoints.DistributionDataPoint acquireLatency;
    /** The function's reserved CPU (quota x time held) and its leases' sleep: its idle ratio beside its CPU. */
    private final io.prometheus.metrics.core.datapoints.CounterDataPoint reservedSeconds, sleptSeconds;
    /** The heap bytes the function's workers allocated in its activations: which tenant makes the collector work. */
    private final io.prometheus.metrics.core.datapoints.CounterDataPoint allocatedBytes;
    private static final com.sun.management.ThreadMXBean THREAD_BEAN =
            (com.sun.management.ThreadMXBean) java.lang.management.ManagementFactory.getThreadMXBean();
    private final Metrics.Labels labels;

    public FunctionPool(Function fn, int max, long idleMs, SlotClient slots, Metrics metrics) {
        this(fn, max, idleMs, slots, metrics, null);
    }

    public FunctionPool(Function fn, int max, long idleMs, SlotClient slots, Metrics metrics, Runaways runaways) {
        this.runaways = runaways;
        this.fn = fn;
        this.max = max;
        this.idleNanos = TimeUnit.MILLISECONDS.toNanos(idleMs);
        this.slots = slots;
        this.metrics = metrics;
        this.permits = new Semaphore(max, true);
        this.acquireSeconds = metrics.counter("cpuslot_slot_acquire_seconds_total", Metrics.NONE);
        this.acquireLatency = metrics.histogram("cpuslot_slot_acquire_seconds", Metrics.NONE, Metrics.ACQUIRE_BUCKETS);
        this.releaseSeconds = metrics.counter("cpuslot_slot_release_seconds_total", Metrics.NONE);
        this.labels = Metrics.labels("function", fn.name());
        this.reservedSeconds = metrics.counter("cpuslot_slot_reserved_seconds_total", labels);
        this.sleptSeconds = metrics.counter("cpuslot_slot_slept_seconds_total", labels);
        this.allocatedBytes = metrics.counter("cpuslot_allocated_bytes_total", labels);
    }

    /** The function's metric labels ({@code function="..."}), built once. */
    public Metrics.Labels labels() { return labels; }

    public Function function() { return fn; }
    public int max() { return max; }
    public int live() { return live.get(); }
    public int busy() { return busy.get(); }
    public int idle() { return idle.size(); }
    public long created() { return created.get(); }
    public long abandoned() { return abandoned.get(); }

    /**
     * Starts the pool's first worker before its first invocation (at /init or /register): its
     * thread, its slot client state and its sandbox (for a polyglot function the context /init
     * made, entered once on this thread) are ready when the first call comes, which then only
     * hands it the job. It waits in the pool as an idle worker, and does not retire when idle
     * before that first job.
     */
    public void prestart() {
        if (closed || created.get() > 0) return;
        idle.addFirst(new Worker(true));
    }

    /** Runs one invocation; never returns later than the deadline (System.nanoTime based). */
    public Outcome invoke(Task task, long deadlineNanos) throws InterruptedException {
        long wait = deadlineNanos - System.nanoTime();
        if (wait <= 0 || !permits.tryAcquire(wait, TimeUnit.NANOSECONDS))
            return new Outcome(null, "no free sandbox before the deadline", true, null, Usage.NONE, 0);
        Worker w = null;
        Job job = new Job(task);
        try {
            if (closed) return new Outcome(null, "the function was removed", false, null, Usage.NONE, 0);
            w = idle.pollFirst();
            if (w == null) w = new Worker();
            w.hand(job);
        } catch (RuntimeException e) {
            permits.release();
            throw e;
        }
        try {
            long rem = deadlineNanos - System.nanoTime();
            return job.result.get(Math.max(0, rem), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
            if (job.claimed.compareAndSet(false, true)) {
                // the worker has not finished: cancel it, give the slot back, free the permit now;
                // if it does not stop, confine it
                w.retire(job);
                if (runaways != null) {
                    Worker rw = w;
                    runaways.watch(fn.name(), rw.thread, rw.tid, () -> rw.current == job);
                }
                SlotLease l = job.lease;
                Worker ww = w;
                // the worker (or a thread of its activation) may run on in the slot past the deadline
                BooleanSupplier inSlot = () -> ww.current == job && !Activations.movedOut(ww.thread)
                        || Activations.leftBehind(ww.thread, job.started);
                Usage u = l == null ? Usage.NONE
                        : l.active() && inSlot.getAsBoolean() ? HeldSlot.hold(l, ReleaseOutcome.TIMEOUT, job::reservedOnly, inSlot)
                        : l.end(ReleaseOutcome.TIMEOUT, true, job::reservedOnly).finish();
                permits.release();
                return new Outcome(null, "the action exceeded its time limit", true, l, u,
                        System.nanoTime() - job.started);
            }
            // finished at the very last moment
            try {
                return job.result.get();
            } catch (ExecutionException ee) {
                throw new IllegalStateException(ee.getCause());
            }
        } catch (ExecutionException e) {
            throw new IllegalStateException(e.getCause());
        } catch (InterruptedException e) {
            if (job.claimed.compareAndSet(false, true)) {
                w.retire(job);
                if (job.lease != null) job.lease.end(ReleaseOutcome.FAILED, true, null).finish();
                permits.release();
            }
            throw e;
        }
    }

    /** One invocation between its caller and its worker; told when its lease's usage is final (for the pool's metrics). */
    private final class Job implements Ending.Listener {
        final Task task;
        final CompletableFuture<Outcome> result = new CompletableFuture<>();
        final AtomicBoolean claimed = new AtomicBoolean();
        volatile SlotLease lease;
        volatile long started = System.nanoTime();
        /** When the worker got its lease (System.nanoTime). */
        volatile long heldFrom;
        /** Where the activation prints: the caller's (ActivationOutput.enter before invoke). */
        final ActivationOutput.Capture output = ActivationOutput.current();
        /** The function's result or error: the worker's alone until it completes the job. */
        JsonElement value;
        String error;
        Job(Task task) { this.task = task; }

        @Override
        public void ended(SlotLease l, Usage u, long until, long nanos) {
            releaseSeconds.inc(nanos / 1e9);
            reservedOnly(l, u, until, nanos);
        }

        /** What a lease ended by the caller at the deadline reserved (its release is not a worker's time). */
        void reservedOnly(SlotLease l, Usage u, long until, long nanos) {
            FunctionPool.this.reserved(l, u, heldFrom, until);
        }
    }

    private final class Worker {
        final SynchronousQueue<Job> inbox = new SynchronousQueue<>();
        final Thread thread;
        volatile Function.Sandbox sandbox;
        volatile boolean retired;
        volatile int tid;
        volatile Job current;
        /**
         * Made by {@link #prestart} and not yet given a job (its loop's own): it makes its sandbox
         * before its first job, and does not retire before it.
         */
        private boolean beforeFirstJob;

        Worker() { this(false); }

        Worker(boolean prestarted) {
            this.beforeFirstJob = prestarted;
            live.incrementAndGet();
            created.incrementAndGet();
            // a worker is the runtime's: made on a chain caller's thread, it must not inherit
            // (nor count against) that Java function's activation
            // a thread group of its own, named as the worker: the threads its activations start
            // join it, so the end of each activation finds them (Activations.end); under the
            // runtime's group, not the creating thread's (a chain caller's worker would hold it)
            String name = "fn-" + fn.name() + "-" + WORKER_IDS.incrementAndGet();
            thread = RuntimeThreads.runtimeThread(new ThreadGroup(RuntimeThreads.RUNTIME_THREADS, name), name, this::loop);
            thread.start();
        }

        void hand(Job j) {
            try {
                inbox.put(j);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("interrupted handing work to a worker");
            }
        }

        /** Called by the caller at the deadline. */
        void retire(Job j) {
            retired = true;
            abandoned.incrementAndGet();
            metrics.inc("cpuslot_sandboxes_abandoned_total", Metrics.labels("function", fn.name()));
            Function.Sandbox s = sandbox;
            if (s != null) {
                try {
                    s.cancel(thread);
                } catch (RuntimeException ignored) {
                }
            } else {
                Load.Making m = making; // a sandbox being made runs the function's top level
                if (m != null) m.cancel();
                thread.interrupt();
            }
        }

        /** The sandbox being made for a job, stopped by {@link #retire}; null: none. */
        private volatile Load.Making making;

        private void loop() {
            try {
                if (dev.cpuslot.slot.Native.available()) tid = dev.cpuslot.slot.Native.gettid();
                // before the first job: the thread's slot-client state (native scratch memory)
                // would otherwise be set up inside the first invocation's acquire budget
                if (slots != null) {
                    try {
                        slots.prepareThread();
                    } catch (RuntimeException ignored) {
                    }
                }
                // a job handed meanwhile waits in the inbox, so no second sandbox is made for it
                if (beforeFirstJob && !closed) {
                    try {
                        sandbox = fn.newSandbox();
                        metrics.sandboxCreated(fn.name());
                        sandbox.prepareThread();
                    } catch (Exception | LinkageError e) { // the first job makes it again and reports why
                    }
                }
                while (!closed && !retired) {
                    Job j;
                    try {
                        j = inbox.poll(idleNanos, TimeUnit.NANOSECONDS);
                    } catch (InterruptedException e) {
                        if (retired || closed) break;
                        continue;
                    }
                    if (j == null) {
                        // idle too long: retire; a prestarted worker not before its first job, whose
                        // sandbox is the one /init made (its context would otherwise be made again)
                        if (!beforeFirstJob && idle.remove(this)) break;
                        continue; // someone is about to hand us work
                    }
                    beforeFirstJob = false;
                    run(j);
                }
            } finally {
                live.decrementAndGet();
                Function.Sandbox s = sandbox;
                if (s != null) s.close();
            }
        }

        private void run(Job j) {
            current = j;
            ActivationOutput.enter(j.output); // what the function and its threads print
            try {
                runJob(j);
            } finally {
                ActivationOutput.leave();
                current = null;
            }
        }

        /**
         * The worker's job: the slot, a sandbox, the function until it returns or the deadline
         * cancels it, the lease ended with its outcome, the job completed.
         */
        private void runJob(Job j) {
            busy.incrementAndGet();
            try {
                j.started = System.nanoTime();
                // the slot first: a new sandbox runs the function's code (a module's top level) again
                if (slots != null && j.task.quotaMilli() > 0) acquire(j);
                if (j.error == null && sandbox == null) newSandbox(j);
                long t0 = System.nanoTime();
                if (j.error == null && !j.claimed.get()) call(j);
                complete(j, System.nanoTime() - t0);
            } catch (RuntimeException | Error e) {
                if (j.lease != null) {
                    try {
                        // a held slot must not stay claimed (nothing more if it was given back)
                        j.lease.end(ReleaseOutcome.FAILED, true, null).finish();
                    } catch (RuntimeException ignored) {
                    }
                }
                if (j.claimed.compareAndSet(false, true)) {
                    busy.decrementAndGet();
                    retired = true;
                    permits.release();
                    j.result.complete(new Outcome(null, "runtime error: " + e, false, j.lease, Usage.NONE, 0));
                }
            }
        }

        private void newSandbox(Job j) {
            Load.Making m = new Load.Making();
            making = m;
            if (retired) m.cancel(); // the caller gave up before it could see it
            try {
                sandbox = Load.making(m, fn::newSandbox);
                metrics.sandboxCreated(fn.name());
            } catch (Exception e) {
                j.error = "could not create a sandbox: " + e.getMessage();
            } finally {
                making = null;
            }
        }

        /** The job's slot, this thread placed in it; a lease the caller may have missed at its deadline is ended here. */
        private void acquire(Job j) {
            Task t = j.task;
            long a0 = System.nanoTime();
            SlotLease lease = null;
            try {
                lease = slots.acquire(t.quotaMilli(), t.action(), t.activationId(), t.usageInReply());
            } catch (RuntimeException e) { // fail-closed
                j.error = "no CPU slot: " + e.getMessage();
            }
            j.heldFrom = System.nanoTime();
            double took = (j.heldFrom - a0) / 1e9;
            acquireSeconds.inc(took);
            acquireLatency.observe(took);
            j.lease = lease;
            if (j.claimed.get() && lease != null) lease.end(ReleaseOutcome.TIMEOUT, true, null).finish();
        }

        /** Runs the function in the sandbox, inside the job's hop; its result or error into the job. */
        private void call(Job j) {
            Task t = j.task;
            if (t.hop() != null) t.hop().enter(j.lease);
            long alloc0 = THREAD_BEAN.getCurrentThreadAllocatedBytes();
            try {
                j.value = sandbox.invoke(t.args(), t.env());
            } catch (Function.FunctionError e) {
                j.error = e.getMessage();
                // the action's own error, for its logs (polyglot sandboxes print theirs)
                if (e.getCause() != null && !(e.getCause() instanceof org.graalvm.polyglot.PolyglotException))
                    e.getCause().printStackTrace(System.err);
            } catch (Exception e) {
                j.error = e.toString();
            } finally {
                long alloc = THREAD_BEAN.getCurrentThreadAllocatedBytes() - alloc0;
                boolean counted = alloc0 >= 0 && alloc >= 0;
                if (counted) allocatedBytes.inc(alloc);
                if (t.hop() != null) {
                    long slept = t.hop().exit(counted ? alloc : -1);
                    if (slept > 0) sleptSeconds.inc(slept / 1e9);
                }
            }
        }

        /**
         * Ends the lease with the job's outcome and completes the job, unless the caller gave up on
         * it at the deadline. The worker is back in the pool before the answer (a job handed to it
         * meanwhile waits in its inbox); what the slot client leaves for after the answer (the
         * RELEASE, a usage read later) is done before the worker takes that job.
         */
        private void complete(Job j, long ran) {
            if (!j.claimed.compareAndSet(false, true)) {
                busy.decrementAndGet();
                retired = true; // caller gave up on us: this sandbox is cancelled
                return;
            }
            SlotLease lease = j.lease;
            ReleaseOutcome outcome = j.error == null ? ReleaseOutcome.OK : ReleaseOutcome.FAILED;
            Thread self = thread;
            long since = j.started;
            Ending end = lease == null ? Ending.NONE
                    : !(lease.active() && Activations.leftBehind(self, since)) ? lease.end(outcome, j.task.usageInReply(), j)
                    : Ending.measured(HeldSlot.hold(lease, outcome, j, () -> Activations.leftBehind(self, since)));
            Thread.interrupted(); // clear a stray interrupt before going back to the pool
            boolean reuse = !sandbox_poisoned() && !closed;
            busy.decrementAndGet();
            if (reuse) idle.addFirst(this);
            else retired = true;
            permits.release();
            j.result.complete(new Outcome(j.value, j.error, false, lease, end.usage(), ran, end.later()));
            end.finish();
        }

        private boolean sandbox_poisoned() {
            Function.Sandbox s = sandbox;
            return s == null || s.poisoned();
        }
    }

    /**
     * Counts what a lease reserved, its granted quota in cores times the time it was held
     * ({@code from} to {@code until}), when its usage was measured, on its own or in a batch: the
     * invocations whose CPU cpuslot_slot_cpu_seconds_total counts, so that 1 - cpu / reserved is
     * their idle ratio.
     */
    private void reserved(SlotLease l, Usage u, long from, long until) {
        if (l != null && l.active() && (u.measured() || l.batched()) && until > from)
            reservedSeconds.inc(l.quotaMilli() / 1000.0 * ((until - from) / 1e9));
    }

    @Override
    public void close() {
        closed = true;
        Worker w;
        while ((w = idle.pollFirst()) != null) w.thread.interrupt();
        fn.close();
    }
}
