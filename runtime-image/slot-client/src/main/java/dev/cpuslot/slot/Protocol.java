package dev.cpuslot.slot;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Codec for slot protocol v1 ({@code api/slot/v1/SPEC.md}). Pure functions on byte arrays:
 * no I/O, no allocation beyond the frame. Every integer is unsigned big-endian; u32 values are
 * carried in {@code long}, u64 values in {@code long} holding the raw 64 bits.
 */
public final class Protocol {
    private Protocol() {}

    public static final int VERSION = 1;
    public static final int HEADER = 6;          // version, type, request
    public static final int MIN_LENGTH = 6;
    public static final int MAX_LENGTH = 65536;
    public static final int MAX_STRING = 1024;
    /** Most records in one USAGE. */
    public static final int MAX_USAGE_RECORDS = 8;
    /**
     * The longest body of any valid request (USAGE with eight records of 1024-byte actions): an
     * agent reads no longer request frame, so a client never sends one.
     */
    public static final int MAX_REQUEST_LENGTH = HEADER + 1 + MAX_USAGE_RECORDS * (2 + MAX_STRING + 1 + 4 + 8 + 8);
    /** The longest HELLO body: all an agent reads before HELLO. */
    public static final int MAX_HELLO_LENGTH = HEADER + 1 + 1 + 4 + 2 + MAX_STRING;

    // message types
    public static final int HELLO = 0x01, HELLO_OK = 0x81;
    public static final int ACQUIRE = 0x02, ACQUIRE_OK = 0x82;
    public static final int RELEASE = 0x03, RELEASE_OK = 0x83;
    public static final int RECLAIM = 0x04;
    public static final int USAGE = 0x05;
    public static final int HOLD_LIST = 0x06, HOLD_LIST_OK = 0x86;
    public static final int ERROR = 0x7F;

    // HELLO flags
    public static final long HELLO_FD_PASSING = 1, HELLO_LOCAL = 2;
    // HELLO_OK flags
    public static final long HELLO_OK_FAVORDYNMODS = 1, HELLO_OK_AGENT_PLACES = 2, HELLO_OK_LOCAL = 4, HELLO_OK_HOLD_LIST = 8,
            HELLO_OK_LEND = 16;
    // ACQUIRE flags
    public static final int ACQUIRE_AGENT_PLACES = 1, ACQUIRE_HOLD = 2;
    // ACQUIRE_OK outcome / flags / place
    public static final int OUTCOME_AFFINITY_HIT = 1, OUTCOME_CACHE_HIT = 2, OUTCOME_RETUNED = 3, OUTCOME_CREATED = 4;
    public static final int ACQ_FLAG_QUEUED = 1, ACQ_FLAG_DEGRADED = 2;
    public static final int PLACE_NONE = 0, PLACE_SELF = 1, PLACE_DONE = 2;
    // RELEASE outcome
    public static final int RELEASE_OK_OUTCOME = 0, RELEASE_FAILED = 1, RELEASE_TIMEOUT = 2, RELEASE_PLACEMENT_FAILED = 3;
    // RELEASE flags
    public static final int RELEASE_NO_REPLY = 1;
    /** SLEEP and WAKE do not release: the lease's invocation waits, or runs again (spec: "Lending"). */
    public static final int RELEASE_SLEEP = 2, RELEASE_WAKE = 4;
    // HOLD_LIST_OK lease flags
    public static final int HOLD_DEGRADED = 2;
    /** Most leases one HOLD_LIST_OK lists. */
    public static final int MAX_HOLD_LIST_LEASES = 1024;

    // error codes
    public static final int E_BAD_REQUEST = 1, E_UNSUPPORTED_VERSION = 2, E_NOT_SERVED = 3, E_INVALID_QUOTA = 4,
            E_REJECTED = 5, E_TIMEOUT = 6, E_UNKNOWN_LEASE = 7, E_SLOT_UNAVAILABLE = 8, E_INTERNAL = 9,
            E_SHUTTING_DOWN = 10, E_NOT_READY = 11;

