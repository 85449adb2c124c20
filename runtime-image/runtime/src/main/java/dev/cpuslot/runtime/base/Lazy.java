package dev.cpuslot.runtime.base;

import java.util.function.Supplier;

/**
 * A value made on first use, once. The runtime's HTTP clients are: building one sets up its TLS
 * context (providers, the trust store), a quarter of the runtime's start-up natively and minutes
 * on an emulated node, for clients most pods never use (OpenWhisk annotation lookups, Hydra code
 * URLs). It is made on a runtime thread: the threads a value starts as it is made (a client's
 * selector) are the runtime's, even when a function's worker asks first.
 */
public final class Lazy<T> implements Supplier<T> {
    private final Supplier<T> make;
    private volatile T value;

    Lazy(Supplier<T> make) { this.make = make; }

    /**
     * An HTTP client of the runtime's, made on first use, its threads (selector, executor) the
     * runtime's; named apart from the front's request threads ({@code cpuslot-http}), which are capped.
     */
    public static Lazy<java.net.http.HttpClient> httpClient(java.util.function.UnaryOperator<java.net.http.HttpClient.Builder> configure) {
        return new Lazy<>(() -> configure.apply(java.net.http.HttpClient.newBuilder())
                .executor(dev.cpuslot.runtime.guard.RuntimeThreads.runtimeExecutor("cpuslot-client")).build());
    }

    @Override
    public T get() {
        T v = value;
        if (v == null) {
            synchronized (this) {
                v = value;
                if (v == null) value = v = dev.cpuslot.runtime.guard.RuntimeThreads.makeOnRuntimeThread("cpuslot-make", make);
            }
        }
        return v;
    }
}
