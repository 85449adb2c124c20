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
            assertEquals(200, invoke(c, "hello").code(), "the runtime serves on");
        });
    }
}