    public static String errorName(int code) {
        return switch (code) {
            case E_BAD_REQUEST -> "BAD_REQUEST";
            case E_UNSUPPORTED_VERSION -> "UNSUPPORTED_VERSION";
            case E_NOT_SERVED -> "NOT_SERVED";
            case E_INVALID_QUOTA -> "INVALID_QUOTA";
            case E_REJECTED -> "REJECTED";
            case E_TIMEOUT -> "TIMEOUT";
            case E_UNKNOWN_LEASE -> "UNKNOWN_LEASE";
            case E_SLOT_UNAVAILABLE -> "SLOT_UNAVAILABLE";
            case E_INTERNAL -> "INTERNAL";
            case E_SHUTTING_DOWN -> "SHUTTING_DOWN";
            case E_NOT_READY -> "NOT_READY";
            default -> "ERROR_" + code;
        };
    }

    public static String typeName(int type) {
        return switch (type) {
            case HELLO -> "HELLO";
            case HELLO_OK -> "HELLO_OK";
            case ACQUIRE -> "ACQUIRE";
            case ACQUIRE_OK -> "ACQUIRE_OK";
            case RELEASE -> "RELEASE";
            case RELEASE_OK -> "RELEASE_OK";
            case RECLAIM -> "RECLAIM";
            case USAGE -> "USAGE";
            case HOLD_LIST -> "HOLD_LIST";
            case HOLD_LIST_OK -> "HOLD_LIST_OK";
            case ERROR -> "ERROR";
            default -> "TYPE_0x" + Integer.toHexString(type);
        };
    }

    // ---- messages -------------------------------------------------------------------------

    /** Marker for all message bodies. */
    public sealed interface Message permits Hello, HelloOk, Acquire, AcquireOk, Release, ReleaseOk, Reclaim, UsageReport, HoldList, HoldListOk, Error {
        int type();
    }

    public record Hello(int minVersion, int maxVersion, long flags, String client) implements Message {
        public int type() { return HELLO; }
    }

    public record Pool(long quotaMilli, long periodUs, int slots, int free) {}

    /**
     * placeFds / statFds: a slot's fds are placeFds placement fds followed by statFds read-only
     * counter fds (v2: cpu.stat; v1: cpu.stat then cpuacct.usage).
     */
    public record HelloOk(int version, int hierarchy, long flags, int placeFds, int statFds, String container,
                          long budgetMilli, List<Pool> pools) implements Message {
        public HelloOk { pools = pools == null ? List.of() : List.copyOf(pools); }
        public int type() { return HELLO_OK; }
    }

    public record Acquire(long quotaMilli, long waitUs, long tid, int flags, long currentSlot, String action,
                          String invocation) implements Message {
        public int type() { return ACQUIRE; }
    }

    public record AcquireOk(long lease, long slot, long quotaMilli, long periodUs, int outcome, int flags, int place,
                            int nfds) implements Message {
        public int type() { return ACQUIRE_OK; }
    }

    /** flags bit 0 NO_REPLY: the agent sends nothing back, not even an error. */
    public record Release(long lease, int outcome, int flags) implements Message {
        public Release(long lease, int outcome) { this(lease, outcome, 0); }
        public int type() { return RELEASE; }
    }

    public record ReleaseOk(long cpuNanos, long throttledNanos, long periods, long throttledPeriods) implements Message {
        public int type() { return RELEASE_OK; }
    }

    public record Reclaim(long slot, long quotaMilli, long tid, String action, String invocation) implements Message {
        public int type() { return RECLAIM; }
    }

    /**
     * One USAGE record: what {@code invocations} invocations of an action with one outcome (OK,
     * FAILED or TIMEOUT) used under HOLD leases.
     */
    public record UsageRecord(String action, int outcome, long invocations, long cpuNanos, long throttledNanos) {}

    /** USAGE, one-way: 1 to 8 records. */
    public record UsageReport(List<UsageRecord> records) implements Message {
        public UsageReport { records = List.copyOf(records); }
        public int type() { return USAGE; }
    }

    /** HOLD_LIST: which HOLD leases the process holds and how much to give back. No payload. */
    public record HoldList() implements Message {
        public int type() { return HOLD_LIST; }
    }

    /** One HOLD lease in HOLD_LIST_OK, with what it is granted now (flags: HOLD_DEGRADED). */
    public record HoldLease(long lease, long slot, long quotaMilli, int flags) {}

    /**
     * HOLD_LIST_OK: the container's budget now, how many millicores of its HOLD leases the process
     * should give back, and its HOLD leases (at most 1024).
     */
    public record HoldListOk(long budgetMilli, long giveBackMilli, List<HoldLease> leases) implements Message {
        public HoldListOk { leases = leases == null ? List.of() : List.copyOf(leases); }
        public int type() { return HOLD_LIST_OK; }
    }

