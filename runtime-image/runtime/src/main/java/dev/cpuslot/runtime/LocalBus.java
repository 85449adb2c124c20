package dev.cpuslot.runtime;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.cpuslot.chain.Chain;
import dev.cpuslot.chain.ChainException;
import dev.cpuslot.chain.ChainException.Kind;
import dev.cpuslot.slot.SlotLease;

import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Local chaining (docs/chaining.md): a function calls another function of the same owner hosted in
 * this runtime, in process. The callee's invocation goes to its own pool as any invocation does,
 * so it runs on its own worker, in its own slot at its own quota (local leasing: no message to the
 * agent when a held slot is free), accounted to its own action. What the bus adds are the limits:
 * same owner, bounded depth and fan-out, a callee deadline never past the caller's.
 */
final class LocalBus {
    /** A function this runtime hosts, as the bus sees it. */
    record Hosted(FunctionPool pool, String owner, long timeoutMs) {}

    /** What the runtime gives the bus: the hosted functions and how to run one hop. */
    interface Host {
        Hosted find(String function);

        /** Runs one hop to the end (or its deadline); metrics and log line included. */
        FunctionPool.Outcome run(Hosted callee, JsonElement args, Hop hop, String mode);
    }

    /** What the answer reports of a chain: each synchronous hop (in the order they finished) and the CPU they used. */
    static final class Trace {
        private static final int MAX_LISTED = 32;
        private final List<String> hops = new ArrayList<>();
        private long cpuNanos;
        private int count;
        private boolean measured;

        synchronized void add(String function, long cpuNanos, boolean measured) {
            count++;
            if (measured) {
                this.cpuNanos += cpuNanos;
                this.measured = true;
            }
            // a header value: a function's name is the tenant's, so only plain characters go in
            if (hops.size() < MAX_LISTED) hops.add(function.replaceAll("[^A-Za-z0-9._:/@-]", "_") + "=" + (measured ? Long.toString(cpuNanos) : "-"));
        }

        synchronized int count() { return count; }

        synchronized long cpuNanos() { return cpuNanos; }

        /** Whether any hop's CPU was measured (a hop without a slot has no figure). */
        synchronized boolean measured() { return measured; }

        /** {@code f=123,g=-} (CPU ns; "-": not measured, no slot), at most 32 listed. */
        synchronized String listed() {
            return String.join(",", hops) + (count > hops.size() ? ",..." : "");
        }
    }

    /** One activation in a chain: its identity, limits and the bus its function calls through. */
    final class Hop implements Chain.Bus {
        final String function, owner, activationId;
        final int depth;
        final long deadlineNanos;
        final Trace trace;
        final AtomicInteger asyncCalls = new AtomicInteger();
        /** The activation's slot lease (set by its worker once acquired; null: none). */
        volatile SlotLease lease;

        Hop(String function, String owner, String activationId, int depth, long deadlineNanos, Trace trace) {
            this.function = function;
            this.owner = owner == null ? "" : owner;
            this.activationId = activationId;
            this.depth = depth;
            this.deadlineNanos = deadlineNanos;
            this.trace = trace;
        }

        @Override
        public JsonElement call(String callee, JsonElement args) { return LocalBus.this.call(this, callee, args, false); }

        @Override
        public void callAsync(String callee, JsonElement args) { LocalBus.this.call(this, callee, args, true); }
    }

    private static final ThreadLocal<Hop> CURRENT = new ThreadLocal<>();

    private final Host host;
    private final Metrics metrics;
    private final int maxDepth, maxAsync, maxPending;
    private final AtomicLong pending = new AtomicLong();

    LocalBus(Host host, Metrics metrics, int maxDepth, int maxAsync, int maxPending) {
        this.host = host;
        this.metrics = metrics;
        this.maxDepth = maxDepth;
        this.maxAsync = maxAsync;
        this.maxPending = maxPending;
    }

    /** The first hop of a chain: an activation the platform sent. */
    Hop root(String function, String owner, String activationId, long deadlineNanos) {
        return new Hop(function, owner, activationId, 0, deadlineNanos, new Trace());
    }

    /** Binds the hop to the worker thread for the activation (Java: {@link Chain}; polyglot: {@link #polyglot}). */
    static void enter(Hop hop) {
        CURRENT.set(hop);
        Chain.bind(hop);
    }

    static void exit() {
        CURRENT.remove();
        Chain.bind(null);
    }

