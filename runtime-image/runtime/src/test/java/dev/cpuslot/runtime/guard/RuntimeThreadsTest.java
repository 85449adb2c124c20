package dev.cpuslot.runtime.guard;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

class RuntimeThreadsTest {
    /** The calling thread's kernel thread id. */
    static String tid() throws Exception {
        return Files.readSymbolicLink(Path.of("/proc/thread-self")).getFileName().toString();
    }

    /** The CPUs a thread of this process may run on (its affinity, which a new thread inherits from its creator). */
    static String cpus(String tid) throws Exception {
        return Files.readAllLines(Path.of("/proc/self/task/" + tid + "/status")).stream()
                .filter(l -> l.startsWith("Cpus_allowed_list:")).findFirst().orElseThrow().split(":")[1].strip();
    }

    /**
     * The kernel starts a thread with its creator's per-thread state: its CPU cgroup, and its CPU
     * affinity, which a test can set without root. A caller pinned to CPU 0 (as a worker sits in
     * its slot) starts a runtime thread, a runtime executor's thread and, as a control, a plain
     * thread: the plain one is pinned too, the runtime's are not (the spawner made them).
     */
    @Test
    void aRuntimeThreadStartsWithTheSpawnersStateNotItsCallers() throws Exception {
        Assumptions.assumeTrue(Runtime.getRuntime().availableProcessors() >= 2, "needs two CPUs");
        String all = cpus(tid());
        CompletableFuture<String[]> seen = new CompletableFuture<>();
        Thread caller = Thread.ofPlatform().start(() -> {
            java.util.concurrent.Executor ex = RuntimeThreads.runtimeExecutor("test-exec");
            try {
                Process p = new ProcessBuilder("taskset", "-p", "-c", "0", tid()).redirectErrorStream(true).start();
                String out = new String(p.getInputStream().readAllBytes());
                if (p.waitFor() != 0) throw new IllegalStateException("taskset: " + out);
                String[] r = new String[4];
                r[0] = cpus(tid());
                CompletableFuture<String> rt = new CompletableFuture<>(), plain = new CompletableFuture<>();
                RuntimeThreads.startRuntimeThread("test-runtime", () -> { try { rt.complete(cpus(tid())); } catch (Exception e) { rt.completeExceptionally(e); } });
                Thread.ofPlatform().start(() -> { try { plain.complete(cpus(tid())); } catch (Exception e) { plain.completeExceptionally(e); } });
                r[1] = rt.get(60, TimeUnit.SECONDS);
                CompletableFuture<String> pooled = new CompletableFuture<>();
                ex.execute(() -> { try { pooled.complete(cpus(tid())); } catch (Exception e) { pooled.completeExceptionally(e); } });
                r[2] = pooled.get(60, TimeUnit.SECONDS);
                r[3] = plain.get(60, TimeUnit.SECONDS);
                seen.complete(r);
            } catch (Throwable e) {
                seen.completeExceptionally(e);
            }
        });
        String[] r;
        try {
            r = seen.get(120, TimeUnit.SECONDS);
        } catch (java.util.concurrent.ExecutionException e) {
            Assumptions.assumeTrue(false, "cannot pin a thread here: " + e.getCause());
            return;
        }
        caller.join();
        assertEquals("0", r[0], "the caller is pinned");
        assertEquals("0", r[3], "a plain thread starts with its creator's affinity (the kernel's rule this relies on)");
        assertEquals(all, r[1], "a runtime thread started from the pinned caller");
        assertEquals(all, r[2], "a runtime executor's thread made for the pinned caller's task");
    }

    /** A start from an interrupted thread still starts (and keeps the interrupt); a failed start throws to its caller. */
    @Test
    void startIsTheCallersWhateverItsInterruptAndFailuresComeBack() throws Exception {
        CompletableFuture<Boolean> ran = new CompletableFuture<>();
        Thread.currentThread().interrupt();
        Thread t = RuntimeThreads.startRuntimeThread("test-interrupted", () -> ran.complete(true));
        assertTrue(Thread.interrupted(), "the caller's interrupt is kept");
        assertTrue(ran.get(60, TimeUnit.SECONDS));
        t.join();
        assertSame(RuntimeThreads.RUNTIME_THREADS, RuntimeThreads.runtimeThread("x", () -> {}).getThreadGroup());
        assertThrows(IllegalThreadStateException.class, t::start, "a thread started twice");
    }
}