    public record Error(int code, long retryAfterMs, String message) implements Message {
        public int type() { return ERROR; }
    }

    /** A decoded frame. */
    public record Frame(int version, int type, long request, Message message) {}

    /** A frame a decoder must refuse, with the error code the spec says to answer. */
    public static final class ProtocolException extends Exception {
        private final int code;
        public ProtocolException(int code, String msg) { super(errorName(code) + ": " + msg); this.code = code; }
        public int code() { return code; }
    }

    // ---- encoding ---------------------------------------------------------------------------

    /** Encodes a whole frame, length prefix included. */
    public static byte[] encode(long request, Message m) {
        Out o = new Out();
        o.u32(0); // length, patched below
        o.u8(VERSION);
        o.u8(m.type());
        o.u32(request);
        switch (m) {
            case Hello h -> { o.u8(h.minVersion()); o.u8(h.maxVersion()); o.u32(h.flags()); o.str(h.client()); }
            case HelloOk h -> {
                o.u8(h.version()); o.u8(h.hierarchy()); o.u32(h.flags()); o.u8(h.placeFds()); o.u8(h.statFds());
                o.str(h.container()); o.u32(h.budgetMilli());
                o.u16(h.pools().size());
                for (Pool p : h.pools()) { o.u32(p.quotaMilli()); o.u32(p.periodUs()); o.u16(p.slots()); o.u16(p.free()); }
            }
            case Acquire a -> {
                o.u32(a.quotaMilli()); o.u32(a.waitUs()); o.u32(a.tid()); o.u8(a.flags()); o.u32(a.currentSlot());
                o.str(a.action()); o.str(a.invocation());
            }
            case AcquireOk a -> {
                o.u64(a.lease()); o.u32(a.slot()); o.u32(a.quotaMilli()); o.u32(a.periodUs());
                o.u8(a.outcome()); o.u8(a.flags()); o.u8(a.place()); o.u8(a.nfds());
            }
            case Release r -> { o.u64(r.lease()); o.u8(r.outcome()); o.u8(r.flags()); }
            case ReleaseOk r -> { o.u64(r.cpuNanos()); o.u64(r.throttledNanos()); o.u64(r.periods()); o.u64(r.throttledPeriods()); }
            case Reclaim r -> { o.u32(r.slot()); o.u32(r.quotaMilli()); o.u32(r.tid()); o.str(r.action()); o.str(r.invocation()); }
            case UsageReport u -> {
                int n = u.records().size();
                if (n < 1 || n > MAX_USAGE_RECORDS) throw new IllegalArgumentException("USAGE with " + n + " records, want 1..8");
                o.u8(n);
                for (UsageRecord r : u.records()) {
                    if (r.outcome() < RELEASE_OK_OUTCOME || r.outcome() > RELEASE_TIMEOUT)
                        throw new IllegalArgumentException("USAGE outcome " + r.outcome() + ", want OK, FAILED or TIMEOUT");
                    if (r.invocations() < 1) throw new IllegalArgumentException("USAGE record of " + r.invocations() + " invocations");
                    o.str(r.action()); o.u8(r.outcome()); o.u32(r.invocations()); o.u64(r.cpuNanos()); o.u64(r.throttledNanos());
                }
            }
            case HoldList h -> { }
            case HoldListOk h -> {
                if (h.leases().size() > MAX_HOLD_LIST_LEASES)
                    throw new IllegalArgumentException("HOLD_LIST_OK with " + h.leases().size() + " leases, at most 1024");
                o.u32(h.budgetMilli()); o.u32(h.giveBackMilli()); o.u16(h.leases().size());
                for (HoldLease l : h.leases()) { o.u64(l.lease()); o.u32(l.slot()); o.u32(l.quotaMilli()); o.u8(l.flags()); }
            }
            case Error e -> { o.u16(e.code()); o.u32(e.retryAfterMs()); o.str(e.message()); }
        }
        byte[] b = o.toByteArray();
        int len = b.length - 4;
        if (len > MAX_LENGTH) throw new IllegalArgumentException("frame too long: " + len);
        if (m.type() < 0x80 && m.type() != ERROR && len > MAX_REQUEST_LENGTH)
            throw new IllegalArgumentException("request of " + len + " bytes > " + MAX_REQUEST_LENGTH);
        ByteBuffer.wrap(b).putInt(0, len);
        return b;
    }

