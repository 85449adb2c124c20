package dev.cpuslot.samples;

import com.google.gson.JsonObject;

import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.HexFormat;

/** File hashing: downloads {@code url} (a local HTTP server) and returns its SHA-256. */
public class FileHash {
    private static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();

    public static JsonObject main(JsonObject args) throws Exception {
        if (!args.has("url")) throw new IllegalArgumentException("missing url");
        URI uri = URI.create(args.get("url").getAsString());
        HttpResponse<InputStream> r = HTTP.send(HttpRequest.newBuilder(uri).timeout(Duration.ofSeconds(60)).build(),
                HttpResponse.BodyHandlers.ofInputStream());
        if (r.statusCode() != 200) throw new IllegalStateException("HTTP " + r.statusCode() + " from " + uri);
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        long n = 0;
        try (InputStream in = r.body()) {
            byte[] buf = new byte[64 * 1024];
            for (int k; (k = in.read(buf)) > 0; n += k) sha.update(buf, 0, k);
        }
        JsonObject o = new JsonObject();
        o.addProperty("url", uri.toString());
        o.addProperty("bytes", n);
        o.addProperty("sha256", HexFormat.of().formatHex(sha.digest()));
        return o;
    }
}
