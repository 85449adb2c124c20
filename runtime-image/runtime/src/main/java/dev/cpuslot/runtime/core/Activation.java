package dev.cpuslot.runtime.core;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.chain.HopRecord;
import dev.cpuslot.runtime.chain.LocalBus;
import dev.cpuslot.runtime.chain.PlatformPath;
import dev.cpuslot.runtime.exec.Function;
import dev.cpuslot.runtime.exec.FunctionPool;
import dev.cpuslot.runtime.exec.Hosted;
import dev.cpuslot.runtime.guard.ActivationOutput;
import dev.cpuslot.slot.SlotLease;
import dev.cpuslot.slot.Usage;

import java.io.PrintStream;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.function.BiFunction;
import java.util.function.Consumer;

/**
 * The path every activation takes through the core, a platform's and a chain hop's alike:
 * {@link #resolve} (quota, lending, the value the function sees) -> {@link #invoke} (its output
 * captured, counted in flight, on a worker of the function's pool) -> record (its usage, its
 * slot's outcome, the invocation's count and latency). {@link #platform} renders a platform's
 * reply around these steps; {@link #hop} answers the local bus with the callee's outcome.
 */
final class Activation {
    private final Config cfg;
    private final Metrics metrics;
    private final Quota quota;
    private final LocalBus bus;
    private final boolean slots;
    /** The runtime's owner check (FunctionRuntime#checkOwner): null to go on, else the refusal. */
    private final BiFunction<String, String, Reply> owners;
    private final PrintStream out, err;
    private final io.prometheus.metrics.core.datapoints.GaugeDataPoint inFlight;

    Activation(Config cfg, Metrics metrics, Quota quota, LocalBus bus, boolean slots, BiFunction<String, String, Reply> owners,
               PrintStream out, PrintStream err) {
        this.cfg = cfg;
        this.metrics = metrics;
        this.quota = quota;
        this.bus = bus;
        this.slots = slots;
        this.owners = owners;
        this.out = out;
        this.err = err;
        this.inFlight = metrics.gauge("cpuslot_invocations_in_flight");
    }

    // ---- the shared steps ---------------------------------------------------------------------

    /** What resolve settles before anything runs; value: the function's arguments, without the quota parameter when it set the quota. */
    record Resolved(Quota.Resolved quota, boolean lends, JsonElement value) {}

    /** A quota or lending setting that cannot be read: the activation is refused. */
    static final class Refused extends Exception {
        /** bad_quota or bad_lend. */
        final String status;
        /** The quota resolved before the lending was refused, else null. */
        final Quota.Resolved quota;

        Refused(String status, Quota.Resolved quota, String msg) {
            super(msg);
            this.status = status;
            this.quota = quota;
        }
    }

    /** Resolve: the activation's quota and lending, from the highest source down, and the value its function sees. */
    Resolved resolve(Function fn, JsonElement value, String quotaHeader, Map<String, String> env) throws Refused {
        Quota.Resolved q;
        try {
            q = quota.resolve(value, quotaHeader, env, fn.initEnv().get(Config.INIT_QUOTA_ENV));
        } catch (Quota.InvalidQuotaException e) {
            throw new Refused("bad_quota", null, e.getMessage());
        }
        boolean lends;
        try {
            lends = quota.lend(env, fn.initEnv().get(Config.INIT_LEND_ENV)).lends();
        } catch (Quota.InvalidQuotaException e) {
            throw new Refused("bad_lend", q, e.getMessage());
        }
        if (q.source().equals("invocation") && value.isJsonObject()) {
            value = value.deepCopy();
            value.getAsJsonObject().remove(Config.QUOTA_PARAM);
        }
        return new Resolved(q, lends, value);
    }

    /**
     * Invoke: the task on a worker of p, what the activation prints going to {@code output} (null:
     * not captured; it stays this thread's output after the call), counted in flight meanwhile.
     */
    FunctionPool.Outcome invoke(FunctionPool p, FunctionPool.Task task, long deadline, ActivationOutput.Capture output)
            throws InterruptedException {
        ActivationOutput.enter(output);
        inFlight.inc();
        try {
            return p.invoke(task, deadline);
        } finally {
            inFlight.dec();
        }
    }

