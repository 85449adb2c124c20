package testfns;

import com.google.gson.JsonObject;

public class Unicode {
    public static JsonObject main(JsonObject args) {
        String d = args.get("delimiter").getAsString();
        String s = d + " ☃ " + d;
        System.out.println(s);
        JsonObject o = new JsonObject();
        o.addProperty("winter", s);
        return o;
    }
}
