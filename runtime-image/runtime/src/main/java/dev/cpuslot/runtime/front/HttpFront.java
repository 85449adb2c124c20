package dev.cpuslot.runtime.front;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonSyntaxException;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import dev.cpuslot.runtime.base.Metrics;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;
import dev.cpuslot.runtime.core.Reply;
import dev.cpuslot.runtime.core.FunctionRuntime;
import dev.cpuslot.runtime.guard.RuntimeThreads;

/**
 * HTTP endpoints (JDK {@code com.sun.net.httpserver}, one runtime thread per request in flight;
 * the invocation itself runs on a platform worker thread of the function's pool), each handed to
 * its platform's adapter:
 * <ul>
 * <li>OpenWhisk ({@link OpenWhiskAdapter}): {@code POST /init}, {@code POST /run}</li>
 * <li>Knative single entrypoint ({@link KnativeAdapter}) and Hydra invoke: {@code POST /} (Hydra
 *     when the body has {@code name} and {@code arguments})</li>
 * <li>Hydra ({@link HydraAdapter}): {@code /register}, {@code /deregister}, {@code /warmup}</li>
 * <li>Readiness ({@link Readiness}, Knative's readinessProbe): {@code GET /ready}</li>
 * <li>Metrics on their own port: {@code GET /metrics}</li>
 * </ul>
 * All but readiness, Knative's probes and metrics are behind {@link ControlGate}: no connection of
 * this process, so function code cannot act as the platform.
 * {@link #drain} (on SIGTERM) turns every new request away with 503, {@code /ready} too, and waits
 * for those already taken to be answered.
 *
 * <p>Requests are served on the runtime's own threads ({@link RuntimeThreads#runtimeExecutor}),
 * not virtual ones: the JDK's virtual-thread scheduler makes its carriers from whichever thread
 * hands it work, and a worker waking the request it answers does so from its activation's slot,
 * where the carrier would stay, serving other requests on that invocation's quota and bill. The
 * threads are bounded by the requests in flight, which the platform bounds (Knative's
 * containerConcurrency, OpenWhisk's per-container concurrency), and by the front's own cap
 * ({@code CPUSLOT_FRONT_MAX_REQUESTS}) for a platform that does not: one request more is refused
 * with {@code Retry-After} at once ({@link #overCap}), on a small {@link #RESERVE} of threads beyond the cap
 * that also keeps {@code /ready} answering (past the reserve and as many waiting as the cap, its
 * connection is closed). An idle thread ends after a minute, and a request the kernel refuses a
 * thread for (the pod's pids limit) has its connection closed while the front goes on. Metrics
 * have threads of their own.
 */
public final class HttpFront implements AutoCloseable {
    private final FunctionRuntime rt;
    private final OpenWhiskAdapter openWhisk;
    private final KnativeAdapter knative;
    private final HydraAdapter hydra;
    private final ControlGate control;
    private final HttpServer server;
    private final HttpServer metricsServer;
    /**
     * Threads beyond the cap, for what a front at its cap must still answer, each quick: the
     * probes ({@code /ready}, {@code GET /}) and the refusals of the requests over the cap.
     */
    public static final int RESERVE = 4;
    static final String REFUSED = "cpuslot_front_refused_total";
    /** Requests served at once, the probes aside: at most the cap (CPUSLOT_FRONT_MAX_REQUESTS). */
    private final Semaphore serving;
    private final int cap;
    /** Requests taken and not yet answered (metrics scrapes not counted). */
    private final AtomicInteger taken = new AtomicInteger();
    private volatile boolean draining;

    public HttpFront(FunctionRuntime rt, int port, int metricsPort) throws IOException {
        this(rt, port, metricsPort, true);
    }