    /** Record: the activation's own CPU and throttling, when measured on its own (a batch's go to {@link #batchRead}). */
    private void usage(FunctionPool p, Usage u) {
        if (u == null || !u.measured()) return;
        metrics.add("cpuslot_slot_cpu_seconds_total", p.labels(), u.cpuNanos() / 1e9);
        metrics.add("cpuslot_slot_throttled_seconds_total", p.labels(), u.throttledNanos() / 1e9);
    }

    /** Record: the slot's outcome for an activation that resolved its quota. */
    private void outcome(Quota.Resolved q, SlotLease l) {
        metrics.inc("cpuslot_slot_outcomes_total", Metrics.labels("outcome", SlotReport.outcome(q, l)));
    }

    /** Record: the invocation's count by platform and status, and its latency since t0. */
    private void invocation(String platform, String function, String status, long t0) {
        metrics.inc("cpuslot_invocations_total", Metrics.labels("platform", platform, "function", function, "status", status));
        metrics.histogram("cpuslot_invocation_duration_seconds", Metrics.labels("function", function))
                .observe((System.nanoTime() - t0) / 1e9);
    }

    /** An outcome's status in metrics and the log line: ok, bad_result (not a dictionary), timeout, error. */
    static String status(FunctionPool.Outcome o) {
        return o.error() != null ? (o.timedOut() ? "timeout" : "error")
                : o.result() == null || !(o.result().isJsonObject() || o.result().isJsonArray()) ? "bad_result" : "ok";
    }

    // ---- a platform's activation --------------------------------------------------------------

    /**
     * Runs one activation that an adapter mapped from its platform's request on p, the pool of
     * the function it names ({@code hosted}: a registered one, else null: the container's action),
     * and renders the reply: the platform's body ({@link Platform#body}) or the shared error, the
     * slot's headers.
     */
    Reply platform(Invocation inv, FunctionPool p, Hosted hosted) {
        long t0 = System.nanoTime();
        Platform platform = inv.platform();
        Function fn = p.function();
        JsonElement value = inv.value(), ns = inv.activation().get("namespace");
        // a hosted (Hydra) function's owner was checked at its /register
        if (hosted == null && ns != null && ns.isJsonPrimitive()) {
            Reply refused = owners.apply(ns.getAsString(), "an activation");
            if (refused != null) return finish(platform, fn, t0, refused, "other_owner", null);
        }
        Map<String, String> env = environment(fn, inv.activation());
        String activationId = env.getOrDefault("__OW_ACTIVATION_ID", UUID.randomUUID().toString().replace("-", ""));
        String action = env.getOrDefault("__OW_ACTION_NAME", fn.name());
        int depth = 0; // the chain's depth, when a caller's chain sent this activation through the platform
        if (value.isJsonObject() && value.getAsJsonObject().has(PlatformPath.DEPTH_PARAM)) {
            value = value.deepCopy();
            try {
                depth = bus.arrivedDepth(value);
            } catch (IllegalArgumentException e) {
                return finish(platform, fn, t0, Reply.error(400, e.getMessage()), "bad_request", null);
            }
        }
        long timeoutNs = timeoutNs(hosted, env.get("__OW_DEADLINE"));
        Resolved r;
        try {
            r = resolve(fn, value, inv.quotaHeader(), env);
        } catch (Refused e) {
            Log.warn("activation " + activationId + " refused: " + e.getMessage());
            return finish(platform, fn, t0, Reply.error(400, e.getMessage()), e.status, null);
        }
        if (r.quota().milli() == 0) platform.noQuota(env, action);
        // what the activation prints: its own block, written out before its sentinels (finish);
        // the pool hands it to the worker
        ActivationOutput.Capture output = ActivationOutput.open();
        long deadline = System.nanoTime() + timeoutNs;
        // the chain's first hop: the owner is the Hydra function's, else the activation's namespace
        String hopOwner = hosted != null ? hosted.owner() : ns != null && ns.isJsonPrimitive() ? ns.getAsString().trim() : "";
        LocalBus.Hop hop = bus.root(action, hopOwner, activationId, deadline, depth,
                new PlatformPath.Origin(env.get("__OW_API_HOST"), env.get("__OW_API_KEY")));
        hop.lends = r.lends();
        if (slots && batchLabels.get(action) == null && batchLabels.size() < MAX_BATCH_LABELS) batchLabels.put(action, p.labels());
        FunctionPool.Outcome o;
        try {
            o = invoke(p, new FunctionPool.Task(r.value(), env, r.quota().milli(), action, activationId, hop,
                    inv.usageAsked() || cfg.usageInReply()), deadline, output);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return finish(platform, fn, t0, Reply.error(503, "interrupted"), "error", output);
        }
        // the steps the container's action declared (its /init env, else the container's env) follow it
        if (hosted == null) o = bus.then(hop, fn.initEnv().getOrDefault(LocalBus.STEPS_ENV, cfg.chainSteps()), o);
        return reply(platform, p, t0, activationId, action, r.quota(), hop, o, output);
    }

