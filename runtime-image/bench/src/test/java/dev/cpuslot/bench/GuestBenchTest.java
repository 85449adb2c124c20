package dev.cpuslot.bench;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/** The baselines' harnesses (baseline.js, baseline.py) in node and python3: what GuestBench's rows rest on. */
class GuestBenchTest {
    @TempDir
    Path work;

    /** main counts its calls, echoes its argument, and throws when asked to. */
    static String counter(String lang) {
        return lang.equals("javascript")
                ? "var n = 0;\nfunction main(args) { if (args.fail) throw new Error('asked to'); return { calls: ++n, args: args }; }\n"
                : "n = 0\ndef main(args):\n    global n\n    if args.get('fail'):\n        raise ValueError('asked to')\n    n += 1\n    return {'calls': n, 'args': args}\n";
    }

    static void assumeOnPath(String lang) {
        String cmd = GuestBench.baselineCommand(lang);
        for (String d : System.getenv().getOrDefault("PATH", "").split(File.pathSeparator))
            if (Files.isExecutable(Path.of(d, cmd))) return;
        assumeTrue(false, "needs " + cmd + " on PATH, as make bench-guest does");
    }

    @ParameterizedTest
    @ValueSource(strings = {"javascript", "python"})
    void servedBaselineAnswersRunWithMainOfTheValueAndItsFirstRunIsMainsFirstCall(String lang) throws Exception {
        assumeOnPath(lang);
        try (var served = new GuestBench.HttpBaseline(lang, GuestBench.harness(lang, counter(lang), work), work)) {
            assertEquals("{\"calls\":1,\"args\":{\"who\":\"x\"}}",
                    GuestBench.canonical(GuestBench.post(served.port, "/run", "{\"value\":{\"who\":\"x\"}}", served.log)));
            served.run();
            assertEquals("{\"calls\":2,\"args\":{}}", GuestBench.canonical(served.lastResult));
            assertTrue(served.startMs > 0 && served.initMs > 0, "the served baseline was started and sent /init, as the runtime is");
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"javascript", "python"})
    void servedBaselineRefusesOtherPathsAndFailsAThrowingMainWithItsError(String lang) throws Exception {
        assumeOnPath(lang);
        try (var served = new GuestBench.HttpBaseline(lang, GuestBench.harness(lang, counter(lang), work), work)) {
            var other = assertThrows(IllegalStateException.class, () -> GuestBench.post(served.port, "/other", "{\"value\":{}}", served.log));
            assertTrue(other.getMessage().startsWith("/other: 404"), other.getMessage());
            var thrown = assertThrows(IllegalStateException.class, () -> GuestBench.post(served.port, "/run", "{\"value\":{\"fail\":true}}", served.log));
            assertTrue(thrown.getMessage().startsWith("/run: 502") && thrown.getMessage().contains("asked to"), thrown.getMessage());
            served.run(); // the server goes on serving
            assertEquals("{\"calls\":1,\"args\":{}}", GuestBench.canonical(served.lastResult));
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"javascript", "python"})
    void servedBaselineThatCannotStartFailsWithItsOutputInsteadOfWaiting(String lang) throws Exception {
        assumeOnPath(lang);
        Path broken = GuestBench.harness(lang, "this is not " + lang + " (\n", work);
        var e = assertThrows(IllegalStateException.class, () -> new GuestBench.HttpBaseline(lang, broken, work).close());
        assertTrue(e.getMessage().contains("exited") && e.getMessage().contains("SyntaxError"), e.getMessage());
    }

    @ParameterizedTest
    @ValueSource(strings = {"javascript", "python"})
    void baselineInProcessTimesMainsFirstCallThenGivesItsResult(String lang) throws Exception {
        assumeOnPath(lang);
        try (var base = new GuestBench.Baseline(lang, GuestBench.harness(lang, counter(lang), work))) {
            assertTrue(base.call() >= 0);
            assertEquals("{\"calls\":2,\"args\":{}}", GuestBench.canonical(base.result()));
        }
    }
}
