package dev.cpuslot.samples;

import com.google.gson.JsonObject;

/**
 * Leaves a thread behind that runs on in JDK code ignoring interrupts: a regular expression with a
 * back reference that backtracks for ever (no loop of the function's own, so no poll of the guard
 * stops it), named {@code regex-spinner}; the function returns at once. The workload of the
 * confinement of threads that outlive their activation.
 *
 * <p>With {@code {"kept": "make"}} an activation only makes such a thread ({@code kept-regex}) and
 * keeps it; with {@code {"kept": "start"}} a later one starts it: a thread one activation made and
 * another let loose.
 */
public class StrayThread {
    private static Thread kept;

    public static JsonObject main(JsonObject args) {
        String mode = args.has("kept") ? args.get("kept").getAsString() : "";
        if (mode.equals("start")) {
            kept.start();
            return new JsonObject();
        }
        Thread t = new Thread(() -> java.util.regex.Pattern.compile("((a+)+)\\2b").matcher("a".repeat(64) + "c").matches(),
                mode.equals("make") ? "kept-regex" : "regex-spinner");
        t.setDaemon(true);
        if (mode.equals("make")) kept = t;
        else t.start();
        return new JsonObject();
    }
}
