package dev.cpuslot.samples;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;

import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/** REST: reads {@code key} from a key-value HTTP service at {@code kv} ({@code GET {kv}/{key}}). */
public class RestKv {
    private static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    public static JsonObject main(JsonObject args) throws Exception {
        String base = args.get("kv").getAsString(), key = args.get("key").getAsString();
        URI uri = URI.create(base.replaceAll("/+$", "") + "/" + URLEncoder.encode(key, StandardCharsets.UTF_8));
        HttpResponse<String> r = HTTP.send(HttpRequest.newBuilder(uri).timeout(Duration.ofSeconds(10)).build(),
                HttpResponse.BodyHandlers.ofString());
        JsonObject o = new JsonObject();
        o.addProperty("key", key);
        o.addProperty("status", r.statusCode());
        if (r.statusCode() == 200) {
            JsonElement v;
            try {
                v = JsonParser.parseString(r.body());
            } catch (RuntimeException e) {
                v = new com.google.gson.JsonPrimitive(r.body());
            }
            o.add("value", v);
        }
        return o;
    }
}
