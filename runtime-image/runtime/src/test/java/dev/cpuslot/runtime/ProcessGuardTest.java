package dev.cpuslot.runtime;

import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.guard.RuntimeThreads;
import org.junit.jupiter.api.Test;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

/**
 * Issue 30: the runtime owns its process. When one of the runtime's own threads ends with an
 * {@link Error} (an OutOfMemoryError a function's allocation caused in the HTTP dispatcher, the
 * heap watch, a worker), the runtime cannot go on and nothing restarts that thread in process: it
 * says it is not ready and exits with 70, so that the platform restarts it, rather than stay
 * alive and deaf. Run in a process of its own (the exit is the point).
 */
class ProcessGuardTest {
    @Test
    void aRuntimeThreadEndingWithAnErrorEndsTheProcessWith70() throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments()); // surefire's options for the runtime
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(Dies.class.getName());
        Path err = Files.createTempFile("process-guard", ".err");
        try {
            Process p = new ProcessBuilder(cmd).redirectErrorStream(false).redirectOutput(ProcessBuilder.Redirect.DISCARD)
                    .redirectError(err.toFile()).start();
            // a hang is the failure this guards against: say so, and end it
            if (!p.waitFor(120, TimeUnit.SECONDS)) {
                p.destroyForcibly();
                fail("the runtime stayed alive 120 s after its own thread ended with an Error:\n" + Files.readString(err));
            }
            String said = Files.readString(err, StandardCharsets.UTF_8);
            assertEquals(70, p.exitValue(), "exit status; stderr:\n" + said);
            assertTrue(said.contains("the runtime's thread cpuslot-test-dies ended (java.lang.OutOfMemoryError: from the test)")
                    && said.contains("exiting with 70"), "the runtime says why it exits:\n" + said);
        } finally {
            Files.deleteIfExists(err);
        }
    }

    /** A runtime as the tests make one, serving, whose own thread then ends with an Error. */
    static final class Dies {
        public static void main(String[] args) throws Exception {
            Harness h = new Harness();
            Log.to(Harness.REAL_ERR); // the harness keeps the log in memory, which the exit loses
            RuntimeThreads.startRuntimeThread("cpuslot-test-dies", () -> {
                throw new OutOfMemoryError("from the test");
            });
            Thread.sleep(60_000); // the guard ends the process before this
            Harness.REAL_ERR.println("still alive 60 s after the runtime's thread ended; ready: " + h.rt.ready().status());
            System.exit(1);
        }
    }
}
