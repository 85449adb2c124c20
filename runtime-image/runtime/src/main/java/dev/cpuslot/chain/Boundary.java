package dev.cpuslot.chain;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import com.google.gson.JsonSyntaxException;
import com.google.gson.ToNumberPolicy;
import com.google.gson.internal.LazilyParsedNumber;
import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;

import java.io.IOException;
import java.io.StringReader;
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

    /** Made at the first result that is not plain JSON (a new function's first call need not load Gson's data binding). */
    private static final class Binding {
        static final Gson GSON = new GsonBuilder().setObjectToNumberStrategy(ToNumberPolicy.LONG_OR_DOUBLE).serializeNulls().create();
    }

    /**
     * The function's JSON tree of {@code text}, as {@code JsonParser} makes it. Read with Gson's
     * streaming reader, here and in {@link #map}: its tree and data binding adapters are some 50
     * classes that each function would define, verify and initialise again on its first call.
     */
    public static Object tree(String text) { return read(text, false); }

    /**
     * The function's {@code Map} of {@code text} (a JSON object; numbers as long or double). Made
     * by hand, not by Gson's data binding, which constructs JDK collections by reflection (the
     * guard lets this copy reflect on the function's classes only).
     */
    public static Object map(String text) { return read(text, true); }

    /** The whole of {@code text} as plain values ({@link #map}) or a tree ({@link #tree}); no lambda: each would spin a class per function. */
    private static Object read(String text, boolean plain) {
        try {
            JsonReader r = new JsonReader(new StringReader(text));
            // as JsonParser reads; setLenient, not setStrictness: a jar in a runtime for trusted
            // code may ship a Gson older than 2.11 in place of the runtime's copy
            r.setLenient(true);
            Object v = plain ? value(r) : element(r);
            if (r.peek() != JsonToken.END_DOCUMENT) throw new JsonSyntaxException("Did not consume the entire document.");
            return v;
        } catch (IOException e) {
            throw new JsonSyntaxException(e);
        }
    }

    private static JsonElement element(JsonReader r) throws IOException {
        switch (r.peek()) {
            case BEGIN_OBJECT -> {
                JsonObject o = new JsonObject();
                r.beginObject();
                while (r.hasNext()) {
                    String k = r.nextName();
                    o.add(k, element(r));
                }
                r.endObject();
                return o;
            }
            case BEGIN_ARRAY -> {
                JsonArray a = new JsonArray();
                r.beginArray();
                while (r.hasNext()) a.add(element(r));
                r.endArray();
                return a;
            }
            case STRING -> { return new JsonPrimitive(r.nextString()); }
            case NUMBER -> { return new JsonPrimitive(new LazilyParsedNumber(r.nextString())); }
            case BOOLEAN -> { return new JsonPrimitive(r.nextBoolean()); }
            case NULL -> {
                r.nextNull();
                return JsonNull.INSTANCE;
            }
            default -> throw new JsonSyntaxException("Unexpected " + r.peek() + " at " + r.getPath());
        }
    }

    private static Object value(JsonReader r) throws IOException {
        switch (r.peek()) {
            case BEGIN_OBJECT -> {
                Map<String, Object> m = new LinkedHashMap<>();
                r.beginObject();
                while (r.hasNext()) {
                    String k = r.nextName();
                    m.put(k, value(r));
                }
                r.endObject();
                return m;
            }
            case BEGIN_ARRAY -> {
                List<Object> l = new ArrayList<>();
                r.beginArray();
                while (r.hasNext()) l.add(value(r));
                r.endArray();
                return l;
            }
            case STRING -> { return r.nextString(); }
            case NUMBER -> {
                String n = r.nextString();
                try {
                    return Long.parseLong(n);
                } catch (NumberFormatException notLong) {
                    return Double.parseDouble(n);
                }
            }
            case BOOLEAN -> { return r.nextBoolean(); }
            case NULL -> {
                r.nextNull();
                return null;
            }
            default -> throw new JsonSyntaxException("Unexpected " + r.peek() + " at " + r.getPath());
        }
    }

    /**
     * A result (a JSON tree, or maps and lists) as JSON text. Maps with string keys, collections,
     * strings, booleans, integers and finite doubles are written here, as Gson writes them (the
     * runtime parses the text again, so only the values must agree); anything else goes to Gson.
     */
    public static String text(Object result) {
        StringBuilder b = new StringBuilder();
        if (plain(result, b)) return b.toString();
        return result instanceof JsonElement e ? e.toString() : Binding.GSON.toJson(result);
    }

    /** Writes {@code v} to {@code b} as JSON; false: something in it is not plain JSON ({@code b} is then dropped). */
    private static boolean plain(Object v, StringBuilder b) {
        if (v == null || v instanceof JsonNull) {
            b.append("null");
        } else if (v instanceof JsonPrimitive p) {
            if (p.isString()) {
                quote(p.getAsString(), b);
            } else if (p.isBoolean()) {
                b.append(p.getAsBoolean());
            } else {
                Number n = p.getAsNumber();
                if (n instanceof LazilyParsedNumber) b.append(n); // its text, as Gson writes it
                else if (!plain(n, b)) return false;
            }
        } else if (v instanceof JsonObject o) {
            // entrySet and the array's iterator, which every Gson has (asMap and asList are 2.10's)
            return members(o.entrySet(), b);
        } else if (v instanceof JsonArray a) {
            return elements(a, b);
        } else if (v instanceof String s) {
            quote(s, b);
        } else if (v instanceof Boolean || v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            b.append(v);
        } else if (v instanceof Double d) {
            if (d.isNaN() || d.isInfinite()) return false; // Gson's own error
            b.append(d.doubleValue());
        } else if (v instanceof Map<?, ?> m) {
            return members(m.entrySet(), b);
        } else if (v instanceof java.util.Collection<?> c) {
            return elements(c, b);
        } else {
            return false;
        }
        return true;
    }

    /** An object's members (string keys only: Gson writes any other key its own way). */
    private static boolean members(Iterable<? extends Map.Entry<?, ?>> entries, StringBuilder b) {
        b.append('{');
        boolean first = true;
        for (Map.Entry<?, ?> x : entries) {
            if (!(x.getKey() instanceof String k)) return false;
            if (!first) b.append(',');
            first = false;
            quote(k, b);
            b.append(':');
            if (!plain(x.getValue(), b)) return false;
        }
        b.append('}');
        return true;
    }

    private static boolean elements(Iterable<?> items, StringBuilder b) {
        b.append('[');
        boolean first = true;
        for (Object x : items) {
            if (!first) b.append(',');
            first = false;
            if (!plain(x, b)) return false;
        }
        b.append(']');
        return true;
    }

    private static void quote(String s, StringBuilder b) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20 || c == '\u2028' || c == '\u2029') {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        b.append('"');
    }

    /**
     * Binds (null: unbinds) the calling thread's chain to the runtime's: {@code bus} takes
     * {@code {mode ("sync" or "async"), callee, args as JSON}} and returns {@code {null, result as
     * JSON}} or, when the call gave no result, {@code {kind, detail}} of a {@link ChainException}.
     */
    public static void bind(Function<String[], String[]> bus) {
        Chain.bind(bus == null ? null : new Chain.Bus() {
            @Override public JsonElement call(String function, JsonElement args) {
                return (JsonElement) tree(send(bus, "sync", function, args));
            }

            @Override public void callAsync(String function, JsonElement args) { send(bus, "async", function, args); }
        });
    }

    private static String send(Function<String[], String[]> bus, String mode, String function, JsonElement args) {
        String[] r = bus.apply(new String[]{mode, function, text(args)});
        if (r[0] != null) throw new ChainException(ChainException.Kind.valueOf(r[0]), function, r[1]);
        return r[1];
    }
}
