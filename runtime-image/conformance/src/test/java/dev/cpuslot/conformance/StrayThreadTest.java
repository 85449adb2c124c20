package dev.cpuslot.conformance;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static dev.cpuslot.conformance.ActionContainer.*;
import static dev.cpuslot.conformance.JavaContainmentTest.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * A thread of an ended activation stuck in JDK code that ignores interrupts (a regular expression
 * with a back reference backtracks for ever: no poll of the guard runs there) is found by its kernel thread id and
 * handed to the runaway confinement, which moves it out of the slot its activation had into a
 * tiny one of its own (with the agent; here, without one, the log says why it could not), so its
 * CPU is charged to no later invocation of that slot. (Before: it was only logged by name, 10 s
 * after the end, and stayed in the slot.)
 */
@DisplayName("Threads of ended activations stuck in JDK code")
class StrayThreadTest {
    @Test
    void aThreadStuckInJdkCodeAfterItsActivationIsFoundByItsKernelThreadIdAndConfined() throws Exception {
        String spinner = probe("""
                Thread t = new Thread(() -> java.util.regex.Pattern.compile("((a+)+)\\\\2b").matcher("a".repeat(64) + "c").matches(),
                        "regex-spinner");
                t.setDaemon(true);
                t.start();
                return args;""");
        String hello = probe(HeapPressureTest.HELLO);
        with("java", c -> {
            assertEquals(200, register(c, "spinner", jarFile(c, "spinner", spinner), null).code());
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            assertEquals(200, invoke(c, "spinner").code(), "the activation returns at once");
            Pattern line = Pattern.compile("thread \"regex-spinner\"[^\\n]*\\(tid (\\d+)\\)[^\\n]*");
            long until = System.nanoTime() + 60_000_000_000L;
            Matcher m = line.matcher("");
            boolean found = false;
            while (!found && System.nanoTime() < until) {
                m = line.matcher(Files.readString(c.runtimeLog));
                found = m.find();
                if (!found) Thread.sleep(200);
            }
            assertTrue(found, "no line names the stuck thread with its kernel thread id within 60 s:\n"
                    + Files.readString(c.runtimeLog));
            String tid = m.group(1);
            assertEquals("regex-spinner", Files.readString(Path.of("/proc/" + c.pid() + "/task/" + tid + "/comm")).strip(),
                    "the tid named is the stuck thread's: " + m.group());
            assertTrue(m.group().contains("confined") || m.group().contains("could not be confined (slots_off)"), m.group());
            if (m.group().contains("could not be confined")) {
                // without the agent: the least CPU the runtime can give it unprivileged
                String[] stat = stat(c.pid(), tid);
                assertEquals("19", stat[16], "the unconfined stray's nice value: " + m.group());
                assertEquals("5", stat[38], "the unconfined stray's scheduling policy is SCHED_IDLE (5): " + m.group());
            }
            assertEquals(200, invoke(c, "hello").code(), "the runtime serves on");
        });
    }

    /**
     * An activation's threads are its own, not its worker's: a stray is found while the worker
     * already runs the function's next activation (one worker: the pool hands it the next call).
     * (Before: it was looked for only once the worker was idle, so a busy function's stray ran on.)
     */
    @Test
    void aStrayIsFoundWhileItsWorkerRunsTheNextActivation() throws Exception {
        String spinner = probe("""
                if (args.has("hold")) { Thread.sleep(50_000); return args; }
                Thread t = new Thread(() -> java.util.regex.Pattern.compile("((a+)+)\\\\2b").matcher("a".repeat(64) + "c").matches(),
                        "regex-spinner");
                t.setDaemon(true);
                t.start();
                return args;""");
        with("java", c -> {
            assertEquals(200, register(c, "spinner", jarFile(c, "spinner", spinner), null).code());
            assertEquals(200, invoke(c, "spinner").code(), "the activation returns at once");
            var next = java.util.concurrent.CompletableFuture.supplyAsync(() -> {
                try {
                    return invoke(c, "spinner", "{\"hold\":true}").code();
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            Pattern line = Pattern.compile("thread \"regex-spinner\"[^\\n]*\\(tid (\\d+)\\)[^\\n]*");
            boolean found = false;
            while (!found && !next.isDone()) {
                found = line.matcher(Files.readString(c.runtimeLog)).find();
                if (!found) Thread.sleep(200);
            }
            assertTrue(found, "the stray was not named while its worker ran the next activation (it held the worker 50 s):\n"
                    + Files.readString(c.runtimeLog));
        });
    }

    /**
     * A thread one activation makes and keeps, that a later one starts, running JDK code only (no
     * loop of the function's own, so no poll stops it): once the activation that started it has
     * ended, it is that activation's stray, named with its kernel thread id and confined.
     * (Before: nothing looked for it; it ran on in the slot it was started in, and its start's
     * mark kept every function's loops on the guard's slow path.)
     */
    @Test
    void aKeptThreadStartedLaterRunningJdkCodeIsAStrayOfTheActivationThatStartedIt() throws Exception {
        String jar = Archives.jar(java.util.Map.of("example/Kept.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Kept {
                    static Thread kept;
                    public static JsonObject main(JsonObject args) {
                        if (kept == null) {
                            kept = new Thread(() -> java.util.regex.Pattern.compile("((a+)+)\\\\2b").matcher("a".repeat(64) + "c").matches(),
                                    "kept-regex");
                            kept.setDaemon(true);
                        } else if (kept.getState() == Thread.State.NEW) {
                            kept.start();
                        }
                        return args;
                    }
                }
                """));
        with("java", c -> {
            assertEquals(200, c.init(initPayload(jar, "example.Kept", true, null)).code());
            assertEquals(200, c.run(runPayload(json("{}"))).code(), "the activation that makes the thread");
            assertEquals(200, c.run(runPayload(json("{}"))).code(), "the activation that starts it");
            Pattern line = Pattern.compile("thread \"kept-regex\"[^\\n]*\\(tid (\\d+)\\)[^\\n]*");
            long until = System.nanoTime() + 60_000_000_000L;
            boolean found = false;
            while (!found && System.nanoTime() < until) {
                found = line.matcher(Files.readString(c.runtimeLog)).find();
                if (!found) Thread.sleep(200);
            }
            assertTrue(found, "no line names the kept thread with its kernel thread id within 60 s of its starter's end:\n"
                    + Files.readString(c.runtimeLog));
            assertEquals(200, c.run(runPayload(json("{}"))).code(), "the runtime serves on");
        });
    }

    /** /proc/PID/task/TID/stat's fields after the command's closing parenthesis (index 0: field 3, the state). */
    static String[] stat(long pid, String tid) throws Exception {
        String s = Files.readString(Path.of("/proc/" + pid + "/task/" + tid + "/stat"));
        return s.substring(s.lastIndexOf(')') + 2).split(" ");
    }
}
