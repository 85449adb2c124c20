package dev.cpuslot.runtime.chain;

import com.google.gson.JsonElement;
import dev.cpuslot.chain.Chain;
import dev.cpuslot.chain.ChainException;
import dev.cpuslot.chain.ChainException.Kind;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.SlotLease;

import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.exec.FunctionPool;
import dev.cpuslot.runtime.exec.Hosted;
import dev.cpuslot.runtime.exec.Hop;

/**
 * Local chaining (docs/chaining.md): a function calls another function of the same owner hosted in
 * this runtime, in process. The callee's invocation goes to its own pool as any invocation does,
 * so it runs on its own worker, in its own slot at its own quota (local leasing: no message to the
 * agent when a held slot is free), accounted to its own action. What the bus adds are the limits:
 * same owner, bounded depth and fan-out, a callee deadline never past the caller's.
 */
public final class LocalBus {
    /** What the runtime gives the bus: the hosted functions and how to run one hop. */
    public interface Host {
        Hosted find(String function);

        /** Runs one hop to the end (or its deadline); metrics and log line included. */
        FunctionPool.Outcome run(Hosted callee, JsonElement args, Hop hop, String mode);
    }

    /** What the answer reports of a chain: each synchronous hop (in the order they finished) and the CPU they used. */
    public static final class Trace {
        private static final int MAX_LISTED = 32;
        private final List<String> hops = new ArrayList<>();
        private long cpuNanos;
        private int count;
        private boolean measured;
        /**
         * The chain's conductor accounting (ConductorFunction): component calls and conductor runs
         * so far, shared by nested compositions as OpenWhisk shares them, so that the limits hold
         * for the whole chain.
         */
        final AtomicInteger components = new AtomicInteger(), conductorRuns = new AtomicInteger();

        public synchronized void add(String function, long cpuNanos, boolean measured) {
            count++;
            if (measured) {
                this.cpuNanos += cpuNanos;
                this.measured = true;
            }
            // a header value: a function's name is the tenant's, so only plain characters go in
            if (hops.size() < MAX_LISTED) hops.add(function.replaceAll("[^A-Za-z0-9._:/@-]", "_") + "=" + (measured ? Long.toString(cpuNanos) : "-"));
        }

        public synchronized int count() { return count; }

        public synchronized long cpuNanos() { return cpuNanos; }

        /** Whether any hop's CPU was measured (a hop without a slot has no figure). */
        public synchronized boolean measured() { return measured; }

        /** {@code f=123,g=-} (CPU ns; "-": not measured, no slot), at most 32 listed. */
        public synchronized String listed() {
            return String.join(",", hops) + (count > hops.size() ? ",..." : "");
        }
    }

    /** One activation in a chain: its identity, limits and the bus its function calls through. */
    public final class Hop implements Chain.Bus, dev.cpuslot.runtime.exec.Hop {
        public final String function, owner, activationId;
        /** The calling hop's activation id (null: the platform's activation, the chain's first). */
        public final String callerId;
        public final int depth;
        public final long deadlineNanos;
        public final Trace trace;
        /** The platform the chain's first activation came from: the path to callees not hosted here. */
        final PlatformPath.Origin origin;
        final AtomicInteger asyncCalls = new AtomicInteger();
        /** The activation's slot lease (set by its worker once acquired; null: none). */
        volatile SlotLease lease;
        /** The action's lending setting (Quota#lend, set by the runtime): its lease sleeps in its synchronous calls. */
        public volatile boolean lends;
        /**
         * How long the lease slept in synchronous calls (cpuslot_slot_slept_seconds_total). Calls
         * made at once by threads of one Java function each count their own wait.
         */
        final AtomicLong sleptNanos = new AtomicLong();
        /** Heap bytes the activation's worker allocated (set by the worker as it ends; -1: not measured): its log line's alloc_bytes. */
        public volatile long allocatedBytes = -1;

        Hop(String function, String owner, String activationId, String callerId, int depth, long deadlineNanos, Trace trace,
            PlatformPath.Origin origin) {
            this.function = function;
            this.owner = owner == null ? "" : owner;
            this.activationId = activationId;
            this.callerId = callerId;
            this.depth = depth;
            this.deadlineNanos = deadlineNanos;
            this.trace = trace;
            this.origin = origin == null ? PlatformPath.Origin.NONE : origin;
        }

        /**
         * Puts the activation's lease to sleep for a synchronous call: the lease to {@link #wake}
         * after it, or null (no lease, the action does not lend, or the agent does not: nothing sent).
         */
        SlotLease sleep() {
            SlotLease l = lease;
            return l != null && lends && l.sleep() ? l : null;
        }

        /** Wakes {@code l} after a call that began at {@code since} (System.nanoTime), counting the sleep. */
        void wake(SlotLease l, long since) {
            l.wake();
            sleptNanos.addAndGet(System.nanoTime() - since);
        }

