package dev.cpuslot.runtime;

import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.ForkJoinWorkerThread;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Issue 30: no thread that serves the HTTP front is started by a worker. A worker runs in its
 * activation's slot and Linux starts a thread in its creator's cgroup, so such a thread would run
 * other requests on that invocation's quota and bill for as long as it lives. CPU affinity, which
 * a new thread inherits from its creator as it does the cgroup, stands in for the slot here (no
 * root needed; RuntimeWithAgentIT checks the cgroups themselves).
 */
class FrontThreadsTest {
    /**
     * A worker pinned to CPU 0 answers a request; then every thread of the process pinned to CPU 0
     * must be a worker. The JDK's virtual-thread scheduler (which served the front before) makes
     * a carrier from whichever thread hands it work while it has fewer carriers than its
     * parallelism and none idle: when the process has one, the test holds it in that state, every
     * carrier busy and room for one more, as a loaded runtime's would be, so that a front that
     * depends on it fails every time rather than now and then.
     */
    @Test
    void aWorkerThatWakesARequestStartsNoThreadOfTheFront() throws Exception {
        Assumptions.assumeTrue(Runtime.getRuntime().availableProcessors() >= 2, "needs two CPUs");
        try (Harness h = new Harness(); ExecutorService callers = Executors.newCachedThreadPool()) {
            assertEquals(200, h.post("/init", initJava("testfns.Waits")).status());
            CompletableFuture<Resp> answer = CompletableFuture.supplyAsync(() -> {
                try {
                    return h.post("/run", run(json("{}")));
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            }, callers);
            Thread worker = awaitWaiting();
            List<String> workers = tids(comm -> comm.startsWith("fn-"));
            // pinned already, by another test's pinned thread (its process reaper): not this one's
            List<String> before = tids(comm -> true).stream().filter(t -> "0".equals(cpus(t))).toList();
            for (String w : workers) {
                if (!pin(w, "0")) Assumptions.assumeTrue(false, "cannot pin a thread here (taskset)");
            }
            try {
                try (AutoCloseable held = carriersBusyWithRoomForOne()) {
                    worker.interrupt(); // Waits answers: the worker completes the request's future
                    Resp r = answer.get(120, TimeUnit.SECONDS);
                    assertEquals(200, r.status(), r.raw());
                }
                List<String> pinned = new ArrayList<>();
                for (String t : tids(comm -> true)) {
                    String cpus = cpus(t);
                    if ("0".equals(cpus) && !workers.contains(t) && !before.contains(t)) pinned.add(comm(t) + " (" + t + ")");
                }
                assertEquals(List.of(), pinned, "threads started by the worker pinned to CPU 0 (as by a worker in its slot)");
            } finally {
                String all = cpus(tid());
                for (String w : workers) pin(w, all);
            }
        }
    }

    /** The worker running testfns.Waits, once it sleeps there (a hang says so after a minute). */
    private static Thread awaitWaiting() throws InterruptedException {
        for (int i = 0; i < 6000; i++) {
            List<Thread> w = workersInWaits();
            if (!w.isEmpty()) return w.get(0);
            Thread.sleep(10);
        }
        throw new AssertionError("no worker sleeping in testfns.Waits after a minute: " + Thread.getAllStackTraces().keySet());
    }

    /**
     * Puts the JDK's virtual-thread scheduler, if this process has one, where the next thread to
     * hand it work starts a carrier: every carrier busy (a spinning virtual thread on each) and
     * its parallelism one above their number. Closing ends the spinners and restores it.
     */
    private static AutoCloseable carriersBusyWithRoomForOne() throws InterruptedException {
        ForkJoinPool pool = Thread.getAllStackTraces().keySet().stream()
                .filter(t -> t instanceof ForkJoinWorkerThread && t.getClass().getName().equals("jdk.internal.misc.CarrierThread"))
                .map(t -> ((ForkJoinWorkerThread) t).getPool()).findFirst().orElse(null);
        if (pool == null) return () -> {};
        int parallelism = pool.getParallelism(), n = pool.getPoolSize();
        pool.setParallelism(n); // no carrier made for the spinners: each takes one there is
        AtomicBoolean stop = new AtomicBoolean();
        CountDownLatch running = new CountDownLatch(n);
        List<Thread> spinners = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            spinners.add(Thread.ofVirtual().start(() -> {
                running.countDown();
                while (!stop.get()) Thread.onSpinWait();
            }));
        }
        AutoCloseable release = () -> {
            stop.set(true);
            for (Thread s : spinners) s.join();
            pool.setParallelism(parallelism);
        };
        if (!running.await(60, TimeUnit.SECONDS)) {
            try {
                release.close();
            } catch (Exception ignored) {
            }
            throw new AssertionError("the scheduler's " + n + " carriers did not all take a spinner in a minute: " + pool);
        }
        pool.setParallelism(n + 1);
        return release;
    }

    /** The kernel ids of this process's threads whose name (comm) matches. */
    private static String comm(String tid) {
        try {
            return Files.readString(Path.of("/proc/self/task/" + tid + "/comm")).strip();
        } catch (java.io.IOException gone) {
            return "?";
        }
    }

    /** The calling thread's kernel thread id. */
    private static String tid() throws Exception {
        return Files.readSymbolicLink(Path.of("/proc/thread-self")).getFileName().toString();
    }

    /** The CPUs a thread of this process may run on (null if it has ended). */
    private static String cpus(String tid) {
        try {
            return Files.readAllLines(Path.of("/proc/self/task/" + tid + "/status")).stream()
                    .filter(l -> l.startsWith("Cpus_allowed_list:")).findFirst().orElseThrow().split(":")[1].strip();
        } catch (java.io.IOException gone) {
            return null;
        }
    }

    /** Sets a thread's CPU affinity; false where taskset cannot. */
    private static boolean pin(String tid, String cpus) throws Exception {
        Process p = new ProcessBuilder("taskset", "-p", "-c", cpus, tid).redirectErrorStream(true).start();
        p.getInputStream().readAllBytes();
        return p.waitFor() == 0;
    }
}