    private JsonElement call(Hop from, String callee, JsonElement args, boolean async) {
        String name = callee == null ? "" : callee.trim();
        String mode = async ? "async" : "sync";
        try {
            if (name.isEmpty()) throw new ChainException(Kind.NOT_LOCAL, name, "no function named");
            int depth = from.depth + 1;
            if (depth > maxDepth)
                throw new ChainException(Kind.DEPTH, name, "the chain is " + from.depth + " calls deep, the bound (CPUSLOT_CHAIN_MAX_DEPTH=" + maxDepth + ")");
            Hosted h = host.find(name);
            if (h == null)
                throw new ChainException(Kind.NOT_LOCAL, name, "no function of that name in this runtime (calls beyond the runtime are not implemented yet)");
            // explicit, whatever the runtime's owner setting: a chain stays with its owner
            if (!h.owner().equals(from.owner))
                throw new ChainException(Kind.OTHER_OWNER, name, "it belongs to another owner than the caller '" + from.function + "'");
            long now = System.nanoTime();
            long deadline = from.deadlineNanos;
            if (h.timeoutMs() > 0) deadline = Math.min(deadline, now + TimeUnit.MILLISECONDS.toNanos(h.timeoutMs()));
            if (deadline - now <= 0) throw new ChainException(Kind.TIMEOUT, name, "no time left before the caller's deadline");
            String id = UUID.randomUUID().toString().replace("-", "");
            if (!async) {
                Hop hop = new Hop(name, h.owner(), id, depth, deadline, from.trace);
                // The caller waits for the callee and uses no CPU meanwhile: its lease sleeps for
                // exactly the wait, so the agent may lend its quota (docs/lending.md). Nothing
                // is sent unless the agent announced LEND.
                SlotLease mine = from.lease;
                boolean slept = mine != null && mine.sleep();
                FunctionPool.Outcome o;
                try {
                    // copies both ways: no JSON object is shared between two functions
                    o = host.run(h, args.deepCopy(), hop, mode);
                } finally {
                    if (slept) mine.wake();
                }
                if (o.error() != null)
                    throw new ChainException(o.timedOut() ? Kind.TIMEOUT : Kind.FAILED, name, o.error());
                JsonElement r = o.result();
                if (r == null || !(r.isJsonObject() || r.isJsonArray()))
                    throw new ChainException(Kind.FAILED, name, "the callee did not return a dictionary");
                return r.deepCopy();
            }
            if (from.asyncCalls.incrementAndGet() > maxAsync)
                throw new ChainException(Kind.FAN_OUT, name, "more than " + maxAsync + " asynchronous calls from one activation (CPUSLOT_CHAIN_MAX_ASYNC)");
            if (pending.incrementAndGet() > maxPending) {
                pending.decrementAndGet();
                throw new ChainException(Kind.FAN_OUT, name, maxPending + " asynchronous calls are pending in this runtime (CPUSLOT_CHAIN_MAX_PENDING)");
            }
            // its own trace: the caller's answer may be gone before it ends; its log line and metrics report it
            Hop hop = new Hop(name, h.owner(), id, depth, deadline, new Trace());
            JsonElement a = args.deepCopy();
            try {
                // the runtime's thread, not the caller's: no inherited activation, not in its thread count
                Thread.ofVirtual().name("chain-async-" + name).inheritInheritableThreadLocals(false).start(() -> {
                    try {
                        host.run(h, a, hop, mode);
                    } catch (RuntimeException | Error e) {
                        Log.warn("asynchronous chain call to " + name + " failed in the runtime: " + e);
                    } finally {
                        pending.decrementAndGet();
                    }
                });
            } catch (RuntimeException | Error e) {
                pending.decrementAndGet();
                throw new ChainException(Kind.FAILED, name, "could not start: " + e);
            }
            return null;
        } catch (ChainException e) {
            if (e.kind() != Kind.FAILED && e.kind() != Kind.TIMEOUT) // those are counted with the hop
                metrics.inc("cpuslot_chain_calls_total", Metrics.labels("function", name, "mode", mode, "status", e.kind().name().toLowerCase()));
            throw e;
        }
    }

    /**
     * The JavaScript and Python binding ({@code cpuslot.call}, {@code cpuslot.callAsync} /
     * {@code call_async}): JSON in, {@code {"result": ...}} or {@code {"error", "kind"}} out, which
     * the prelude turns into a ChainError of the guest's own language.
     */
    static String polyglot(String mode, String callee, String argsJson) {
        JsonObject out = new JsonObject();
        Hop hop = CURRENT.get();
        try {
            if (hop == null) throw new ChainException(Kind.NO_CONTEXT, callee, "no chain on this thread");
            JsonElement args;
            try {
                args = JsonParser.parseString(argsJson == null ? "{}" : argsJson);
            } catch (RuntimeException e) {
                throw new ChainException(Kind.NO_CONTEXT, callee, "the arguments are not JSON: " + e.getMessage());
            }
            if ("async".equals(mode)) {
                hop.callAsync(callee, args);
                out.add("result", com.google.gson.JsonNull.INSTANCE);
            } else {
                out.add("result", hop.call(callee, args));
            }
        } catch (ChainException e) {
            out.addProperty("error", e.getMessage());
            out.addProperty("kind", e.kind().name());
        }
        return out.toString();
    }
}
