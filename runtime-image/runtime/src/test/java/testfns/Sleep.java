package testfns;

import com.google.gson.JsonObject;

public class Sleep {
    public static JsonObject main(JsonObject args) throws InterruptedException {
        Thread.sleep(args.get("ms").getAsLong());
        JsonObject o = new JsonObject();
        o.addProperty("thread", Thread.currentThread().getName());
        o.addProperty("id", args.get("id").getAsInt());
        return o;
    }
}
