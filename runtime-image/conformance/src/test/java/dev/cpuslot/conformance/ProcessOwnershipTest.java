package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

import java.util.concurrent.TimeUnit;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * The runtime owns its process: a function cannot raise a process signal, nor install or change a
 * process signal handler. Against the runtime as its image starts it.
 */
@DisplayName("The runtime owns the process")
class ProcessOwnershipTest {

    static void assertAlive(ActionContainer c) throws Exception {
        Thread.sleep(500); // a signalled JVM is gone by then; no bound on a live one
        assertTrue(c.alive(), "the runtime process died");
        Reply r = c.post("/", "");
        assertEquals(200, r.code(), "health after the probe: " + r.raw());
    }

    /**
     * Python's {@code signal.raise_signal} and {@code os.kill} of its own process end nothing:
     * the call fails in the function, the runtime lives on. (Before: SIGTERM, SIGINT and SIGHUP
     * ended the runtime.)
     */
    @ParameterizedTest(name = "{0}")
    @ValueSource(strings = {"raise_signal(SIGTERM)", "raise_signal(SIGINT)", "raise_signal(SIGHUP)", "kill(SIGTERM)", "kill(SIGHUP)",
            "reimported raise_signal(SIGHUP)"})
    void aPythonFunctionCannotRaiseAProcessSignal(String probe) throws Exception {
        String call = probe.startsWith("kill") ? "os.kill(os.getpid(), signal." + probe.substring(5, probe.length() - 1) + ")"
                : probe.startsWith("reimported") // the built-in module imported anew
                ? "import sys; sys.modules.pop('_signal', None); sys.modules.pop('signal', None); import _signal; _signal.raise_signal(_signal.SIGHUP)"
                : "signal.raise_signal(signal." + probe.substring(13, probe.length() - 1) + ")";
        String code = """
                import os, signal
                def main(args):
                    try:
                        %s
                    except BaseException as e:
                        return {"refused": type(e).__name__ + ": " + str(e)}
                    return {"raised": True}
                """.formatted(call);
        with("python", c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertAlive(c);
            assertFalse(r.body() != null && r.body().has("raised"), "the signal was raised: " + r.raw());
        });
    }

    /**
     * A Python function cannot install a handler for a process signal: SIGTERM still ends the
     * runtime afterwards. (Before: {@code signal.signal(SIGTERM, ...)} made the runtime ignore it.)
     */
    @Test
    void aPythonFunctionCannotInstallAProcessSignalHandler() throws Exception {
        String code = """
                import signal
                def main(args):
                    r = {}
                    for s in ("SIGTERM", "SIGINT", "SIGHUP"):
                        try:
                            signal.signal(getattr(signal, s), lambda n, f: None)
                            r[s] = "installed"
                        except BaseException as e:
                            r[s] = "refused: " + type(e).__name__
                    return r
                """;
        with("python", c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code(), String.valueOf(r.raw()));
            for (String s : new String[]{"SIGTERM", "SIGINT", "SIGHUP"})
                assertFalse(r.body().get(s).getAsString().equals("installed"), s + ": " + r.body());
            ProcessHandle p = ProcessHandle.of(c.pid()).orElseThrow();
            assertTrue(p.destroy(), "SIGTERM not sent");
            try {
                p.onExit().get(REQUEST_TIMEOUT.toSeconds(), TimeUnit.SECONDS);
            } catch (java.util.concurrent.TimeoutException e) {
                fail("the runtime did not end within " + REQUEST_TIMEOUT + " of SIGTERM after the function's signal.signal");
            }
        });
    }

    /**
     * A Python function that fills the heap leaves the runtime serving, or the runtime exits (so
     * that the platform restarts it): never alive and deaf. (Before: the HTTP dispatcher died of
     * the OutOfMemoryError, the process lived on and the port never answered again.)
     */
    @Test
    void aPythonFunctionThatFillsTheHeapLeavesTheRuntimeServingOrGone() throws Exception {
        String hog = """
                def main(args):
                    x = []
                    while True:
                        x.append(bytearray(1 << 20))
                """;
        with("python", env("JAVA_TOOL_OPTIONS", "-Xmx384m", "CPUSLOT_DEFAULT_TIMEOUT_MS", "30000"), c -> {
            assertEquals(200, c.init(initPayload(hog, "main")).code());
            for (int i = 0; i < 4 && c.alive(); i++) {
                try {
                    c.run(runPayload(new JsonObject()));
                } catch (java.io.IOException e) { // the runtime exited while it ran: what the test allows
                }
            }
            // a runtime thread may die a little after the hog's last answer: ask a few times
            for (int i = 0; i < 5 && c.alive(); i++) {
                try {
                    Reply r = c.post("/", ""); // a deaf runtime fails here with "no answer within"
                    assertEquals(200, r.code(), "health after the heap was filled: " + r.raw());
                } catch (java.io.IOException refused) { // the port refused: only an exiting process may
                    ProcessHandle p = ProcessHandle.of(c.pid()).orElse(null);
                    try {
                        if (p != null) p.onExit().get(30, TimeUnit.SECONDS);
                    } catch (java.util.concurrent.TimeoutException e) {
                        fail("alive and deaf: the port refused (" + refused + ") and the process did not exit");
                    }
                }
                Thread.sleep(1000);
            }
        });
    }
}
