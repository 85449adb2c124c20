package dev.cpuslot.slot;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/** The codec against the shared byte-level vectors in api/slot/v1/testdata/vectors.json. */
class VectorsTest {
    static JsonObject vectors() throws Exception {
        String p = System.getProperty("cpuslot.vectors", "../../api/slot/v1/testdata/vectors.json");
        return JsonParser.parseString(Files.readString(Path.of(p))).getAsJsonObject();
    }

    static long u(JsonObject f, String k) { return f.get(k).getAsBigInteger().longValue(); }
    static int i(JsonObject f, String k) { return f.get(k).getAsInt(); }
    static String s(JsonObject f, String k) { return f.get(k).getAsString(); }

    static Protocol.Message fromFields(String type, JsonObject f) {
        return switch (type) {
            case "HELLO" -> new Protocol.Hello(i(f, "MinVersion"), i(f, "MaxVersion"), u(f, "Flags"), s(f, "Client"));
            case "HELLO_OK" -> {
                List<Protocol.Pool> pools = new ArrayList<>();
                JsonElement pe = f.get("Pools");
                if (pe != null && pe.isJsonArray()) {
                    for (JsonElement e : pe.getAsJsonArray()) {
                        JsonObject p = e.getAsJsonObject();
                        pools.add(new Protocol.Pool(u(p, "QuotaMilli"), u(p, "PeriodUS"), i(p, "Slots"), i(p, "Free")));
                    }
                }
                yield new Protocol.HelloOk(i(f, "Version"), i(f, "Hierarchy"), u(f, "Flags"), i(f, "PlaceFDs"),
                        i(f, "StatFDs"), s(f, "Container"),
                        u(f, "BudgetMilli"), pools);
            }
            case "ACQUIRE" -> new Protocol.Acquire(u(f, "QuotaMilli"), u(f, "WaitUS"), u(f, "TID"), i(f, "Flags"),
                    u(f, "CurrentSlot"), s(f, "Action"), s(f, "Invocation"));
            case "ACQUIRE_OK" -> new Protocol.AcquireOk(u(f, "Lease"), u(f, "Slot"), u(f, "QuotaMilli"), u(f, "PeriodUS"),
                    i(f, "Outcome"), i(f, "Flags"), i(f, "Place"), i(f, "NumFDs"));
            case "RELEASE" -> new Protocol.Release(u(f, "Lease"), i(f, "Outcome"), i(f, "Flags"));
            case "RELEASE_OK" -> new Protocol.ReleaseOk(u(f, "CPUNanos"), u(f, "ThrottledNanos"), u(f, "Periods"),
                    u(f, "ThrottledPeriods"));
            case "RECLAIM" -> new Protocol.Reclaim(u(f, "Slot"), u(f, "QuotaMilli"), u(f, "TID"), s(f, "Action"),
                    s(f, "Invocation"));
            case "USAGE" -> {
                List<Protocol.UsageRecord> rs = new ArrayList<>();
                for (JsonElement e : f.getAsJsonArray("Records")) {
                    JsonObject r = e.getAsJsonObject();
                    rs.add(new Protocol.UsageRecord(s(r, "Action"), i(r, "Outcome"), u(r, "Invocations"), u(r, "CPUNanos"),
                            u(r, "ThrottledNanos")));
                }
                yield new Protocol.UsageReport(rs);
            }
            case "HOLD_LIST" -> new Protocol.HoldList();
            case "HOLD_LIST_OK" -> {
                List<Protocol.HoldLease> ls = new ArrayList<>();
                JsonElement le = f.get("Leases");
                if (le != null && le.isJsonArray()) {
                    for (JsonElement e : le.getAsJsonArray()) {
                        JsonObject l = e.getAsJsonObject();
                        ls.add(new Protocol.HoldLease(u(l, "Lease"), u(l, "Slot"), u(l, "QuotaMilli"), i(l, "Flags")));
                    }
                }
                yield new Protocol.HoldListOk(u(f, "BudgetMilli"), u(f, "GiveBackMilli"), ls);
            }
            case "ERROR" -> new Protocol.Error(i(f, "Code"), u(f, "RetryAfterMS"), s(f, "Message"));
            default -> throw new IllegalArgumentException("unknown vector type " + type);
        };
    }

    @TestFactory
    List<DynamicTest> validVectorsEncodeAndDecode() throws Exception {
        List<DynamicTest> tests = new ArrayList<>();
        JsonArray valid = vectors().getAsJsonArray("valid");
        assertTrue(valid.size() >= 10, "expected the shared vectors, got " + valid.size());
        for (JsonElement e : valid) {
            JsonObject v = e.getAsJsonObject();
            String name = v.get("name").getAsString();
            tests.add(DynamicTest.dynamicTest(name, () -> {
                byte[] bytes = HexFormat.of().parseHex(v.get("hex").getAsString());
                Protocol.Message want = fromFields(v.get("type").getAsString(), v.getAsJsonObject("fields"));
                long req = v.get("request").getAsLong();
                assertEquals(v.get("hex").getAsString(), HexFormat.of().formatHex(Protocol.encode(req, want)), "encode " + name);
                Protocol.Frame f = Protocol.decodeFrame(bytes);
                assertEquals(1, f.version());
                assertEquals(req, f.request());
                assertEquals(want.type(), f.type());
                assertEquals(want, f.message(), "decode " + name);
            }));
        }
        return tests;
    }