    /** The reply to a platform's activation that ran: its body or error, the slot's and the chain's headers, the log line after it. */
    private Reply reply(Platform platform, FunctionPool p, long t0, String activationId, String action, Quota.Resolved q,
                        LocalBus.Hop hop, FunctionPool.Outcome o, ActivationOutput.Capture output) {
        String status = status(o);
        Reply r = switch (status) {
            case "ok" -> Reply.ok(platform.body(new Result(o.result(), o.runNanos(), q, o.lease(), o.usage())));
            case "bad_result" -> Reply.error(502, "The action did not return a dictionary.");
            case "timeout" -> Reply.error(502, "The action did not finish before its deadline: " + o.error() + ".");
            default -> Reply.error(502, "An error has occurred while invoking the action (see logs for details): " + o.error());
        };
        Map<String, String> headers = new LinkedHashMap<>(r.headers());
        SlotLease l = o.lease();
        Usage u = o.usage();
        SlotReport.headers(headers, q, l, u);
        int hops = hop.trace.count();
        if (hops > 0) {
            // the synchronous hops below this activation: each hop's CPU, and the chain's (this one's
            // included; not sent when this one's is read after the reply)
            headers.put("X-Cpuslot-Chain-Hops", Integer.toString(hops));
            headers.put("X-Cpuslot-Chain", hop.trace.listed());
            if (o.usageLater() == null && (hop.trace.measured() || (u != null && u.measured())))
                headers.put("X-Cpuslot-Chain-Cpu-Ns", Long.toString(hop.trace.cpuNanos() + (u != null && u.measured() ? u.cpuNanos() : 0)));
        }
        outcome(q, l);
        long duration = System.nanoTime() - t0;
        // after the reply: the usage metrics and the activation's log line (what the slot gave and
        // what it used), once the usage is known (the worker may read the counters after the reply)
        Consumer<Usage> record = used -> {
            usage(p, used);
            Log.activation(logLine(activationId, action, status, q, l, used, hop, hops, duration));
        };
        CompletableFuture<Usage> later = o.usageLater();
        Runnable after = later == null ? () -> record.accept(u) : () -> later.thenAccept(record);
        return finish(platform, p.function(), t0, new Reply(r.status(), r.body(), headers, after), status, output);
    }

    /** The activation's line in the runtime's log: what the slot gave and what it used. */
    private static String logLine(String activationId, String action, String status, Quota.Resolved q, SlotLease l, Usage used,
                                  LocalBus.Hop hop, int hops, long duration) {
        boolean m = used != null && used.measured();
        return "cpuslot: activation=" + activationId + " action=" + action + " status=" + status
                + " quota=" + q.milli() + "m source=" + q.source() + (q.capped() ? " capped" : "")
                + " slot=" + (l != null && l.active() ? l.slot() + " outcome=" + l.outcome() + " place=" + l.place()
                        + (l.reused() ? " reused" : "") + (l.local() ? " local" : "") : "none")
                + (l != null && !l.active() ? " noslot=" + l.reason() : "")
                + (m ? " cpu_ms=" + Log.ms(used.cpuNanos()) + " throttled_ms=" + Log.ms(used.throttledNanos())
                + " periods=" + used.periods() + " throttled_periods=" + used.throttledPeriods() : "")
                + (hop.allocatedBytes >= 0 ? " alloc_bytes=" + hop.allocatedBytes : "")
                + (hops > 0 ? " chain_hops=" + hops : "")
                + (hops > 0 && (hop.trace.measured() || m) ? " chain_cpu_ms=" + Log.ms(hop.trace.cpuNanos() + (m ? used.cpuNanos() : 0)) : "")
                + " duration_ms=" + Log.ms(duration);
    }