        /** The worker starts the activation on its thread: binds this hop there, its chain calls to sleep on {@code l}. */
        @Override
        public void enter(SlotLease l) {
            lease = l;
            LocalBus.enter(this);
        }

        /** The worker ends the activation: unbinds the hop from its thread; how long its lease slept. */
        @Override
        public long exit(long allocated) {
            if (allocated >= 0) allocatedBytes = allocated;
            LocalBus.exit();
            return sleptNanos.get();
        }

        @Override
        public JsonElement call(String callee, JsonElement args) { return LocalBus.this.call(this, callee, args, false); }

        @Override
        public void callAsync(String callee, JsonElement args) { LocalBus.this.call(this, callee, args, true); }
    }

    private static final ThreadLocal<Hop> CURRENT = new ThreadLocal<>();

    private final Host host;
    private final PlatformPath platform;
    private final Metrics metrics;
    private final int maxDepth, maxAsync, maxPending;
    /** Asynchronous calls pending per owner (an owner's entry goes with its last call): one owner cannot fill another's. */
    private final java.util.concurrent.ConcurrentHashMap<String, Long> pending = new java.util.concurrent.ConcurrentHashMap<>();
    /**
     * The threads asynchronous calls run on: the runtime's, started outside any slot. Not virtual
     * threads: starting one from the calling worker may make the scheduler's carrier there, in
     * the caller's slot, where it would serve every virtual thread after.
     */
    private final java.util.concurrent.Executor asyncThreads = dev.cpuslot.runtime.guard.RuntimeThreads.runtimeExecutor("chain-async");

    public LocalBus(Host host, PlatformPath platform, Metrics metrics, int maxDepth, int maxAsync, int maxPending) {
        this.host = host;
        this.platform = platform;
        this.metrics = metrics;
        this.maxDepth = maxDepth;
        this.maxAsync = maxAsync;
        this.maxPending = maxPending;
    }

    /**
     * The first hop here of a chain: an activation the platform sent, at {@code depth} (0, or the
     * depth its caller's chain sent with it through the platform).
     */
    public Hop root(String function, String owner, String activationId, long deadlineNanos, int depth, PlatformPath.Origin origin) {
        return new Hop(function, owner, activationId, null, depth, deadlineNanos, new Trace(), origin);
    }

    /** The depth an activation arrived with ({@value PlatformPath#DEPTH_PARAM}, removed from its value): 0 when absent. */
    public int arrivedDepth(JsonElement value) {
        if (value == null || !value.isJsonObject() || !value.getAsJsonObject().has(PlatformPath.DEPTH_PARAM)) return 0;
        JsonElement d = value.getAsJsonObject().remove(PlatformPath.DEPTH_PARAM);
        long n;
        try {
            n = d.isJsonPrimitive() && d.getAsJsonPrimitive().isNumber() ? d.getAsJsonPrimitive().getAsBigDecimal().longValueExact() : -1;
        } catch (ArithmeticException e) {
            n = -1;
        }
        if (n < 0) throw new IllegalArgumentException(PlatformPath.DEPTH_PARAM + " is not a depth (0 or more): " + d);
        return (int) Math.min(n, (long) maxDepth + 1);
    }

    // ---- declared sequences -----------------------------------------------------------------

    /** Most steps in a declared sequence: OpenWhisk's default (whisk.actionSequenceLimit). */
    static final int MAX_STEPS = 50;

    /** A declared sequence's steps ({@code a,b,pkg/c}), checked: 1 to 50 names a platform would accept. */
    public static List<String> parseSteps(String spec) {
        List<String> steps = new ArrayList<>();
        if (spec != null) for (String s : spec.split(",", -1)) steps.add(s.trim());
        if (steps.isEmpty() || (steps.size() == 1 && steps.get(0).isEmpty()))
            throw new IllegalArgumentException("no steps named (steps=a,b,c)");
        if (steps.size() > MAX_STEPS) throw new IllegalArgumentException(steps.size() + " steps, more than " + MAX_STEPS);
        for (String s : steps) {
            if (!PlatformPath.isStepName(s)) throw new IllegalArgumentException("not a function name: '" + s + "'");
        }
        return List.copyOf(steps);
    }

    /**
     * Runs {@code steps} as an OpenWhisk sequence does (SequenceActions.scala): the result of step
     * i is the input of step i+1, each step a chain call of its own (local first, then the
     * platform's path), and a step whose result has an {@code error} field ends the sequence with
     * that result; a step that fails ends it with its ChainException.
     */
    JsonElement sequence(Hop from, List<String> steps, JsonElement input) {
        JsonElement cur = input;
        for (String step : steps) {
            cur = call(from, step, cur, false, "sequence");
            if (cur.isJsonObject() && cur.getAsJsonObject().has("error")) break;
        }
        return cur;
    }

