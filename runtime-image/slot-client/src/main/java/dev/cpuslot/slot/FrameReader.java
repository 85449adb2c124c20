package dev.cpuslot.slot;

import java.io.IOException;
import java.util.concurrent.TimeoutException;

/**
 * Reads length-prefixed frames (spec: "Framing") from a byte stream, resuming a frame that a
 * timed-out read began: the state survives a {@link TimeoutException}, so whoever reads next
 * (a drainer) finishes the same frame.
 */
final class FrameReader {
    /** Where the bytes come from: returns how many were read (&gt; 0), or throws. */
    @FunctionalInterface
    interface Source {
        int recv(byte[] buf, int off, int len, long deadline) throws IOException, TimeoutException;
    }

    private final byte[] hdr = new byte[4];
    private int hpos;
    private byte[] body;
    private int bpos;

    /** True when part of a frame has been read. */
    boolean midFrame() { return hpos > 0 || body != null; }

    Protocol.Frame read(Source in, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        while (hpos < 4) hpos += in.recv(hdr, hpos, 4 - hpos, deadline);
        if (body == null) {
            long len = ((hdr[0] & 0xFFL) << 24) | ((hdr[1] & 0xFF) << 16) | ((hdr[2] & 0xFF) << 8) | (hdr[3] & 0xFF);
            body = new byte[Protocol.checkLength(len)];
            bpos = 0;
        }
        while (bpos < body.length) bpos += in.recv(body, bpos, body.length - bpos, deadline);
        byte[] b = body;
        body = null;
        hpos = 0;
        return Protocol.decodeBody(b);
    }
}