    /** @param output the activation's stdout and stderr: written out now, before its sentinels (null: none was opened) */
    private Reply finish(Platform platform, Function fn, long t0, Reply r, String status, ActivationOutput.Capture output) {
        invocation(platform.name(), fn.name(), status, t0);
        if (!status.equals("ok")) Log.info("activation failed: " + (r.body() instanceof JsonObject jo && jo.has("error") && jo.get("error").isJsonPrimitive() ? jo.get("error").getAsString() : status));
        ActivationOutput.leave();
        if (output != null) output.close(platform.sentinels());
        else if (platform.sentinels()) ActivationOutput.sentinels(out, err);
        return r;
    }

    /** The activation's fields as OpenWhisk hands them to an action: {@code __OW_<FIELD>}, over its init env. */
    Map<String, String> environment(Function fn, JsonObject activation) {
        Map<String, String> env = new LinkedHashMap<>(fn.initEnv());
        for (Map.Entry<String, JsonElement> e : activation.entrySet()) {
            JsonElement v = e.getValue();
            env.put("__OW_" + e.getKey().toUpperCase(Locale.ROOT), v.isJsonNull() ? "" : v.isJsonPrimitive() ? v.getAsString() : v.toString());
        }
        if (cfg.apiHost() != null) env.putIfAbsent("__OW_API_HOST", cfg.apiHost());
        return env;
    }

    /**
     * How long the activation may run: until its {@code __OW_DEADLINE}, else a Hydra function's
     * time limit, else the default. The invoker enforces the action's time limit; the runtime
     * cancels at the deadline too, to free the sandbox and slot. A deadline already past (a
     * skewed clock, a test value) is passed on to the action and the default timeout applies.
     */
    private long timeoutNs(Hosted hosted, String deadline) {
        long timeoutNs = TimeUnit.MILLISECONDS.toNanos(hosted != null && hosted.timeoutMs() > 0 ? hosted.timeoutMs() : cfg.defaultTimeoutMs());
        if (deadline != null && !deadline.isBlank() && cfg.enforceDeadline()) {
            try {
                long left = (long) Double.parseDouble(deadline) - System.currentTimeMillis();
                if (left > 0) timeoutNs = TimeUnit.MILLISECONDS.toNanos(left);
                else metrics.inc("cpuslot_deadline_past_total");
            } catch (NumberFormatException e) {
                metrics.inc("cpuslot_deadline_unparsed_total");
            }
        }
        return timeoutNs;
    }

    // ---- a chain hop --------------------------------------------------------------------------

    /**
     * One hop of a local chain (called by the bus on the caller's thread, or on a runtime thread
     * for an asynchronous call): the callee's own quota, pool, slot, metrics and log line, as
     * an invocation from the platform gets, with the deadline the bus gave it.
     */
    FunctionPool.Outcome hop(Hosted callee, JsonElement args, LocalBus.Hop hop, String mode) {
        long t0 = System.nanoTime();
        ActivationOutput.Capture callerLog = ActivationOutput.current(); // the hop's record goes there
        FunctionPool p = callee.pool();
        Function fn = p.function();
        Map<String, String> env = new LinkedHashMap<>(fn.initEnv());
        env.put("__OW_ACTION_NAME", hop.function);
        env.put("__OW_ACTIVATION_ID", hop.activationId);
        env.put("__OW_DEADLINE", Long.toString(System.currentTimeMillis() + TimeUnit.NANOSECONDS.toMillis(hop.deadlineNanos - t0)));
        if (!hop.owner.isEmpty()) env.put("__OW_NAMESPACE", hop.owner);
        if (cfg.apiHost() != null) env.putIfAbsent("__OW_API_HOST", cfg.apiHost());
        FunctionPool.Outcome o;
        Quota.Resolved q = null;
        try {
            Resolved r = resolve(fn, args, null, env);
            q = r.quota();
            hop.lends = r.lends();
            // the hop's output: its own block (the platform's sentinels end its caller's)
            ActivationOutput.Capture output = ActivationOutput.open();
            try {
                o = invoke(p, new FunctionPool.Task(r.value(), env, q.milli(), hop.function, hop.activationId, hop), hop.deadlineNanos, output);
            } finally {
                ActivationOutput.enter(callerLog);
                if (output != null) output.close(false);
            }
        } catch (Refused e) {
            q = e.quota;
            o = new FunctionPool.Outcome(null, e.getMessage(), false, null, Usage.NONE, 0);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt(); // the caller was cancelled: it ends too
            o = new FunctionPool.Outcome(null, "the caller was cancelled", true, null, Usage.NONE, 0);
        } catch (RuntimeException e) { // the pool's own failure: the caller's typed error, not an escape
            o = new FunctionPool.Outcome(null, "runtime error: " + e, false, null, Usage.NONE, 0);
        }
        recordHop(p, hop, mode, q, o, t0, callerLog);
        return o;
    }

