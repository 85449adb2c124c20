package testfns;

import com.google.gson.JsonObject;

public class Throws {
    public static JsonObject main(JsonObject args) {
        throw new IllegalStateException("boom");
    }
}
