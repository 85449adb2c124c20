package testfns;

import com.google.gson.JsonObject;
import java.util.Map;

public class Env {
    public static JsonObject main(JsonObject args, Map<String, String> env) {
        JsonObject o = new JsonObject();
        env.forEach(o::addProperty);
        return o;
    }
}