    /** Record, for a hop: its usage, the caller's trace, its metrics, and its line in the caller's log and the runtime's. */
    private void recordHop(FunctionPool p, LocalBus.Hop hop, String mode, Quota.Resolved q, FunctionPool.Outcome o, long t0,
                           ActivationOutput.Capture callerLog) {
        String status = status(o), name = p.function().name();
        Usage u = o.usage();
        boolean measured = u != null && u.measured();
        usage(p, u);
        if (!mode.equals("async")) hop.trace.add(hop.function, measured ? u.cpuNanos() : 0, measured);
        SlotLease l = o.lease();
        if (q != null) outcome(q, l);
        metrics.inc("cpuslot_chain_calls_total", Metrics.labels("function", name, "mode", mode, "status", status));
        invocation("chain", name, status, t0);
        boolean slot = l != null && l.active();
        new HopRecord(hop.activationId, hop.function, status, mode, hop.depth, "local", hop.callerId, q != null ? q.milli() : 0,
                q != null ? q.source() : null, slot ? l.slot() : HopRecord.NONE, slot ? l.outcome() : null, slot && l.local(),
                measured ? u.cpuNanos() : HopRecord.NONE, measured ? u.throttledNanos() : HopRecord.NONE, System.nanoTime() - t0,
                o.error()).report(callerLog);
    }

    // ---- usage read in batches ----------------------------------------------------------------

    /**
     * The usage metrics' labels per action, for the batches of warm invocations whose counters
     * the slot client reads together ({@link dev.cpuslot.slot.SlotClient#onBatchRead}). Bounded:
     * past it a new action's batches reach the agent's USAGE but not these metrics.
     */
    private final ConcurrentHashMap<String, Metrics.Labels> batchLabels = new ConcurrentHashMap<>();
    static final int MAX_BATCH_LABELS = 4096;

    /**
     * A function's load takes a slot under its name (Load): a batch of its counters read with
     * others' is counted under it, as a call's.
     */
    void loading(String function) {
        if (slots && batchLabels.get(function) == null && batchLabels.size() < MAX_BATCH_LABELS)
            batchLabels.put(function, Metrics.labels("function", function));
    }

    /** A function's load's usage in its slot, once final: its function's CPU, as a call's. */
    void loaded(String function, Usage u) {
        if (u == null || !u.measured()) return;
        Metrics.Labels labels = Metrics.labels("function", function);
        metrics.add("cpuslot_slot_cpu_seconds_total", labels, u.cpuNanos() / 1e9);
        metrics.add("cpuslot_slot_throttled_seconds_total", labels, u.throttledNanos() / 1e9);
    }

    void batchRead(String action, Usage u) {
        Metrics.Labels labels = batchLabels.get(action);
        if (labels == null) return;
        metrics.add("cpuslot_slot_cpu_seconds_total", labels, u.cpuNanos() / 1e9);
        metrics.add("cpuslot_slot_throttled_seconds_total", labels, u.throttledNanos() / 1e9);
    }
}
