package dev.cpuslot.chain;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonElement;
import com.google.gson.JsonParser;
import com.google.gson.ToNumberPolicy;

import com.google.gson.JsonPrimitive;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;

/**
 * Where a Java function meets the runtime. Each function's class loader has its own copy of this
 * class, of Gson and of the chain API (the runtime's are never shared with it), so what crosses is
 * JSON as text and plain JDK types: the runtime calls these through the function's copy.
 */
public final class Boundary {
    private Boundary() {}

    private static final Gson GSON = new GsonBuilder().setObjectToNumberStrategy(ToNumberPolicy.LONG_OR_DOUBLE).serializeNulls().create();

    /** The function's JSON tree of {@code text}. */
    public static Object tree(String text) { return JsonParser.parseString(text); }

    /**
     * The function's {@code Map} of {@code text} (a JSON object; numbers as long or double). Made
     * by hand, not by Gson's data binding, which constructs JDK collections by reflection (the
     * guard lets this copy reflect on the function's classes only).
     */
    public static Object map(String text) { return plain(JsonParser.parseString(text)); }

    private static Object plain(JsonElement e) {
        if (e == null || e.isJsonNull()) return null;
        if (e.isJsonObject()) {
            Map<String, Object> m = new LinkedHashMap<>();
            for (Map.Entry<String, JsonElement> x : e.getAsJsonObject().entrySet()) m.put(x.getKey(), plain(x.getValue()));
            return m;
        }
        if (e.isJsonArray()) {
            List<Object> l = new ArrayList<>();
            for (JsonElement x : e.getAsJsonArray()) l.add(plain(x));
            return l;
        }
        JsonPrimitive p = e.getAsJsonPrimitive();
        if (p.isBoolean()) return p.getAsBoolean();
        if (p.isString()) return p.getAsString();
        String n = p.getAsString();
        try {
            return Long.parseLong(n);
        } catch (NumberFormatException notLong) {
            return Double.parseDouble(n);
        }
    }

    /** A result (a JSON tree, or maps and lists) as JSON text. */
    public static String text(Object result) {
        return result instanceof JsonElement e ? e.toString() : GSON.toJson(result);
    }

    /**
     * Binds (null: unbinds) the calling thread's chain to the runtime's: {@code bus} takes
     * {@code {mode ("sync" or "async"), callee, args as JSON}} and returns {@code {null, result as
     * JSON}} or, when the call gave no result, {@code {kind, detail}} of a {@link ChainException}.
     */
    public static void bind(Function<String[], String[]> bus) {
        Chain.bind(bus == null ? null : new Chain.Bus() {
            @Override public JsonElement call(String function, JsonElement args) {
                return JsonParser.parseString(send(bus, "sync", function, args));
            }

            @Override public void callAsync(String function, JsonElement args) { send(bus, "async", function, args); }
        });
    }

    private static String send(Function<String[], String[]> bus, String mode, String function, JsonElement args) {
        String[] r = bus.apply(new String[]{mode, function, args.toString()});
        if (r[0] != null) throw new ChainException(ChainException.Kind.valueOf(r[0]), function, r[1]);
        return r[1];
    }
}
