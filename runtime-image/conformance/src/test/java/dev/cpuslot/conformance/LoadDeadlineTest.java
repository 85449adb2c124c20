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

    /**
     * A new sandbox (a second worker, for a call that comes while the first is busy) runs the
     * module's top level again, within its call's deadline: code that never returns there is
     * stopped at the deadline, as at the load, and its worker ends. Before, nothing could stop it
     * (the worker was interrupted, which a guest loop does not see): it was confined as a runaway
     * after the grace and spun on at the runaway quota for as long as the runtime lived, one more
     * thread with each call that made a new sandbox.
     */
    @Test
    void aNewSandboxsTopLevelThatNeverEndsIsStoppedAtItsCallsDeadline() throws Exception {
        with("python", c -> {
            // the top level spins only from a time on, by which the load has ended: in a worker's
            // new sandbox, not at the load; a load that reached it (a busy machine) is tried again
            // with more time
            String name = null;
            long from = 0;
            for (int attempt = 0, margin = 10; attempt < 3 && name == null; attempt++, margin *= 3) {
                from = System.currentTimeMillis() / 1000 + margin;
                String code = "import time\nif time.time() > " + from + ":\n    while True:\n        pass\n"
                        + "def main(args):\n    time.sleep(float(args.get('sleep', 0)))\n    return {'ok': 1}\n";
                Reply reg = c.post("/register?name=later" + attempt + "&language=python&entryPoint=main&timeout=3000", code);
                if (reg.code() == 200) name = "later" + attempt;
                else assertTrue(String.valueOf(reg.raw()).contains("did not load within"), String.valueOf(reg.raw()));
            }
            assertNotNull(name, "a load ended before its top level's spin began");
            String fn = name;
            Thread.sleep(Math.max(0, from * 1000 + 1000 - System.currentTimeMillis()));
            var busy = java.util.concurrent.CompletableFuture.supplyAsync(() -> {
                try {
                    return JavaContainmentTest.invoke(c, fn, "{\"sleep\": 60}");
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            Thread.sleep(500); // the sleeping call takes the load's sandbox (a second worker's would spin: timed out too)
            Reply second = JavaContainmentTest.invoke(c, fn, "{}");
            assertTrue(String.valueOf(second.raw()).contains("time limit"), "the new sandbox's call timed out: " + second.raw());
            Reply first = busy.get();
            assertTrue(String.valueOf(first.raw()).contains("time limit"), "the sleeping call timed out: " + first.raw());
            awaitNoThread(c, "fn-" + fn + "-");
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
