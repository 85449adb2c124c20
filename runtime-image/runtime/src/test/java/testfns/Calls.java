package testfns;

import com.google.gson.JsonObject;
import dev.cpuslot.chain.Chain;

/** Calls {@code callee} synchronously with {@code args} and returns what it got. */
public class Calls {
    public static JsonObject main(JsonObject a) {
        JsonObject r = new JsonObject();
        r.add("got", Chain.call(a.get("callee").getAsString(), a.getAsJsonObject("args")));
        return r;
    }
}
