package dev.cpuslot.runtime;

import java.time.Instant;

/** Runtime's own log lines go to stderr, prefixed, one line each. */
final class Log {
    private Log() {}
    static void info(String m) { System.err.println(Instant.now() + " cpuslot-runtime INFO " + m); }
    static void warn(String m) { System.err.println(Instant.now() + " cpuslot-runtime WARN " + m); }
}
