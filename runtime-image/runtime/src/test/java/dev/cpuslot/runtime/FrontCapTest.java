package dev.cpuslot.runtime;

import org.junit.jupiter.api.Test;

import java.net.URI;
import java.net.http.HttpRequest;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Issue 30: the HTTP front's request threads have a hard cap of their own
 * ({@code CPUSLOT_FRONT_MAX_REQUESTS}), not only the platform's concurrency. A burst beyond it is
 * refused at once with {@code Retry-After} (OpenWhisk's {@code /run} as its activation's error,
 * any other 503) or, past the front's small reserve, has its connection closed: never served nor
 * queued; the front's threads never exceed the cap and the
 * reserve; {@code /ready} and {@code /metrics} answer meanwhile; and once the held requests are
 * answered the front serves again.
 */
class FrontCapTest {
    private static final int CAP = 4;

    @Test
    void aBurstBeyondTheCapIsRefusedAtOnceWhileProbesAnswer() throws Exception {
        Set<String> before = frontTids(); // idle front threads of earlier tests in this JVM (they end after a minute)
        try (Harness h = new Harness(Map.of("CPUSLOT_FRONT_MAX_REQUESTS", String.valueOf(CAP)), null);
             ExecutorService callers = Executors.newCachedThreadPool();
             Sampler threads = new Sampler(before)) {
            int bound = CAP + dev.cpuslot.runtime.front.HttpFront.RESERVE;
            assertEquals(200, h.post("/init", initJava("testfns.Waits")).status());

            // the cap held: CAP invocations sleeping in their workers
            List<CompletableFuture<Resp>> held = runs(h, callers, CAP);
            List<Thread> workers = awaitWaiting(CAP, held);

            // a burst well past the cap and the reserve: each refused or its connection closed, none served
            List<CompletableFuture<Resp>> burst = runs(h, callers, 3 * bound);
            awaitAnsweredWithoutAWorker(burst);
            int refused = 0, closed = 0;
            for (CompletableFuture<Resp> f : burst) {
                if (f.isCompletedExceptionally()) {
                    closed++;
                } else {
                    assertRefused(f.join(), "/run");
                    refused++;
                }
            }
            // the reserve's threads and as many waiting as the cap are answered, whatever the timing
            int answered = dev.cpuslot.runtime.front.HttpFront.RESERVE + CAP;
            assertTrue(refused >= answered, "only " + refused + " of the burst refused, " + closed + " closed; at least " + answered);

            // one at a time, each excess request is refused by the reserve (never closed): OpenWhisk's
            // /run and Knative's POST / each in its platform's shape
            for (int i = 0; i < bound; i++) {
                String path = i % 2 == 0 ? "/run" : "/";
                CompletableFuture<Resp> one = calls(h, callers, 1, path).get(0);
                awaitAnsweredWithoutAWorker(List.of(one));
                assertFalse(one.isCompletedExceptionally(), () -> "a single request beyond the cap had its connection closed: " + one);
                assertRefused(one.join(), path);
                refused++;
            }

            // readiness and metrics answer while the cap is held; the refusals are counted
            Resp ready = h.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + h.front.port() + "/ready")).GET().build());
            assertEquals(200, ready.status(), "ready at the cap (Knative would take the pod out of rotation): " + ready.raw());
            String m = h.metrics();
            double refusedCount = counter(m, "refused"), closedCount = counter(m, "closed");
            assertEquals(burst.size() + bound, refusedCount + closedCount, "every excess request counted once:\n" + m);
            assertTrue(refusedCount >= refused, "refusals counted " + refusedCount + ", seen " + refused + ":\n" + m);
            for (CompletableFuture<Resp> f : held) assertFalse(f.isDone(), "a held request was answered before the excess: " + f);

            // the held ones answer; the front serves up to the cap again
            for (Thread w : workers) w.interrupt();
            for (CompletableFuture<Resp> f : held) assertEquals(200, f.get(120, TimeUnit.SECONDS).status());
            awaitNoneRunning(h); // a caller has its answer a moment before the front lets the request go
            List<CompletableFuture<Resp>> again = runs(h, callers, CAP);
            for (Thread w : awaitWaiting(CAP, again)) w.interrupt();
            for (CompletableFuture<Resp> f : again) {
                Resp r = f.get(120, TimeUnit.SECONDS);
                assertEquals(200, r.status(), r.raw());
            }

            Harness.REAL_OUT.println("FrontCapTest: burst of " + burst.size() + ": " + (burst.size() - closed) + " refused, "
                    + closed + " closed; then " + bound + " one at a time, refused; most front threads at once " + threads.most() + " (cap " + CAP + " + reserve)");
            assertTrue(threads.most() >= CAP, "the sampler saw " + threads.most() + " front threads with " + CAP + " requests held");
            assertTrue(threads.most() <= bound, "the front had " + threads.most() + " request threads at once, above its cap "
                    + CAP + " and reserve (" + bound + ")");
        }
    }

    /**
     * Refused at once, with Retry-After and the typed error: OpenWhisk's /run as 200 (its invoker
     * records the activation's error and keeps the container; it reads a 503 as the container's
     * shutdown), any other path 503.
     */
    private static void assertRefused(Resp r, String path) {
        assertEquals(path.equals("/run") ? 200 : 503, r.status(), path + ": " + r.raw());
        assertNotNull(r.header("Retry-After"), "refused without Retry-After: " + r.http().headers().map());
        assertTrue(r.json() != null && r.obj().has("error")
                && r.obj().get("error").getAsString().contains("CPUSLOT_FRONT_MAX_REQUESTS"), "not the typed error: " + r.raw());
    }

    /** {@code cpuslot_front_refused_total{answer=...}}, 0 when absent. */
    private static double counter(String metrics, String answer) {
        Matcher m = Pattern.compile("(?m)^cpuslot_front_refused_total\\{answer=\"" + answer + "\"} (\\S+)$").matcher(metrics);
        return m.find() ? Double.parseDouble(m.group(1)) : 0;
    }

    /** {@code n} concurrent {@code /run}s: each future has the answer, or fails when the connection closed. */
    private static List<CompletableFuture<Resp>> runs(Harness h, ExecutorService callers, int n) { return calls(h, callers, n, "/run"); }

    /** The same on OpenWhisk's {@code /run} or Knative's {@code POST /}. */
    private static List<CompletableFuture<Resp>> calls(Harness h, ExecutorService callers, int n, String path) {
        List<CompletableFuture<Resp>> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(CompletableFuture.supplyAsync(() -> {
                try {
                    return h.post(path, path.equals("/run") ? run(json("{}")) : "{}");
                } catch (Exception e) {
                    throw new java.util.concurrent.CompletionException(e);
                }
            }, callers));
        }
        return out;
    }

    /**
     * Waits until every one of {@code fs} is answered or closed; fails at once if more than CAP
     * workers sleep in testfns.Waits (a request beyond the cap was served), and says so after
     * a minute of neither.
     */
    private static void awaitAnsweredWithoutAWorker(List<CompletableFuture<Resp>> fs) throws InterruptedException {
        for (int i = 0; i < 6000; i++) {
            List<Thread> w = workersInWaits();
            if (w.size() > CAP) fail("a request beyond the cap reached a worker: " + w.size() + " workers in testfns.Waits, cap " + CAP);
            if (fs.stream().allMatch(CompletableFuture::isDone)) return;
            Thread.sleep(10);
        }
        fail("requests beyond the cap neither answered nor closed after a minute: "
                + fs.stream().filter(f -> !f.isDone()).count() + " of " + fs.size() + " pending; " + workersInWaits().size() + " workers waiting");
    }

    /** Until the front has no request left running (a hang says so after a minute). */
    private static void awaitNoneRunning(Harness h) throws InterruptedException {
        for (int i = 0; i < 6000 && h.front.running() > 0; i++) Thread.sleep(10);
        assertEquals(0, h.front.running(), "requests still running in the front a minute after their answers");
    }

    /** The {@code n} workers sleeping in testfns.Waits, once there are that many (a hang says why after a minute). */
    private static List<Thread> awaitWaiting(int n, List<CompletableFuture<Resp>> theirs) throws InterruptedException {
        for (int i = 0; i < 6000; i++) {
            List<Thread> w = workersInWaits();
            if (w.size() == n) return w;
            for (CompletableFuture<Resp> f : theirs) {
                if (f.isDone()) fail("a request within the cap was answered instead of held: " + (f.isCompletedExceptionally() ? f : f.join().raw()));
            }
            Thread.sleep(10);
        }
        fail("not " + n + " workers sleeping in testfns.Waits after a minute: " + workersInWaits().size());
        return null;
    }

    /** The kernel ids of this process's threads named as the front's request threads. */
    private static Set<String> frontTids() { return new HashSet<>(tids(comm -> comm.startsWith("cpuslot-http"))); }

    /** Samples the number of the front's request threads (those not in {@code before}) until closed; the most seen. */
    private static final class Sampler implements AutoCloseable {
        private final AtomicInteger most = new AtomicInteger();
        private final AtomicBoolean stop = new AtomicBoolean();
        private final Thread t;

        Sampler(Set<String> before) {
            t = Thread.ofPlatform().daemon().name("front-thread-sampler").start(() -> {
                while (!stop.get()) {
                    Set<String> now = frontTids();
                    now.removeAll(before);
                    most.accumulateAndGet(now.size(), Math::max);
                    try {
                        Thread.sleep(5);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            });
        }

        int most() { return most.get(); }

        @Override
        public void close() throws InterruptedException {
            stop.set(true);
            t.join();
        }
    }
}
