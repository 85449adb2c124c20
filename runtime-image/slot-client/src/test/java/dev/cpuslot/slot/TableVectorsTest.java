package dev.cpuslot.slot;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The slot table against the shared byte images in api/slot/v1/testdata/table.json: each
 * operation turns the image before into the image after, with the same result, and each refused
 * image is refused for the same field.
 */
class TableVectorsTest {
    static JsonObject vectors() throws Exception {
        String p = System.getProperty("cpuslot.table", "../../api/slot/v1/testdata/table.json");
        return JsonParser.parseString(Files.readString(Path.of(p))).getAsJsonObject();
    }

    static long u(JsonObject a, String k) { return a.get(k).getAsBigInteger().longValue(); }
    static int i(JsonObject a, String k) { return a.get(k).getAsInt(); }

    /** The image in 8-aligned native memory (the state words are accessed atomically). */
    static MemorySegment image(Arena arena, String hex) {
        byte[] b = HexFormat.of().parseHex(hex);
        MemorySegment m = arena.allocate(Math.max(1, b.length), 64);
        MemorySegment.copy(b, 0, m, ValueLayout.JAVA_BYTE, 0, b.length);
        return m.asSlice(0, b.length);
    }

    record Done(String result, int index) {}

    static Done apply(SlotTable t, String op, JsonObject a) {
        long[] out = new long[1];
        switch (op) {
            case "claim" -> {
                int idx = i(a, "index");
                int r = t.claim(idx, (int) u(a, "tid"), u(a, "quota"), u(a, "now"), out);
                return new Done(SlotTable.CLAIM_NAMES[r], r == SlotTable.CLAIMED ? idx : -1);
            }
            case "release" -> {
                int idx = i(a, "index");
                t.release(idx, t.state(idx), u(a, "now")); // the claim whose state word the image holds
                return new Done("ok", -1);
            }
            case "control" -> {
                int idx = i(a, "index");
                int r = t.control(idx, out);
                return new Done(SlotTable.CLAIM_NAMES[r], r == SlotTable.CLAIMED ? idx : -1);
            }
            case "clear" -> {
                int idx = i(a, "index");
                t.clear(idx, t.state(idx), u(a, "now"));
                return new Done("ok", -1);
            }
            case "publish" -> {
                SlotTable.Claimed c = t.publish((int) u(a, "holder"), u(a, "slot"), u(a, "quota_m"), u(a, "period_us"),
                        (int) u(a, "flags"), u(a, "lease"), u(a, "asked_m"), u(a, "now"));
                return c == null ? new Done("full", -1) : new Done("ok", c.index());
            }
            case "find" -> {
                return new Done("ok", t.find(u(a, "quota"), i(a, "from"), t.capacity()));
            }
            case "mark_gone" -> {
                t.markGone(i(a, "index"));
                return new Done("ok", -1);
            }
            case "set_lease" -> {
                t.setLease(i(a, "index"), u(a, "lease"));
                return new Done("ok", -1);
            }
            case "set_granted" -> {
                t.setGranted(i(a, "index"), u(a, "quota_m"), u(a, "degraded") != 0);
                return new Done("ok", -1);
            }
            case "free_dead" -> {
                int idx = i(a, "index");
                return new Done(t.freeDead(idx, t.state(idx), u(a, "now")) ? "ok" : "unchanged", -1);
            }
            default -> throw new IllegalArgumentException("unknown table op " + op);
        }
    }

    @TestFactory
    List<DynamicTest> eachOperationTurnsTheImageBeforeIntoTheImageAfter() throws Exception {
        assertTrue(Native.available(), "FFM: " + Native.loadError());
        List<DynamicTest> tests = new ArrayList<>();
        var valid = vectors().getAsJsonArray("valid");
        assertTrue(valid.size() >= 10, "expected the shared table vectors, got " + valid.size());
        for (JsonElement e : valid) {
            JsonObject v = e.getAsJsonObject();
            String name = v.get("name").getAsString(), op = v.get("op").getAsString();
            tests.add(DynamicTest.dynamicTest(name, () -> {
                JsonObject a = v.getAsJsonObject("args");
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment m;
                    Done d;
                    if (op.equals("format")) {
                        m = arena.allocate(SlotTable.size(i(a, "capacity")), 64);
                        SlotTable.format(m, i(a, "capacity"));
                        d = new Done("ok", -1);
                    } else {
                        m = image(arena, v.get("before").getAsString());
                        d = apply(SlotTable.over(m), op, a);
                    }
                    assertEquals(v.get("result").getAsString(), d.result(), name + ": result");
                    assertEquals(v.get("index").getAsInt(), d.index(), name + ": index");
                    assertEquals(v.get("after").getAsString(), HexFormat.of().formatHex(m.toArray(ValueLayout.JAVA_BYTE)),
                            name + ": the table after");
                }
            }));
        }
        return tests;
    }

    @TestFactory
    List<DynamicTest> aReaderRefusesEachBadImageForTheRightField() throws Exception {
        List<DynamicTest> tests = new ArrayList<>();
        var invalid = vectors().getAsJsonArray("invalid");
        assertFalse(invalid.isEmpty());
        for (JsonElement e : invalid) {
            JsonObject v = e.getAsJsonObject();
            tests.add(DynamicTest.dynamicTest(v.get("name").getAsString(), () -> {
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment m = image(arena, v.get("hex").getAsString());
                    SlotTable.BadTable bad = assertThrows(SlotTable.BadTable.class, () -> SlotTable.over(m));
                    assertEquals(v.get("error").getAsString(), bad.field, bad.getMessage());
                    assertEquals(v.get("layout").getAsBoolean(), bad.otherLayout, "another layout version: " + bad.getMessage());
                }
            }));
        }
        return tests;
    }
}