    /**
     * The steps an action declared to follow it (its init env {@value #STEPS_ENV}): run on its
     * result once it succeeded; the last step's result (or error) becomes the activation's.
     */
    public FunctionPool.Outcome then(Hop hop, String steps, FunctionPool.Outcome o) {
        if (steps == null || steps.isBlank() || o.error() != null || o.result() == null
                || !(o.result().isJsonObject() || o.result().isJsonArray())
                || (o.result().isJsonObject() && o.result().getAsJsonObject().has("error"))) return o;
        hop.lease = null; // the action's own slot is released: nothing to sleep on while its steps run
        try {
            JsonElement r = sequence(hop, parseSteps(steps), o.result());
            return new FunctionPool.Outcome(r, null, false, o.lease(), o.usage(), o.runNanos());
        } catch (IllegalArgumentException e) {
            return new FunctionPool.Outcome(null, STEPS_ENV + ": " + e.getMessage(), false, o.lease(), o.usage(), o.runNanos());
        } catch (ChainException e) {
            return new FunctionPool.Outcome(null, e.toString(), e.kind() == Kind.TIMEOUT, o.lease(), o.usage(), o.runNanos());
        }
    }

    /** One component of a conductor's composition (ConductorFunction): a synchronous chain call of its own. */
    JsonElement component(Hop from, String callee, JsonElement params) {
        return call(from, callee, params, false, "conductor");
    }

    /** The init env (or /register steps) that declares a function's next steps. */
    public static final String STEPS_ENV = "CPUSLOT_CHAIN_STEPS";

    /** The running activation's hop (the thread that runs its main), or null. */
    static Hop current() { return CURRENT.get(); }

    /** Binds the hop to the worker thread for the activation: {@link Chain}, which Java functions and guest code (lang) call through. */
    static void enter(Hop hop) {
        CURRENT.set(hop);
        Chain.bind(hop);
    }

    static void exit() {
        CURRENT.remove();
        Chain.bind(null);
    }

    private JsonElement call(Hop from, String callee, JsonElement args, boolean async) {
        return call(from, callee, args, async, async ? "async" : "sync");
    }

    private JsonElement call(Hop from, String callee, JsonElement args, boolean async, String mode) {
        String name = callee == null ? "" : callee.trim();
        try {
            if (name.isEmpty()) throw new ChainException(Kind.NOT_LOCAL, name, "no function named");
            int depth = from.depth + 1;
            if (depth > maxDepth)
                throw new ChainException(Kind.DEPTH, name, "the chain is " + from.depth + " calls deep, the bound (CPUSLOT_CHAIN_MAX_DEPTH=" + maxDepth + ")");
            Hosted h = host.find(name);
            if (h == null) return global(from, name, args, async, mode, depth); // local first, then global
            // explicit, whatever the runtime's owner setting: a chain stays with its owner
            if (!h.owner().equals(from.owner))
                throw new ChainException(Kind.OTHER_OWNER, name, "it belongs to another owner than the caller '" + from.function + "'");
            long now = System.nanoTime();
            long deadline = from.deadlineNanos;
            if (h.timeoutMs() > 0) deadline = Math.min(deadline, now + TimeUnit.MILLISECONDS.toNanos(h.timeoutMs()));
            if (deadline - now <= 0) throw new ChainException(Kind.TIMEOUT, name, "no time left before the caller's deadline");
            String id = UUID.randomUUID().toString().replace("-", "");
            if (!async) {
                Hop hop = new Hop(name, h.owner(), id, from.activationId, depth, deadline, from.trace, from.origin);
                // The caller waits for the callee and uses no CPU meanwhile: its lease sleeps for
                // exactly the wait, so the agent may lend its quota (docs/lending.md). Nothing
                // is sent unless the agent announced LEND.
                long since = System.nanoTime();
                SlotLease asleep = from.sleep();
                FunctionPool.Outcome o;
                try {
                    // copies both ways: no JSON object is shared between two functions
                    o = host.run(h, args.deepCopy(), hop, mode);
                } finally {
                    if (asleep != null) from.wake(asleep, since);
                }
                if (o.error() != null)
                    throw new ChainException(o.timedOut() ? Kind.TIMEOUT : Kind.FAILED, name, o.error());
                JsonElement r = o.result();
                if (r == null || !(r.isJsonObject() || r.isJsonArray()))
                    throw new ChainException(Kind.FAILED, name, "the callee did not return a dictionary");
                return r.deepCopy();
            }
            // its own trace: the caller's answer may be gone before it ends; its log line and metrics report it
            Hop hop = new Hop(name, h.owner(), id, from.activationId, depth, deadline, new Trace(), from.origin);
            JsonElement a = args.deepCopy();
            startAsync(from, name, HopRecord.started(id, name, depth, "local", from.activationId), () -> {
                try {
                    host.run(h, a, hop, mode);
                } catch (RuntimeException | Error e) {
                    Log.warn("asynchronous chain call to " + name + " failed in the runtime: " + e);
                }
            });
            return null;
        } catch (ChainException e) {
            if (e.kind() != Kind.FAILED && e.kind() != Kind.TIMEOUT && e.kind() != Kind.PLATFORM) // those are counted with the hop
                metrics.inc("cpuslot_chain_calls_total", Metrics.labels("function", name, "mode", mode, "status", e.kind().name().toLowerCase()));
            throw e;
        }
    }

