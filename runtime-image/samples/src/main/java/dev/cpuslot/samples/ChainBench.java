package dev.cpuslot.samples;

import com.google.gson.JsonArray;
import com.google.gson.JsonObject;
import dev.cpuslot.chain.Chain;

import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URL;
import java.nio.charset.StandardCharsets;

/**
 * Hop latency (docs/chaining.md): calls the function {@code callee} {@code n} times, through the
 * local bus ({@code "mode":"local"}) or through the runtime's Hydra HTTP path by a relay on
 * {@code port} ({@code "mode":"http"}: the runtime answers no connection of its own process, so
 * the call goes through another process, as Knative's queue-proxy), and returns each call's time
 * in nanoseconds ({@code ns}).
 */
public class ChainBench {
    public static JsonObject main(JsonObject a) throws Exception {
        String mode = a.get("mode").getAsString(), callee = a.get("callee").getAsString();
        int n = a.get("n").getAsInt();
        JsonObject args = new JsonObject();
        JsonObject req = new JsonObject();
        req.addProperty("name", callee);
        req.addProperty("arguments", "{}");
        byte[] body = req.toString().getBytes(StandardCharsets.UTF_8);
        URL url = mode.equals("http") ? URI.create("http://127.0.0.1:" + a.get("port").getAsInt() + "/").toURL() : null;
        JsonArray ns = new JsonArray();
        for (int i = 0; i < n; i++) {
            long t0 = System.nanoTime();
            if (url == null) {
                Chain.call(callee, args);
            } else {
                HttpURLConnection c = (HttpURLConnection) url.openConnection(); // keep-alive: the JDK reuses the connection
                c.setRequestMethod("POST");
                c.setDoOutput(true);
                c.setRequestProperty("Content-Type", "application/json");
                try (OutputStream o = c.getOutputStream()) { o.write(body); }
                try (InputStream in = c.getInputStream()) { in.readAllBytes(); }
                if (c.getResponseCode() != 200) throw new IllegalStateException("HTTP " + c.getResponseCode());
            }
            ns.add(System.nanoTime() - t0);
        }
        JsonObject r = new JsonObject();
        r.add("ns", ns);
        return r;
    }
}
