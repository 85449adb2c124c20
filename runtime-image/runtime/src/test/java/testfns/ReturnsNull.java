package testfns;

import com.google.gson.JsonObject;

public class ReturnsNull {
    public static JsonObject main(JsonObject args) { return null; }
}