    /** @param refuseSelf false only where the runtime's clients are its tests, in its own process */
    public HttpFront(FunctionRuntime rt, int port, int metricsPort, boolean refuseSelf) throws IOException {
        this.rt = rt;
        // the adapters keep the platforms' own state (the OpenWhisk action's init): one front per runtime
        openWhisk = new OpenWhiskAdapter(rt);
        knative = new KnativeAdapter(rt, openWhisk);
        hydra = new HydraAdapter(rt);
        control = new ControlGate(rt.config().controlTokenFile(), rt.config().controlEndpoints(), refuseSelf);
        cap = rt.config().frontMaxRequests();
        serving = new Semaphore(cap);
        rt.metrics().describe(REFUSED, "Requests the HTTP front refused over its cap (CPUSLOT_FRONT_MAX_REQUESTS): "
                + "answer=refused (at once, with Retry-After: OpenWhisk's /run as an error of the activation, any other 503), "
                + "or closed when its reserve was busy too.");
        // its threads end when idle (no shutdown needed); with all busy, as many requests as the cap
        // wait for the first to finish (the reserve's are quick), and one more has its connection
        // closed by the server (counted): the dispatcher never waits
        Executor threads = RuntimeThreads.runtimeExecutor("cpuslot-http", cap + RESERVE, cap);
        readLimit(rt.config().frontReadTimeoutMs());
        server = HttpServer.create(new InetSocketAddress(port), 1024);
        server.setExecutor(task -> {
            try {
                threads.execute(task);
            } catch (RejectedExecutionException e) {
                rt.metrics().inc(REFUSED, Metrics.labels("answer", "closed"));
                throw e;
            }
        });
        server.createContext("/", this::handle);
        if (metricsPort >= 0) {
            metricsServer = HttpServer.create(new InetSocketAddress(metricsPort), 64);
            // threads of its own: a scrape answers whatever the front's load (a scrape at a time)
            metricsServer.setExecutor(RuntimeThreads.runtimeExecutor("cpuslot-metrics", 2, 4));
            metricsServer.createContext("/metrics", ex -> {
                byte[] b = rt.metrics().scrape().getBytes(StandardCharsets.UTF_8);
                ex.getResponseHeaders().set("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
                ex.sendResponseHeaders(200, b.length);
                try (OutputStream os = ex.getResponseBody()) {
                    os.write(b);
                }
            });
        } else {
            metricsServer = null;
        }
    }

    /**
     * The JDK's server reads a request (its headers and body, on a front thread) for as long as it
     * takes unless {@code sun.net.httpserver.maxReqTime} is set: then a timer closes a connection
     * whose request has not fully arrived within it, and the thread reading it goes free. The JDK
     * reads the property once, when the first server of the process is made (the front's, in the
     * runtime), in whole seconds.
     */
    private static void readLimit(long ms) {
        if (ms > 0) System.setProperty("sun.net.httpserver.maxReqTime", String.valueOf((ms + 999) / 1000));
    }

    public void start() {
        server.start();
        if (metricsServer != null) metricsServer.start();
    }

    public int port() { return server.getAddress().getPort(); }
    public int metricsPort() { return metricsServer == null ? -1 : metricsServer.getAddress().getPort(); }

    /**
     * Stops taking requests (each new one, {@code /ready} too, gets 503) and waits until those
     * already taken are answered, at most {@code timeoutMs}. True when none is left running.
     */
    public boolean drain(long timeoutMs) throws InterruptedException {
        draining = true; // before reading taken: a request counted after this sees it (handle)
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        while (taken.get() > 0 && System.nanoTime() - deadline < 0) Thread.sleep(10);
        return taken.get() == 0;
    }

    /** Requests taken and not yet answered. */
    public int running() { return taken.get(); }

    private void handle(HttpExchange ex) throws IOException {
        taken.incrementAndGet(); // before reading draining: drain() either waits for this one or it is refused
        try {
            if (draining) {
                ex.getResponseHeaders().set("Connection", "close");
                try {
                    send(ex, Reply.error(503, "shutting down: this runtime takes no new requests (running ones are finishing)"));
                } finally {
                    ex.close();
                }
                return;
            }
            if (probe(ex)) {
                serve(ex);
                return;
            }
            if (!serving.tryAcquire()) {
                overCap(ex);
                return;
            }
            try {
                serve(ex);
            } finally {
                serving.release();
            }
        } finally {
            taken.decrementAndGet();
        }
    }

    /**
     * Served beyond the cap, on the reserve. Readiness stays Ready at the cap: not-ready would
     * have Knative take the pod out of rotation, all its traffic then on other pods (or none for
     * a single pod) while this one still serves its cap; only the requests over it are refused.
     */
    private static boolean probe(HttpExchange ex) {
        String path = ex.getRequestURI().getPath();
        return path.equals("/ready") || path.equals("/") && ex.getRequestMethod().equals("GET");
    }

    /**
     * A request over the cap: answered at once, never queued, in the shape its platform takes for
     * "not now" without harm: OpenWhisk's {@code /run} as its adapter says; any other 503 (no
     * platform resends it by itself; Retry-After is for a client that does).
     */
    private void overCap(HttpExchange ex) throws IOException {
        rt.metrics().inc(REFUSED, Metrics.labels("answer", "refused"));
        String msg = "too many requests at once: this runtime serves at most " + cap
                + " (CPUSLOT_FRONT_MAX_REQUESTS); retry later";
        Reply r = ex.getRequestURI().getPath().equals("/run") ? OpenWhiskAdapter.refused(msg) : Reply.error(503, msg);
        try {
            send(ex, new Reply(r.status(), r.body(), Map.of("Retry-After", "1")));
        } finally {
            ex.close();
        }
    }

    private void serve(HttpExchange ex) throws IOException {
        try {
            String path = ex.getRequestURI().getPath();
            String method = ex.getRequestMethod();
            Reply r;
            byte[] raw = readBody(ex);
            if (raw == null) {
                r = Reply.error(413, "request body larger than " + Config.MAX_BODY + " bytes");
            } else {
                String quotaHeader = ex.getRequestHeaders().getFirst(Config.QUOTA_HEADER);
                boolean usage = "reply".equalsIgnoreCase(ex.getRequestHeaders().getFirst(Config.USAGE_HEADER));
                String no = control.refusal(path, method, raw.length, ex.getRemoteAddress(), ex.getLocalAddress(), ex.getRequestHeaders());
                if (no != null) {
                    rt.metrics().inc("cpuslot_bad_requests_total", Metrics.labels("reason", "control_refused"));
                    r = Reply.error(403, no);
                } else switch (path) {
                    case "/init" -> r = withJson(raw, o -> openWhisk.init(o));
                    case "/run" -> r = withJson(raw, o -> openWhisk.run(o, quotaHeader, usage));
                    case "/register" -> r = hydra.register(query(ex), raw);
                    case "/deregister" -> r = hydra.deregister(query(ex));
                    case "/warmup" -> r = Reply.ok();
                    case "/ready" -> r = rt.ready();
                    case "/" -> {
                        if (method.equals("GET") || raw.length == 0) {
                            r = Reply.ok();
                        } else {
                            boolean report = "body".equalsIgnoreCase(ex.getRequestHeaders().getFirst("X-Cpuslot-Report"));
                            r = withJson(raw, o -> o.has("name") && o.has("arguments")
                                    ? hydra.invoke(o, quotaHeader, report, usage)
                                    : knative.handle(o, quotaHeader, usage));
                        }
                    }
                    default -> r = Reply.error(404, "no such endpoint: " + path);
                }
            }
            try {
                send(ex, r);
            } finally {
                after(r); // the caller has its answer (or is gone)
            }
        } catch (RuntimeException e) {
            Log.stackTrace("request failed: " + e, e);
            send(ex, Reply.error(500, "internal error: " + e));
        } finally {
            ex.close();
        }
    }

    private Reply withJson(byte[] raw, java.util.function.Function<JsonObject, Reply> f) {
        JsonElement e;
        try {
            e = JsonParser.parseString(new String(raw, StandardCharsets.UTF_8));
        } catch (JsonSyntaxException | IllegalStateException ex) {
            rt.metrics().inc("cpuslot_bad_requests_total", Metrics.labels("reason", "malformed_json"));
            return Reply.error(400, "malformed JSON: " + ex.getMessage());
        }
        if (!e.isJsonObject()) {
            rt.metrics().inc("cpuslot_bad_requests_total", Metrics.labels("reason", "not_an_object"));
            return Reply.error(400, "the request body must be a JSON object");
        }
        return f.apply(e.getAsJsonObject());
    }

    private static byte[] readBody(HttpExchange ex) throws IOException {
        try (InputStream in = ex.getRequestBody()) {
            byte[] b = in.readNBytes(Config.MAX_BODY + 1);
            return b.length > Config.MAX_BODY ? null : b;
        }
    }

    static Map<String, String> query(HttpExchange ex) {
        Map<String, String> m = new LinkedHashMap<>();
        String q = ex.getRequestURI().getRawQuery();
        if (q == null) return m;
        for (String kv : q.split("&")) {
            if (kv.isEmpty()) continue;
            int i = kv.indexOf('=');
            String k = URLDecoder.decode(i < 0 ? kv : kv.substring(0, i), StandardCharsets.UTF_8);
            String v = i < 0 ? "" : URLDecoder.decode(kv.substring(i + 1), StandardCharsets.UTF_8);
            m.put(k, v);
        }
        return m;
    }

    /** The reply's work for after it is sent (the activation's log line and usage metrics). */
    private static void after(Reply r) {
        if (r.after() == null) return;
        try {
            r.after().run();
        } catch (RuntimeException e) {
            Log.stackTrace("after the reply: " + e, e);
        }
    }

    private static void send(HttpExchange ex, Reply r) throws IOException {
        byte[] b = r.body().toString().getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        r.headers().forEach((k, v) -> ex.getResponseHeaders().set(k, v));
        ex.sendResponseHeaders(r.status(), b.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(b);
        }
    }

    @Override
    public void close() {
        server.stop(0);
        if (metricsServer != null) metricsServer.stop(0);
    }
}