    // ---- decoding ---------------------------------------------------------------------------

    /**
     * Checks a frame's length prefix (the first 4 bytes). Returns the body length.
     */
    public static int checkLength(long length) throws ProtocolException {
        if (length < MIN_LENGTH) throw new ProtocolException(E_BAD_REQUEST, "frame length " + length + " < 6");
        if (length > MAX_LENGTH) throw new ProtocolException(E_BAD_REQUEST, "frame length " + length + " > 65536");
        return (int) length;
    }

    /** Decodes a whole frame (length prefix included); the length must match the bytes given. */
    public static Frame decodeFrame(byte[] frame) throws ProtocolException {
        if (frame.length < 4) throw new ProtocolException(E_BAD_REQUEST, "short frame");
        long len = ByteBuffer.wrap(frame).getInt(0) & 0xFFFFFFFFL;
        checkLength(len);
        if (len != frame.length - 4) throw new ProtocolException(E_BAD_REQUEST, "length " + len + " but " + (frame.length - 4) + " bytes");
        byte[] body = new byte[frame.length - 4];
        System.arraycopy(frame, 4, body, 0, body.length);
        return decodeBody(body);
    }

    /** Decodes a frame body (after the length prefix). */
    public static Frame decodeBody(byte[] body) throws ProtocolException {
        In in = new In(body);
        if (body.length < HEADER) throw new ProtocolException(E_BAD_REQUEST, "body shorter than header");
        int version = in.u8();
        int type = in.u8();
        long request = in.u32();
        if (version != VERSION) throw new ProtocolException(E_UNSUPPORTED_VERSION, "version " + version);
        Message m = switch (type) {
            case HELLO -> new Hello(in.u8(), in.u8(), in.u32(), in.str());
            case HELLO_OK -> {
                int v = in.u8(), h = in.u8();
                long fl = in.u32();
                int placeFds = in.u8(), statFds = in.u8();
                String c = in.str();
                long budget = in.u32();
                int n = in.u16();
                List<Pool> pools = new ArrayList<>(n);
                for (int i = 0; i < n; i++) pools.add(new Pool(in.u32(), in.u32(), in.u16(), in.u16()));
                yield new HelloOk(v, h, fl, placeFds, statFds, c, budget, pools);
            }
            case ACQUIRE -> new Acquire(in.u32(), in.u32(), in.u32(), in.u8(), in.u32(), in.str(), in.str());
            case ACQUIRE_OK -> new AcquireOk(in.u64(), in.u32(), in.u32(), in.u32(), in.u8(), in.u8(), in.u8(), in.u8());
            case RELEASE -> new Release(in.u64(), in.u8(), in.u8());
            case RELEASE_OK -> new ReleaseOk(in.u64(), in.u64(), in.u64(), in.u64());
            case RECLAIM -> new Reclaim(in.u32(), in.u32(), in.u32(), in.str(), in.str());
            case USAGE -> {
                int n = in.u8();
                if (n < 1 || n > MAX_USAGE_RECORDS) throw new ProtocolException(E_BAD_REQUEST, "USAGE with " + n + " records");
                List<UsageRecord> rs = new ArrayList<>(n);
                for (int i = 0; i < n; i++) {
                    UsageRecord r = new UsageRecord(in.str(), in.u8(), in.u32(), in.u64(), in.u64());
                    if (r.outcome() > RELEASE_TIMEOUT) throw new ProtocolException(E_BAD_REQUEST, "USAGE outcome " + r.outcome());
                    if (r.invocations() < 1) throw new ProtocolException(E_BAD_REQUEST, "USAGE record of 0 invocations");
                    rs.add(r);
                }
                yield new UsageReport(rs);
            }
            case HOLD_LIST -> new HoldList();
            case HOLD_LIST_OK -> {
                long budget = in.u32(), giveBack = in.u32();
                int n = in.u16();
                if (n > MAX_HOLD_LIST_LEASES) throw new ProtocolException(E_BAD_REQUEST, "HOLD_LIST_OK with " + n + " leases");
                if ((long) n * 17 > in.remaining()) throw new ProtocolException(E_BAD_REQUEST, "HOLD_LIST_OK lease count past the payload");
                List<HoldLease> ls = new ArrayList<>(n);
                for (int i = 0; i < n; i++) ls.add(new HoldLease(in.u64(), in.u32(), in.u32(), in.u8()));
                yield new HoldListOk(budget, giveBack, ls);
            }
            case ERROR -> new Error(in.u16(), in.u32(), in.str());
            default -> throw new ProtocolException(E_BAD_REQUEST, "unknown type 0x" + Integer.toHexString(type));
        };
        if (in.remaining() != 0) throw new ProtocolException(E_BAD_REQUEST, in.remaining() + " trailing bytes in " + typeName(type));
        return new Frame(version, type, request, m);
    }

