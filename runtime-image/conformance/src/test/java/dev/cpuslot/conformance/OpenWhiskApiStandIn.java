package dev.cpuslot.conformance;

import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.Executors;

/**
 * A stand-in for the OpenWhisk controller's REST API as far as an action invoking another action
 * sees it ({@code POST /api/v1/namespaces/{ns}/actions/{name}?blocking=true&result=true}, basic
 * auth by the caller's api_key): the controller itself cannot run here (see the e2e tests' stand-in
 * for the annotation read). It records every request and answers as the controller does
 * (Actions.scala doInvoke): 200 with the result, 502 with an application error's result, 202 with
 * the activation id for a non-blocking invoke, 401/404 with {@code {"error"}}. Also serves as a
 * Knative service: any other path answers the {@code answers} entry of its last segment.
 */
final class OpenWhiskApiStandIn implements AutoCloseable {
    record Request(String method, String pathAndQuery, String authorization, String body) {}

    /** An answer: status, body, and how long to wait before sending it. */
    record Answer(int status, String body, long delayMs) {}

    /** Every request but the annotation reads (GET), in order. */
    final List<Request> requests = new CopyOnWriteArrayList<>();
    final java.util.concurrent.atomic.AtomicInteger reads = new java.util.concurrent.atomic.AtomicInteger();
    /** By action name (what follows /actions/) or last path segment; default: echo the body's params. */
    final Map<String, Answer> answers = new ConcurrentHashMap<>();
    final String apiKey;
    /** When set, answers every invocation (action name, body): a controller that forwards to a runtime. */
    volatile java.util.function.BiFunction<String, String, Answer> forward;
    /** The annotations the read of an action answers (a JSON array): none by default. */
    volatile String annotations = "[]";
    /** How long the read of an action's annotations takes to answer (a slow API): none by default. */
    volatile long readDelayMs;
    /** When false, requests are not recorded (a benchmark's thousands). */
    volatile boolean recording = true;
    private final HttpServer server;
    /** Ends the slow reads' waits at close. */
    private final java.util.concurrent.CountDownLatch closed = new java.util.concurrent.CountDownLatch(1);

    OpenWhiskApiStandIn(String apiKey) throws IOException {
        this.apiKey = apiKey;
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 64);
        server.setExecutor(Executors.newVirtualThreadPerTaskExecutor());
        server.createContext("/", ex -> {
            String body = new String(ex.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
            String pq = ex.getRequestURI().getRawPath() + (ex.getRequestURI().getRawQuery() == null ? "" : "?" + ex.getRequestURI().getRawQuery());
            String auth = ex.getRequestHeaders().getFirst("Authorization");
            if (ex.getRequestMethod().equals("GET")) { // the runtime's read of the caller's annotations
                reads.incrementAndGet();
                try {
                    if (readDelayMs > 0 && closed.await(readDelayMs, java.util.concurrent.TimeUnit.MILLISECONDS)) {
                        ex.close();
                        return;
                    }
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                byte[] b = ("{\"name\":\"x\",\"annotations\":" + annotations + "}").getBytes(StandardCharsets.UTF_8);
                ex.sendResponseHeaders(200, b.length);
                ex.getResponseBody().write(b);
                ex.close();
                return;
            }
            if (recording) requests.add(new Request(ex.getRequestMethod(), pq, auth, body));
            String path = ex.getRequestURI().getPath();
            int i = path.indexOf("/actions/");
            String name = i >= 0 ? path.substring(i + "/actions/".length()) : path.substring(path.lastIndexOf('/') + 1);
            Answer a;
            if (path.startsWith("/api/v1/") && !("Basic " + java.util.Base64.getEncoder().encodeToString(apiKey.getBytes(StandardCharsets.UTF_8))).equals(auth)) {
                a = new Answer(401, "{\"error\":\"The supplied authentication is invalid\",\"code\":\"x\"}", 0);
            } else if (path.startsWith("/api/v1/") && pq.contains("blocking=false")) {
                a = new Answer(202, "{\"activationId\":\"0123456789abcdef0123456789abcdef\"}", 0);
            } else if (forward != null) {
                a = forward.apply(name, body);
            } else {
                a = answers.getOrDefault(name, new Answer(200, body.isBlank() ? "{}" : body, 0));
            }
            try {
                if (a.delayMs() > 0) Thread.sleep(a.delayMs());
                byte[] b = a.body().getBytes(StandardCharsets.UTF_8);
                ex.getResponseHeaders().set("Content-Type", "application/json");
                ex.getResponseHeaders().set("X-Openwhisk-Activation-Id", "fedcba9876543210fedcba9876543210");
                ex.sendResponseHeaders(a.status(), b.length);
                ex.getResponseBody().write(b);
            } catch (InterruptedException | IOException e) {
                // the caller went away (its deadline): nothing to answer
            } finally {
                ex.close();
            }
        });
        server.start();
    }

    String url() { return "http://127.0.0.1:" + server.getAddress().getPort(); }

    @Override
    public void close() {
        closed.countDown();
        server.stop(0);
    }
}
