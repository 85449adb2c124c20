package dev.cpuslot.slot;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.TimeoutException;

import static org.junit.jupiter.api.Assertions.*;

/** The transport's framing against the shared vectors, fed the way a socket may deliver them. */
class FrameReaderTest {
    /** A byte stream that hands out at most {@code chunk} bytes per read and times out every other read. */
    static final class Stream implements FrameReader.Source {
        final byte[] b;
        final int chunk;
        final boolean stall;
        int pos, reads;
        Stream(byte[] b, int chunk, boolean stall) { this.b = b; this.chunk = chunk; this.stall = stall; }
        @Override
        public int recv(byte[] buf, int off, int len, long deadline) throws IOException, TimeoutException {
            if (stall && reads++ % 2 == 0) throw new TimeoutException();
            if (pos == b.length) throw new IOException("agent closed the connection");
            int n = Math.min(Math.min(len, chunk), b.length - pos);
            System.arraycopy(b, pos, buf, off, n);
            pos += n;
            return n;
        }
    }

    /** Reads one frame, resuming after each timeout with the same reader (what a drainer does). */
    static Protocol.Frame readResuming(FrameReader r, Stream in) throws Exception {
        while (true) {
            try {
                return r.read(in, Long.MAX_VALUE);
            } catch (TimeoutException e) {
                // the partial frame stays in the reader
            }
        }
    }

    @TestFactory
    List<DynamicTest> validVectorsDecodeByteByByteAndAcrossTimeouts() throws Exception {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonElement e : VectorsTest.vectors().getAsJsonArray("valid")) {
            JsonObject v = e.getAsJsonObject();
            tests.add(DynamicTest.dynamicTest(v.get("name").getAsString(), () -> {
                byte[] bytes = HexFormat.of().parseHex(v.get("hex").getAsString());
                Protocol.Message want = VectorsTest.fromFields(v.get("type").getAsString(), v.getAsJsonObject("fields"));
                for (int chunk : new int[]{1, 3, bytes.length}) {
                    FrameReader r = new FrameReader();
                    Protocol.Frame f = readResuming(r, new Stream(bytes, chunk, true));
                    assertEquals(v.get("request").getAsLong(), f.request());
                    assertEquals(want, f.message(), "chunks of " + chunk);
                    assertFalse(r.midFrame());
                }
            }));
        }
        return tests;
    }

    @TestFactory
    List<DynamicTest> invalidVectorsAreRefusedWithTheRightCode() throws Exception {
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonElement e : VectorsTest.vectors().getAsJsonArray("invalid")) {
            JsonObject v = e.getAsJsonObject();
            tests.add(DynamicTest.dynamicTest(v.get("name").getAsString(), () -> {
                byte[] bytes = HexFormat.of().parseHex(v.get("hex").getAsString());
                Protocol.ProtocolException ex = assertThrows(Protocol.ProtocolException.class,
                        () -> new FrameReader().read(new Stream(bytes, 1, false), Long.MAX_VALUE));
                assertEquals(v.get("error").getAsString(), Protocol.errorName(ex.code()), ex.getMessage());
            }));
        }
        return tests;
    }

    @Test
    void framesBackToBackAreReadOneAtATime() throws Exception {
        var valid = VectorsTest.vectors().getAsJsonArray("valid");
        byte[] a = HexFormat.of().parseHex(valid.get(0).getAsJsonObject().get("hex").getAsString());
        byte[] b = HexFormat.of().parseHex(valid.get(1).getAsJsonObject().get("hex").getAsString());
        byte[] both = new byte[a.length + b.length];
        System.arraycopy(a, 0, both, 0, a.length);
        System.arraycopy(b, 0, both, a.length, b.length);
        Stream in = new Stream(both, both.length, false);
        FrameReader r = new FrameReader();
        assertEquals(Protocol.decodeFrame(a), r.read(in, Long.MAX_VALUE));
        assertEquals(Protocol.decodeFrame(b), r.read(in, Long.MAX_VALUE));
        assertThrows(IOException.class, () -> r.read(in, Long.MAX_VALUE), "end of stream");
    }

    @Test
    void aTimeoutMidFrameLeavesTheReaderMidFrame() throws Exception {
        byte[] a = HexFormat.of().parseHex(VectorsTest.vectors().getAsJsonArray("valid").get(0).getAsJsonObject().get("hex").getAsString());
        Stream in = new Stream(a, 2, true);
        FrameReader r = new FrameReader();
        assertThrows(TimeoutException.class, () -> r.read(in, Long.MAX_VALUE));
        assertFalse(r.midFrame(), "nothing read yet");
        assertThrows(TimeoutException.class, () -> r.read(in, Long.MAX_VALUE));
        assertTrue(r.midFrame(), "two bytes of the header read");
        assertEquals(Protocol.decodeFrame(a), readResuming(r, in));
    }
}