    // ---- helpers ----------------------------------------------------------------------------

    /**
     * The spec's rule for strings, on the sending side: a string with a control character
     * (U+0000..U+001F, U+007F..U+009F) or an unpaired surrogate (not valid UTF-8) is refused.
     */
    static void checkString(String s) {
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isISOControl(c)) throw new IllegalArgumentException("string holds a control character");
            if (Character.isSurrogate(c)) {
                if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                    i++;
                    continue;
                }
                throw new IllegalArgumentException("string holds an unpaired surrogate (not valid UTF-8)");
            }
        }
    }

    /** True when a sender may send s as a protocol string (valid, at most 1024 UTF-8 bytes). */
    public static boolean validString(String s) {
        try {
            checkString(s);
        } catch (IllegalArgumentException e) {
            return false;
        }
        return s.getBytes(StandardCharsets.UTF_8).length <= MAX_STRING;
    }

    private static final class Out extends ByteArrayOutputStream {
        Out() { super(64); }
        void u8(int v) { write(v & 0xFF); }
        void u16(int v) { u8(v >>> 8); u8(v); }
        void u32(long v) {
            if (v < 0 || v > 0xFFFFFFFFL) throw new IllegalArgumentException("u32 out of range: " + v);
            u8((int) (v >>> 24)); u8((int) (v >>> 16)); u8((int) (v >>> 8)); u8((int) v);
        }
        void u64(long v) { for (int s = 56; s >= 0; s -= 8) u8((int) (v >>> s)); }
        void str(String s) {
            String v = s == null ? "" : s;
            checkString(v);
            byte[] b = v.getBytes(StandardCharsets.UTF_8);
            if (b.length > MAX_STRING) throw new IllegalArgumentException("string longer than 1024 bytes");
            u16(b.length);
            write(b, 0, b.length);
        }
    }

    private static final class In {
        private final byte[] b;
        private int p;
        In(byte[] b) { this.b = b; }
        int remaining() { return b.length - p; }
        private void need(int n) throws ProtocolException {
            if (remaining() < n) throw new ProtocolException(E_BAD_REQUEST, "payload too short");
        }
        int u8() throws ProtocolException { need(1); return b[p++] & 0xFF; }
        int u16() throws ProtocolException { need(2); int v = ((b[p] & 0xFF) << 8) | (b[p + 1] & 0xFF); p += 2; return v; }
        long u32() throws ProtocolException {
            need(4);
            long v = ((long) (b[p] & 0xFF) << 24) | ((b[p + 1] & 0xFF) << 16) | ((b[p + 2] & 0xFF) << 8) | (b[p + 3] & 0xFF);
            p += 4;
            return v;
        }
        long u64() throws ProtocolException {
            need(8);
            long v = 0;
            for (int i = 0; i < 8; i++) v = (v << 8) | (b[p + i] & 0xFF);
            p += 8;
            return v;
        }
        String str() throws ProtocolException {
            int n = u16();
            if (n > MAX_STRING) throw new ProtocolException(E_BAD_REQUEST, "string of " + n + " bytes > 1024");
            need(n);
            // The spec: strings are valid UTF-8 without control characters; anything else is BAD_REQUEST.
            String s;
            try {
                s = StandardCharsets.UTF_8.newDecoder()
                        .onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT)
                        .decode(ByteBuffer.wrap(b, p, n)).toString();
            } catch (CharacterCodingException e) {
                throw new ProtocolException(E_BAD_REQUEST, "string is not valid UTF-8");
            }
            for (int i = 0; i < s.length(); i++) {
                if (Character.isISOControl(s.charAt(i))) {
                    throw new ProtocolException(E_BAD_REQUEST, "string holds a control character");
                }
            }
            p += n;
            return s;
        }
    }
}
