package dev.cpuslot.runtime;

import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * A relay in the test's process that forwards each request to a runtime's port over loopback, as
 * Knative's queue-proxy does from its own container: for a function that calls its runtime's HTTP
 * path, which answers no connection of the runtime's own process. Shared with the conformance
 * and integration tests (this module's test-jar).
 */
public final class Relay implements AutoCloseable {
    private final HttpServer server;
    private final ExecutorService executor = Executors.newVirtualThreadPerTaskExecutor();
    private final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

    public Relay(int target) throws IOException {
        server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 256);
        server.setExecutor(executor);
        server.createContext("/", ex -> {
            try (ex) {
                HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + target + ex.getRequestURI()))
                        .method(ex.getRequestMethod(), HttpRequest.BodyPublishers.ofByteArray(ex.getRequestBody().readAllBytes()));
                String type = ex.getRequestHeaders().getFirst("Content-Type");
                if (type != null) b.header("Content-Type", type);
                HttpResponse<byte[]> r = http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
                ex.sendResponseHeaders(r.statusCode(), r.body().length == 0 ? -1 : r.body().length);
                try (OutputStream os = ex.getResponseBody()) {
                    os.write(r.body());
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        server.start();
    }

    public int port() { return server.getAddress().getPort(); }

    @Override
    public void close() {
        server.stop(0);
        executor.shutdownNow();
    }
}
