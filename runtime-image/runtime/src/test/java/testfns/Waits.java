package testfns;

import com.google.gson.JsonObject;

/** Sleeps until its worker is interrupted, then answers: a test wakes it when it is ready. */
public class Waits {
    public static JsonObject main(JsonObject args) {
        try {
            while (true) Thread.sleep(60_000);
        } catch (InterruptedException woken) {
            JsonObject o = new JsonObject();
            o.addProperty("woken", true);
            return o;
        }
    }
}
