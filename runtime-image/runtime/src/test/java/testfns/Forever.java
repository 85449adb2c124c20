package testfns;

import com.google.gson.JsonObject;

public class Forever {
    public static JsonObject main(JsonObject args) throws InterruptedException {
        while (true) Thread.sleep(50);
    }
}
