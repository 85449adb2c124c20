package testfns;

import com.google.gson.JsonObject;

public class Spawns {
    public static JsonObject main(JsonObject args) {
        Thread t = new Thread(() -> {
            try {
                Thread.sleep(1500);
            } catch (InterruptedException ignored) {
            }
        });
        t.setDaemon(true);
        t.start();
        JsonObject o = new JsonObject();
        o.addProperty("spawned", t.isAlive());
        return o;
    }
}
