package dev.cpuslot.chain;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonSyntaxException;
import com.google.gson.ToNumberPolicy;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Random;

import static org.junit.jupiter.api.Assertions.*;

/**
 * A Java function's result as text: what Boundary writes by hand (plain maps, lists and scalars)
 * is, once parsed again as the runtime parses it, what Gson wrote for the same value; anything
 * else is Gson's.
 */
class BoundaryTest {
    /** Gson as Boundary configures it before its own writer. */
    private static final Gson GSON = new GsonBuilder().setObjectToNumberStrategy(ToNumberPolicy.LONG_OR_DOUBLE).serializeNulls().create();

    private static void same(Object v) {
        String want = JsonParser.parseString(GSON.toJson(v)).toString();
        assertEquals(want, JsonParser.parseString(Boundary.text(v)).toString(), () -> "for " + v);
    }

    @Test
    void plainValuesAreWrittenAsGsonWritesThem() {
        Map<String, Object> nulls = new LinkedHashMap<>();
        nulls.put("a", null);
        nulls.put("b", Arrays.asList(1, null, "x"));
        for (Object v : List.<Object>of(
                Map.of("hello", "world"), Map.of(), List.of(), nulls,
                Map.of("n", 1, "l", 1L << 40, "s", (short) -3, "b", (byte) 7, "t", true, "f", false),
                Map.of("d", 1.0, "e", -0.0, "g", 1e300, "h", 4.9e-324, "i", 0.1 + 0.2, "j", 123456789.125),
                Map.of("q", "\"quoted\" \\ back", "c", "\u0000\u0001\u001f\t\n\r", "u", "\u2028\u2029 <&'=> é ☃ \ud83d\ude00", "lone", "\ud800x"),
                new LinkedHashSet<>(List.of("x", "y")), List.of(List.of(List.of(Map.of("deep", List.of(1, 2.5)))))))
            same(v);
    }

    @Test
    void randomPlainValuesAgree() {
        Random r = new Random(42);
        for (int i = 0; i < 2000; i++) same(random(r, 0));
    }

    private static Object random(Random r, int depth) {
        int k = r.nextInt(depth > 3 ? 7 : 9);
        return switch (k) {
            case 0 -> null;
            case 1 -> r.nextBoolean();
            case 2 -> r.nextLong() >> r.nextInt(64);
            case 3 -> r.nextInt();
            case 4 -> r.nextDouble() * Math.pow(10, r.nextInt(40) - 20) * (r.nextBoolean() ? 1 : -1);
            case 5, 6 -> {
                StringBuilder b = new StringBuilder();
                for (int j = r.nextInt(8); j > 0; j--) b.append((char) (r.nextInt(4) == 0 ? r.nextInt(0x10000) : 0x20 + r.nextInt(0x5f)));
                yield b.toString();
            }
            case 7 -> {
                Map<String, Object> m = r.nextBoolean() ? new LinkedHashMap<>() : new HashMap<>();
                for (int j = r.nextInt(5); j > 0; j--) m.put("k" + r.nextInt(100), random(r, depth + 1));
                yield m;
            }
            default -> {
                List<Object> l = new ArrayList<>();
                for (int j = r.nextInt(5); j > 0; j--) l.add(random(r, depth + 1));
                yield l;
            }
        };
    }

    @Test
    void treesAreReadAsJsonParserReadsThemAndWrittenAsTheyPrint() {
        Random r = new Random(7);
        for (int i = 0; i < 2000; i++) {
            String text = GSON.toJson(random(r, 0));
            JsonElement want = JsonParser.parseString(text);
            Object got = Boundary.tree(text);
            assertEquals(want, got, text);
            assertEquals(want.toString(), ((JsonElement) got).toString(), text);
            assertEquals(want.toString(), JsonParser.parseString(Boundary.text(got)).toString(), text);
            assertEquals(want.toString(), JsonParser.parseString(Boundary.text(want)).toString(), text);
        }
        // what a function may build itself: numbers of every kind, NaN (Gson prints it leniently)
        JsonObject o = new JsonObject();
        o.addProperty("i", 1);
        o.addProperty("d", 2.5);
        o.addProperty("f", 1.25f);
        o.addProperty("big", new java.math.BigDecimal("1E+3"));
        o.addProperty("nan", Double.NaN);
        o.addProperty("s", "x\"\u2028");
        o.add("n", JsonNull.INSTANCE);
        o.add("a", new JsonArray());
        assertEquals(o.toString(), Boundary.text(o));
        o.remove("nan");
        assertEquals(JsonParser.parseString(o.toString()).toString(), JsonParser.parseString(Boundary.text(o)).toString());
    }

    @Test
    void mapsAreReadWithLongsAndDoubles() {
        Object m = Boundary.map("{\"a\":1,\"b\":1.5,\"c\":[true,null,\"s\"],\"d\":{\"e\":-9007199254740993},\"f\":1e2,\"g\":12345678901234567890}");
        Map<String, Object> want = new LinkedHashMap<>();
        want.put("a", 1L);
        want.put("b", 1.5);
        want.put("c", Arrays.asList(true, null, "s"));
        want.put("d", Map.of("e", -9007199254740993L));
        want.put("f", 100.0);
        want.put("g", 1.2345678901234567e19);
        assertEquals(want, m);
        assertThrows(JsonSyntaxException.class, () -> Boundary.map("{} x"));
        assertThrows(JsonSyntaxException.class, () -> Boundary.tree("[1,"));
    }

    record Point(int x, String label) {}

    @Test
    void anythingElseIsGsons() {
        Map<Object, Object> numericKeys = new LinkedHashMap<>();
        numericKeys.put(1, "one");
        for (Object v : List.<Object>of(Map.of("p", new Point(1, "a")), Map.of("f", 1.5f), numericKeys,
                Map.of("big", new java.math.BigDecimal("12.50")), List.of(new int[]{1, 2}), Map.of("c", 'x')))
            same(v);
        // Gson's own error for what JSON cannot say
        assertThrows(IllegalArgumentException.class, () -> Boundary.text(Map.of("nan", Double.NaN)));
        assertThrows(IllegalArgumentException.class, () -> GSON.toJson(Map.of("nan", Double.NaN)));
    }
}
