package dev.cpuslot.runtime.chain;

import com.google.gson.JsonElement;
import dev.cpuslot.chain.ChainException;

import java.util.List;
import java.util.Map;
import dev.cpuslot.runtime.exec.Function;

/**
 * A sequence declared with Hydra's {@code /register?name=pipe&steps=a,b,c} (as OpenWhisk's
 * {@code wsk action create pipe --sequence a,b,c}): no code of its own; its activation runs the
 * steps through the bus ({@link LocalBus#sequence}), each step a hop in its own slot. Its own
 * worker only waits (its lease asleep meanwhile).
 */
public final class SequenceFunction implements Function {
    private final String name;
    private final List<String> steps;
    private final Map<String, String> initEnv;
    private final LocalBus bus;

    public SequenceFunction(String name, List<String> steps, Map<String, String> initEnv, LocalBus bus) {
        this.name = name;
        this.steps = steps;
        this.initEnv = initEnv;
        this.bus = bus;
    }

    List<String> steps() { return steps; }

    @Override public String name() { return name; }

    @Override public String language() { return "sequence"; }

    @Override public Map<String, String> initEnv() { return initEnv; }

    @Override
    public Sandbox newSandbox() {
        return new Sandbox() {
            @Override
            public JsonElement invoke(JsonElement args, Map<String, String> env) {
                LocalBus.Hop hop = LocalBus.current();
                if (hop == null) throw new ChainException(ChainException.Kind.NO_CONTEXT, name, "a sequence runs as an activation");
                return bus.sequence(hop, steps, args);
            }

            @Override public void cancel(Thread worker) { worker.interrupt(); }

            @Override public void close() {}
        };
    }
}