    /**
     * A callee this runtime does not host, through the platform's path (PlatformPath): the name
     * checked before anything is sent, the caller's deadline and depth with the call, the caller's
     * lease asleep while it waits, a log line (written off the critical path) and the metrics.
     */
    private JsonElement global(Hop from, String name, JsonElement args, boolean async, String mode, int depth) {
        PlatformPath.Target t = platform.target(from.origin, from.owner, name);
        long deadline = from.deadlineNanos;
        if (deadline - System.nanoTime() <= 0) throw new ChainException(Kind.TIMEOUT, name, "no time left before the caller's deadline");
        JsonElement a = args.deepCopy();
        if (!async) {
            long since = System.nanoTime();
            SlotLease asleep = from.sleep();
            try {
                return remoteHop(from, t, name, a, depth, deadline, false, mode).result();
            } finally {
                if (asleep != null) from.wake(asleep, since);
            }
        }
        startAsync(from, name, HopRecord.started(null, name, depth, t.kind(), from.activationId), () -> {
            try {
                remoteHop(from, t, name, a, depth, deadline, true, mode);
            } catch (RuntimeException | Error e) {
                // reported by its log line and metrics
            }
        });
        return null;
    }

    /**
     * Runs {@code call}, an asynchronous call from {@code from}, within the bounds on asynchronous
     * calls per activation and per owner, on the runtime's thread, not the caller's: no
     * inherited activation, not in its thread count.
     */
    private void startAsync(Hop from, String name, HopRecord started, Runnable call) {
        if (from.asyncCalls.incrementAndGet() > maxAsync)
            throw new ChainException(Kind.FAN_OUT, name, "more than " + maxAsync + " asynchronous calls from one activation (CPUSLOT_CHAIN_MAX_ASYNC)");
        String owner = from.owner;
        boolean[] taken = new boolean[1];
        pending.compute(owner, (k, n) -> {
            long have = n == null ? 0 : n;
            taken[0] = have < maxPending;
            return taken[0] ? have + 1 : n;
        });
        if (!taken[0])
            throw new ChainException(Kind.FAN_OUT, name, maxPending + " asynchronous calls of this owner are pending in this runtime (CPUSLOT_CHAIN_MAX_PENDING)");
        Runnable done = () -> pending.computeIfPresent(owner, (k, n) -> n <= 1 ? null : n - 1);
        // the caller's log has the call (as an OpenWhisk caller has the id of a non-blocking invoke); its end is in the runtime's log
        ActivationOutput.Capture callerLog = ActivationOutput.current();
        if (callerLog != null) callerLog.record(started);
        try {
            asyncThreads.execute(() -> {
                try {
                    call.run();
                } finally {
                    done.run();
                }
            });
        } catch (RuntimeException | Error e) {
            done.run();
            throw new ChainException(Kind.FAILED, name, "could not start: " + e);
        }
    }

    private PlatformPath.Result remoteHop(Hop from, PlatformPath.Target t, String name, JsonElement args, int depth, long deadline,
                                          boolean async, String mode) {
        long t0 = System.nanoTime();
        String status = "ok", error = null;
        PlatformPath.Result r = null;
        try {
            r = platform.call(t, name, args, depth, deadline, async);
            return r;
        } catch (ChainException e) {
            status = e.kind() == Kind.TIMEOUT ? "timeout" : e.kind() == Kind.PLATFORM ? "platform" : "error";
            error = e.getMessage();
            throw e;
        } finally {
            if (!async) from.trace.add(name, 0, false);
            metrics.inc("cpuslot_chain_calls_total", Metrics.labels("function", name, "mode", mode, "status", status));
            // the platform keeps its own record of the activation; the caller's log names it (sync: this is the caller's thread)
            new HopRecord(r != null ? r.activationId() : null, name, status, mode, depth, t.kind(), from.activationId, 0, null,
                    HopRecord.NONE, null, false, HopRecord.NONE, HopRecord.NONE, System.nanoTime() - t0, error)
                    .report(async ? null : ActivationOutput.current());
        }
    }
}