    @TestFactory
    List<DynamicTest> invalidVectorsAreRefusedWithTheRightCode() throws Exception {
        List<DynamicTest> tests = new ArrayList<>();
        JsonArray invalid = vectors().getAsJsonArray("invalid");
        assertFalse(invalid.isEmpty());
        for (JsonElement e : invalid) {
            JsonObject v = e.getAsJsonObject();
            tests.add(DynamicTest.dynamicTest(v.get("name").getAsString(), () -> {
                byte[] bytes = HexFormat.of().parseHex(v.get("hex").getAsString());
                // A streaming reader sees the length prefix first; frames are cut to what the prefix
                // promises, exactly as the client's reader does.
                Protocol.ProtocolException ex = assertThrows(Protocol.ProtocolException.class, () -> decodeAsStream(bytes));
                assertEquals(v.get("error").getAsString(), Protocol.errorName(ex.code()), ex.getMessage());
            }));
        }
        return tests;
    }

    /** What SlotClient does with bytes from the socket: length check, then body decode. */
    static Protocol.Frame decodeAsStream(byte[] b) throws Protocol.ProtocolException {
        if (b.length < 4) throw new Protocol.ProtocolException(Protocol.E_BAD_REQUEST, "short");
        long len = ((b[0] & 0xFFL) << 24) | ((b[1] & 0xFF) << 16) | ((b[2] & 0xFF) << 8) | (b[3] & 0xFF);
        int n = Protocol.checkLength(len);
        if (b.length - 4 < n) {
            // a short body on a stream is a peer that stopped mid-frame; the decoder sees what came
            byte[] body = new byte[b.length - 4];
            System.arraycopy(b, 4, body, 0, body.length);
            return Protocol.decodeBody(body);
        }
        byte[] body = new byte[n];
        System.arraycopy(b, 4, body, 0, n);
        if (b.length - 4 > n) throw new Protocol.ProtocolException(Protocol.E_BAD_REQUEST, "bytes after frame");
        return Protocol.decodeBody(body);
    }

    @Test
    void specExampleHello() throws Exception {
        byte[] b = Protocol.encode(1, new Protocol.Hello(1, 1, Protocol.HELLO_FD_PASSING, "java"));
        assertEquals("000000120101000000010101000000010004" + "6a617661", HexFormat.of().formatHex(b));
    }

    @Test
    void stringsAreClippedToProtocolLimitOnCharacterBoundaries() {
        String longAction = "☃".repeat(400); // 1200 bytes
        String c = Leases.clip(longAction);
        assertTrue(c.getBytes(java.nio.charset.StandardCharsets.UTF_8).length <= 1024);
        assertEquals(341, c.length());
        assertThrows(IllegalArgumentException.class,
                () -> Protocol.encode(1, new Protocol.Acquire(1, 0, 1, 0, 0, longAction, "")));
    }

    @Test
    void theLongestRequestIsAFullUsageAndNothingLongerIsEncoded() throws Exception {
        assertEquals(8383, Protocol.MAX_REQUEST_LENGTH, "SPEC: USAGE with eight records of 1024-byte actions");
        assertEquals(1038, Protocol.MAX_HELLO_LENGTH);
        String act = "a".repeat(Protocol.MAX_STRING);
        List<Protocol.UsageRecord> eight = new ArrayList<>();
        for (int k = 0; k < 8; k++) eight.add(new Protocol.UsageRecord(act, 0, 1, 2, 3));
        byte[] b = Protocol.encode(1, new Protocol.UsageReport(eight));
        assertEquals(Protocol.MAX_REQUEST_LENGTH, b.length - 4);
        assertEquals(new Protocol.UsageReport(eight), Protocol.decodeFrame(b).message());
        byte[] h = Protocol.encode(1, new Protocol.Hello(1, 1, 3, act));
        assertEquals(Protocol.MAX_HELLO_LENGTH, h.length - 4);
    }

    @Test
    void usageRecordsOutsideTheSpecAreRefusedOnEncode() {
        var ok = new Protocol.UsageRecord("a", 0, 1, 0, 0);
        List<Protocol.UsageRecord> nine = new ArrayList<>();
        for (int k = 0; k < 9; k++) nine.add(ok);
        assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1, new Protocol.UsageReport(List.of())), "no record");
        assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1, new Protocol.UsageReport(nine)), "nine records");
        assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1,
                new Protocol.UsageReport(List.of(new Protocol.UsageRecord("a", 0, 0, 0, 0)))), "zero invocations");
        assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1,
                new Protocol.UsageReport(List.of(new Protocol.UsageRecord("a", Protocol.RELEASE_PLACEMENT_FAILED, 1, 0, 0)))),
                "PLACEMENT_FAILED is no USAGE outcome");
    }

    @Test
    void stringsWithControlCharactersOrUnpairedSurrogatesAreRefusedOnEncode() {
        for (String bad : new String[]{"a\nb", "nul\u0000", "c1\u0085", "del\u007f", "lone\ud800", "rev\udc00\ud800"}) {
            assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1,
                    new Protocol.UsageReport(List.of(new Protocol.UsageRecord(bad, 0, 1, 0, 0)))), "USAGE action " + bad);
            assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1,
                    new Protocol.Acquire(1, 0, 1, 0, 0, "a", bad)), "ACQUIRE invocation " + bad);
            assertThrows(IllegalArgumentException.class, () -> Protocol.encode(1, new Protocol.Hello(1, 1, 1, bad)), "HELLO " + bad);
            String clipped = Leases.clip(bad);
            assertTrue(Protocol.validString(clipped), "clip makes a sendable string of " + bad + ": " + clipped);
        }
        assertTrue(Protocol.validString("gäst/ƒib☃\ud83d\ude00"), "a surrogate pair is one valid character");
    }

    @Test
    void u32FieldsOutOfRangeAreRefusedOnEncode() {
        assertThrows(IllegalArgumentException.class,
                () -> Protocol.encode(1, new Protocol.Acquire(1L << 32, 0, 1, 0, 0, "a", "b")));
    }
}
