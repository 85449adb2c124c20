package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import com.sun.net.httpserver.HttpServer;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

/**
 * SIGTERM (Kubernetes deleting the pod: a rollout, a scale-down) against the runtime as the image
 * starts it: the invocation running when the signal arrives finishes and its caller gets the
 * answer, the runtime answers not ready and refuses new requests while it drains, then exits 0.
 */
@DisplayName("graceful drain on SIGTERM")
class DrainTest {
    private static final Duration WAIT = ActionContainer.REQUEST_TIMEOUT;

    /** An action that calls back to the test's gate ({@code gate} argument: a URL) and answers what the gate said. */
    private static String gated() throws Exception {
        return Archives.jar(Map.of("example/Gated.java", """
                package example;
                import com.google.gson.JsonObject;
                public class Gated {
                    public static JsonObject main(JsonObject args) throws Exception {
                        String said;
                        try (var in = java.net.URI.create(args.get("gate").getAsString()).toURL().openStream()) {
                            said = new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
                        }
                        JsonObject o = new JsonObject();
                        o.addProperty("gate", said);
                        return o;
                    }
                }
                """));
    }

    @Test
    void runningInvocationFinishesNewOnesAreRefusedThenExit() throws Exception {
        CountDownLatch arrived = new CountDownLatch(1), open = new CountDownLatch(1);
        HttpServer gate = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 8);
        gate.createContext("/gate", ex -> {
            arrived.countDown();
            try {
                open.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            byte[] b = "opened".getBytes(StandardCharsets.UTF_8);
            ex.sendResponseHeaders(200, b.length);
            try (var os = ex.getResponseBody()) {
                os.write(b);
            }
        });
        gate.setExecutor(java.util.concurrent.Executors.newVirtualThreadPerTaskExecutor());
        gate.start();
        try {
            String jar = gated();
            ActionContainer.with("java", env("CPUSLOT_DRAIN_TIMEOUT", "600s"), c -> {
                assertEquals(200, c.init(initPayload(jar, "example.Gated", true, null)).code(), "/init");
                assertEquals(200, c.get("/ready").code(), "ready before SIGTERM");
                JsonObject args = new JsonObject();
                args.addProperty("gate", "http://127.0.0.1:" + gate.getAddress().getPort() + "/gate");
                CompletableFuture<Reply> running = CompletableFuture.supplyAsync(() -> {
                    try {
                        return c.run(runPayload(args));
                    } catch (Exception e) {
                        throw new RuntimeException(e);
                    }
                });
                if (!arrived.await(WAIT.toMillis(), TimeUnit.MILLISECONDS))
                    fail("the invocation did not reach the gate within " + WAIT + "; /run: " + (running.isDone() ? running.join() : "pending"));

                c.terminate();
                Reply ready = awaitNotReady(c);
                assertEquals(503, ready.code(), "/ready while draining: " + ready.raw());
                Reply refused = c.run(runPayload(args));
                assertEquals(503, refused.code(), "a new /run while draining: " + refused.raw());
                assertTrue(refused.body().get("error").getAsString().contains("shutting down"), "why: " + refused.raw());
                assertTrue(c.alive(), "the runtime exited with an invocation still running");

                open.countDown();
                Reply answer = running.get(WAIT.toMillis(), TimeUnit.MILLISECONDS);
                assertEquals(200, answer.code(), "the running invocation's answer: " + answer.raw());
                assertEquals("opened", answer.body().get("gate").getAsString(), "its result: " + answer.raw());
                assertEquals(0, c.awaitExit(WAIT, "after the drain (runtime log: " + Files.readString(c.runtimeLog) + ")"),
                        "exit code after a complete drain");
                String log = Files.readString(c.runtimeLog);
                assertTrue(log.contains("SIGTERM: draining") && log.contains("drained in"), "runtime log:\n" + log);
            });
        } finally {
            open.countDown();
            gate.stop(0);
        }
    }

    /** The drain starts when the signal is handled: /ready turns 503 then (deadline: the request timeout). */
    private static Reply awaitNotReady(ActionContainer c) throws Exception {
        long until = System.nanoTime() + WAIT.toNanos();
        Reply r = null;
        while (System.nanoTime() - until < 0) {
            try {
                r = c.get("/ready");
            } catch (java.net.ConnectException e) {
                fail("the runtime stopped listening on SIGTERM instead of draining (alive: " + c.alive() + ")", e);
            }
            if (r.code() != 200) return r;
            Thread.sleep(20);
        }
        fail("/ready still answered 200 " + WAIT + " after SIGTERM: " + (r == null ? null : r.raw()));
        return r;
    }
}
