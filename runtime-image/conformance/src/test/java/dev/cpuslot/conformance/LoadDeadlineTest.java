package dev.cpuslot.conformance;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * A function's load (/init, /register) runs its code: a module's top level, a Java class's static
 * initialisers. It gets the function's time limit as a call does, and at the deadline it is
 * stopped and the request answered. (Before: code that never returned held its request's front
 * thread and a core for as long as the runtime lived, and a thread a static initialiser started
 * ran on, in no activation.)
 */
@DisplayName("A function's load within its deadline")
class LoadDeadlineTest {
    private static final String OK_PY = "def main(args):\n    return {'ok': 1}\n";
    private static final String OK_JS = "function main(args) { return { ok: 1 }; }\n";

    @Test
    void pythonCodeThatNeverLoadsIsStoppedAtTheDeadline() throws Exception {
        guestLoop("python", "import time\nwhile True:\n    pass\n" + OK_PY, OK_PY);
    }

    @Test
    void javascriptCodeThatNeverLoadsIsStoppedAtTheDeadline() throws Exception {
        guestLoop("javascript", "while (true) {}\n" + OK_JS, OK_JS);
    }

    private static void guestLoop(String language, String loop, String ok) throws Exception {
        with(language, c -> {
            Reply r = c.post("/register?name=loop&language=" + language + "&entryPoint=main&timeout=2000", loop);
            assertEquals(400, r.code(), String.valueOf(r.raw()));
            assertTrue(String.valueOf(r.raw()).contains("did not load within 2000 ms"), String.valueOf(r.raw()));
            awaitNoThread(c, "fn-load-");
            assertEquals(200, c.post("/register?name=ok&language=" + language + "&entryPoint=main", ok).code());
            Reply run = JavaContainmentTest.invoke(c, "ok");
            assertEquals(200, run.code(), String.valueOf(run.raw()));
            assertEquals(1, run.body().getAsJsonObject("result").get("ok").getAsInt());
        });
    }

    /**
     * A Java class whose static initialiser loops is stopped at the deadline by the guard's poll
     * (the load is an activation of the function's); a thread a static initialiser starts ends
     * with the load, as an activation's threads end with it.
     */
    @Test
    void javaStaticInitialisersEndWithTheLoad() throws Exception {
        String jar = Archives.jar(Map.of(
                "example/Loop.java", """
                        package example;
                        import java.util.*;
                        public class Loop {
                            static long n;
                            static { while (n >= 0) n++; }
                            public static Map<String, Object> main(Map<String, Object> args) { return Map.of("n", n); }
                        }
                        """,
                "example/Spawn.java", """
                        package example;
                        import java.util.*;
                        public class Spawn {
                            static volatile long n;
                            static {
                                Thread t = new Thread(() -> { while (n >= 0) n++; }, "load-spinner");
                                t.setDaemon(true);
                                t.start();
                            }
                            public static Map<String, Object> main(Map<String, Object> args) { return Map.of("ok", 1); }
                        }
                        """));
        with("java", c -> {
            Path file = JavaContainmentTest.jarFile(c, "loop", jar);
            Reply r = c.post("/register?name=loop&language=java&entryPoint=example.Loop&timeout=2000&url=" + file.toUri(), "");
            assertEquals(400, r.code(), String.valueOf(r.raw()));
            assertTrue(String.valueOf(r.raw()).contains("did not load within 2000 ms"), String.valueOf(r.raw()));
            awaitNoThread(c, "fn-load-");
            assertEquals(200, c.post("/register?name=spawn&language=java&entryPoint=example.Spawn&url=" + file.toUri(), "").code());
            awaitNoThread(c, "load-spinner");
            Reply run = JavaContainmentTest.invoke(c, "spawn");
            assertEquals(200, run.code(), String.valueOf(run.raw()));
        });
    }

    /** OpenWhisk's /init: the same deadline (here CPUSLOT_DEFAULT_TIMEOUT_MS), answered with 502 as an init error. */
    @Test
    void anOpenWhiskInitThatNeverEndsIsAnInitError() throws Exception {
        with("python", env("CPUSLOT_DEFAULT_TIMEOUT_MS", "2000"), c -> {
            Reply r = c.init(initPayload("while True:\n    pass\n" + OK_PY, "main"));
            assertEquals(502, r.code(), String.valueOf(r.raw()));
            assertTrue(String.valueOf(r.raw()).contains("did not load within 2000 ms"), String.valueOf(r.raw()));
            awaitNoThread(c, "fn-load-");
        });
    }

    /** Waits until no thread of the runtime has a kernel name starting with {@code prefix}; fails naming them after 120 s. */
    private static void awaitNoThread(ActionContainer c, String prefix) throws Exception {
        long until = System.nanoTime() + 120_000_000_000L;
        List<String> left;
        while (!(left = threads(c.pid(), prefix)).isEmpty()) {
            if (System.nanoTime() - until > 0) fail("still running 120 s after the load's deadline: " + left);
            Thread.sleep(50);
        }
    }

    private static List<String> threads(long pid, String prefix) throws Exception {
        try (Stream<Path> tasks = Files.list(Path.of("/proc/" + pid + "/task"))) {
            return tasks.map(t -> {
                try {
                    return Files.readString(t.resolve("comm")).strip();
                } catch (java.io.IOException gone) {
                    return "";
                }
            }).filter(n -> n.startsWith(prefix)).toList();
        }
    }
}
