package dev.cpuslot.samples;

import com.google.gson.JsonObject;

/** Hello world: {@code {"name": "x"}} -> {@code {"greeting": "Hello x!"}}. */
public class HelloWorld {
    public static JsonObject main(JsonObject args) {
        String name = args.has("name") ? args.get("name").getAsString() : "stranger";
        JsonObject o = new JsonObject();
        o.addProperty("greeting", "Hello " + name + "!");
        return o;
    }
}
