package dev.cpuslot.runtime;

import java.util.function.Supplier;

/**
 * A value made on first use, once. The runtime's HTTP clients are: building one sets up its TLS
 * context (providers, the trust store), a quarter of the runtime's start-up natively and minutes
 * on an emulated node, for clients most pods never use (OpenWhisk annotation lookups, Hydra code
 * URLs).
 */
final class Lazy<T> implements Supplier<T> {
    private final Supplier<T> make;
    private volatile T value;

    Lazy(Supplier<T> make) { this.make = make; }

    @Override
    public T get() {
        T v = value;
        if (v == null) {
            synchronized (this) {
                v = value;
                if (v == null) value = v = make.get();
            }
        }
        return v;
    }
}
