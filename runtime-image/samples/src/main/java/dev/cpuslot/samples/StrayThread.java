package dev.cpuslot.samples;

import com.google.gson.JsonObject;

/**
 * Leaves a thread behind that runs on in JDK code ignoring interrupts: a regular expression with a
 * back reference that backtracks for ever (no loop of the function's own, so no poll of the guard
 * stops it), named {@code regex-spinner}; the function returns at once. The workload of the
 * confinement of threads that outlive their activation.
 */
public class StrayThread {
    public static JsonObject main(JsonObject args) {
        Thread t = new Thread(() -> java.util.regex.Pattern.compile("((a+)+)\\2b").matcher("a".repeat(64) + "c").matches(),
                "regex-spinner");
        t.setDaemon(true);
        t.start();
        return new JsonObject();
    }
}
