package testfns;

import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;

/** Hydra-style (Map in, Map out) with static state: isolation between functions. */
public class Counter {
    static final AtomicLong N = new AtomicLong();

    public static Map<String, Object> main(Map<String, Object> args) {
        return Map.of("count", N.incrementAndGet(), "name", String.valueOf(args.get("name")));
    }
}
