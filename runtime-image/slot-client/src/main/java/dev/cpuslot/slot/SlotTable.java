package dev.cpuslot.slot;

import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;

/**
 * The client's slot table (spec: "Slot table layout, version 1"): the HOLD leases a process
 * holds, in shared memory, each claimed by one thread at a time with a compare-and-swap on the
 * entry's 8-byte {@code state} word and given back with one store. Little-endian; {@code state}
 * is accessed only atomically. The table never talks to the agent: {@link #drop} hands the lease
 * to a callback that releases it.
 */
final class SlotTable {
    static final int HEADER = 64, ENTRY = 64, LAYOUT = 1, MAX_CAPACITY = 1024;
    static final byte[] MAGIC = "cpuslotT".getBytes(StandardCharsets.US_ASCII);
    /** Holder of an entry the process is publishing, re-declaring or dropping. */
    static final int CONTROL = 0xFFFFFFFF;
    static final int FLAG_DEGRADED = 1, FLAG_GONE = 2;

    // entry field offsets
    static final int STATE = 0, SLOT = 8, QUOTA = 12, PERIOD = 16, FLAGS = 20, LEASE = 24, ASKED = 32, IDLE_SINCE = 40;

    private static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN);
    /** Atomic access to an aligned state word: (segment, offset). */
    private static final VarHandle STATE_WORD = U64.varHandle();

    private final MemorySegment seg;
    private final int capacity;
    private final int fd;
    /** One past the highest entry this process published (entries fill from the lowest). */
    private final java.util.concurrent.atomic.AtomicInteger high = new java.util.concurrent.atomic.AtomicInteger();

    private SlotTable(MemorySegment seg, int capacity, int fd) {
        this.seg = seg;
        this.capacity = capacity;
        this.fd = fd;
    }

    static long size(int capacity) { return HEADER + (long) ENTRY * capacity; }

    /** A new table in a sealed memfd mapped MAP_SHARED (the spec's way). */
    static SlotTable create(int capacity) throws Native.NativeException {
        checkCapacity(capacity);
        long size = size(capacity);
        int fd = Native.sealedMemfd("cpuslot-table", size);
        MemorySegment m;
        try {
            m = Native.mapShared(fd, size);
        } catch (Native.NativeException e) {
            Native.close(fd);
            throw e;
        }
        format(m, capacity);
        return new SlotTable(m, capacity, fd);
    }

    /** A table a reader refuses: which field is wrong, and whether it is another layout version. */
    static final class BadTable extends IllegalArgumentException {
        final String field;
        final boolean otherLayout;
        BadTable(String field, long got, long want, boolean otherLayout) {
            super((otherLayout ? "slot table of another layout version: " : "not a usable slot table: ") + field + " is " + got
                    + ", want " + want);
            this.field = field;
            this.otherLayout = otherLayout;
        }
    }

    /**
     * A table over memory that already holds one, validated before it is trusted: a size of
     * whole entries (1..1024), 8-aligned memory, magic, layout, entry size, and a capacity that
     * matches the size. Throws {@link BadTable}.
     */
    static SlotTable over(MemorySegment m) {
        long n = m.byteSize();
        if (n < size(1) || n > size(MAX_CAPACITY) || n % ENTRY != 0) throw new BadTable("size", n, size(1), false);
        if ((m.address() & 7) != 0) throw new BadTable("alignment", m.address() & 7, 0, false);
        for (int i = 0; i < MAGIC.length; i++)
            if (m.get(ValueLayout.JAVA_BYTE, i) != MAGIC[i]) throw new BadTable("magic", m.get(U64, 0), 0, false);
        long layout = m.get(U32, 8) & 0xFFFFFFFFL, entrySize = m.get(U32, 12) & 0xFFFFFFFFL, cap = m.get(U32, 16) & 0xFFFFFFFFL;
        if (layout != LAYOUT) throw new BadTable("layout", layout, LAYOUT, true);
        if (entrySize != ENTRY) throw new BadTable("entry_size", entrySize, ENTRY, false);
        if (cap != (n - HEADER) / ENTRY) throw new BadTable("capacity", cap, (n - HEADER) / ENTRY, false);
        SlotTable t = new SlotTable(m, (int) cap, -1);
        for (int i = (int) cap - 1; i >= 0; i--) {
            if (t.slot(i) != 0) {
                t.high.set(i + 1);
                break;
            }
        }
        return t;
    }

    /** Writes an empty table's header into m (zeroed memory of exactly {@link #size} bytes). */
    static void format(MemorySegment m, int capacity) {
        checkCapacity(capacity);
        if (m.byteSize() != size(capacity)) throw new IllegalArgumentException("want " + size(capacity) + " bytes");
        MemorySegment.copy(MAGIC, 0, m, ValueLayout.JAVA_BYTE, 0, MAGIC.length);
        m.set(U32, 8, LAYOUT);
        m.set(U32, 12, ENTRY);
        m.set(U32, 16, capacity);
    }

    private static void checkCapacity(int capacity) {
        if (capacity < 1 || capacity > MAX_CAPACITY) throw new IllegalArgumentException("capacity " + capacity + " not in 1..1024");
    }

    int capacity() { return capacity; }
    /** Entries [0, used()) may be in use. */
    int used() { return high.get(); }
    /** The memfd (children may share it), or -1 for a table over other memory. */
    int fd() { return fd; }
    MemorySegment memory() { return seg; }

    // ---- fields -----------------------------------------------------------------------------

    private static long at(int i, int field) { return HEADER + (long) ENTRY * i + field; }

    static int hold(long s) { return (int) s; }
    static int gen(long s) { return (int) (s >>> 32); }
    private static long state(int gen, int holder) { return ((long) gen << 32) | (holder & 0xFFFFFFFFL); }

    long state(int i) { return (long) STATE_WORD.getVolatile(seg, at(i, STATE)); }
    long slot(int i) { return seg.get(U32, at(i, SLOT)) & 0xFFFFFFFFL; }
    long quota(int i) { return seg.get(U32, at(i, QUOTA)) & 0xFFFFFFFFL; }
    long period(int i) { return seg.get(U32, at(i, PERIOD)) & 0xFFFFFFFFL; }
    int flags(int i) { return seg.get(U32, at(i, FLAGS)); }
    long lease(int i) { return seg.get(U64, at(i, LEASE)); }
    long asked(int i) { return seg.get(U32, at(i, ASKED)) & 0xFFFFFFFFL; }
    long idleSince(int i) { return seg.get(U64, at(i, IDLE_SINCE)); }
    boolean gone(int i) { return (flags(i) & FLAG_GONE) != 0; }

    /** Sets the lease id (re-declared after a RECLAIM gave it a new one). */
    void setLease(int i, long lease) { seg.set(U64, at(i, LEASE), lease); }

    private static final VarHandle FLAGS_WORD = U32.varHandle();

    /** Sets the GONE flag (atomically): claims fail from now on, and the entry is dropped once free. */
    void markGone(int i) { FLAGS_WORD.getAndBitwiseOr(seg, at(i, FLAGS), FLAG_GONE); }

    /**
     * Frees entry i, read as state {@code s}, whose holder thread no longer exists (the caller
     * checked): idle_since, then compare-and-swap of the state to the next generation with no
     * holder, so a claim made since (a new generation) is left alone. False when s names no
     * thread's claim or the state changed.
     */
    boolean freeDead(int i, long s, long now) {
        int h = hold(s);
        if (h == 0 || h == CONTROL || i < 0 || i >= capacity || state(i) != s) return false;
        seg.set(U64, at(i, IDLE_SINCE), now);
        return STATE_WORD.compareAndSet(seg, at(i, STATE), s, state(gen(s) + 1, 0));
    }

    /**
     * Writes what the agent grants entry i's lease now (HELD_OK): its quota, and DEGRADED set or
     * cleared (a degraded lease raised later).
     */
    void setGranted(int i, long quotaMilli, boolean degraded) {
        seg.set(U32, at(i, QUOTA), (int) quotaMilli);
        if (degraded) FLAGS_WORD.getAndBitwiseOr(seg, at(i, FLAGS), FLAG_DEGRADED);
        else FLAGS_WORD.getAndBitwiseAnd(seg, at(i, FLAGS), ~FLAG_DEGRADED);
    }

    // ---- operations (spec: "Operations") ------------------------------------------------------

    // how a claim ended (the names of testdata/table.json)
    static final int CLAIMED = 0, HELD = 1, LOST = 2, EMPTY = 3, GONE = 4, OTHER_QUOTA = 5, BAD_INDEX = 6;
    static final String[] CLAIM_NAMES = {"claimed", "held", "lost", "empty", "gone", "other_quota", "bad_index"};

    /**
     * Takes free entry i for {@code holder} (a TID, or {@link #CONTROL}): compare-and-swap to the
     * next generation. Returns how it ended; the state written goes to {@code out[0]}.
     */
    private int take(int i, int holder, long[] out) {
        if (i < 0 || i >= capacity || holder == 0) return BAD_INDEX;
        long s = state(i);
        if (hold(s) != 0) return HELD;
        long n = state(gen(s) + 1, holder);
        if (!STATE_WORD.compareAndSet(seg, at(i, STATE), s, n)) return LOST;
        out[0] = n;
        return CLAIMED;
    }

    /**
     * claim(i, tid) for quota {@code asked}: how it ended, the state written in {@code out[0]}.
     * A claim that wins the compare-and-swap on an entry that is empty, GONE or of another quota
     * gives it back at once (release, stamping {@code now}).
     */
    int claim(int i, int tid, long asked, long now, long[] out) {
        if (tid == CONTROL) return BAD_INDEX;
        int r = take(i, tid, out);
        if (r != CLAIMED) return r;
        if (slot(i) == 0) r = EMPTY;
        else if (gone(i)) r = GONE;
        else if (asked(i) != asked) r = OTHER_QUOTA;
        else return CLAIMED;
        release(i, out[0], now);
        return r;
    }

    /** claim for the invocation path: the state written, or 0 when the claim failed. */
    long claim(int i, int tid, long asked, long now) {
        long[] out = new long[1];
        return claim(i, tid, asked, now, out) == CLAIMED ? out[0] : 0;
    }

    /** control(i): takes entry i with holder CONTROL, whatever it holds (to re-declare or drop it). */
    int control(int i, long[] out) { return take(i, CONTROL, out); }

    /** release(i): idle_since, then state = gen << 32 (release ordering); s is what the claim wrote. */
    void release(int i, long s, long nowNs) {
        seg.set(U64, at(i, IDLE_SINCE), nowNs);
        STATE_WORD.setRelease(seg, at(i, STATE), state(gen(s), 0));
    }

    /** clear: zeroes every field of a CONTROL-held entry but its state, then releases it (empty). */
    void clear(int i, long s, long nowNs) {
        seg.asSlice(at(i, SLOT), ENTRY - SLOT).fill((byte) 0);
        release(i, s, nowNs);
    }

    /**
     * publish after a HOLD grant: claims the first empty entry with holder CONTROL, writes the
     * lease (idle_since = now), then hands it to {@code holder} (a TID, to use it at once) or
     * leaves it free (holder 0). Null when the table is full.
     */
    Claimed publish(int holder, long slot, long quota, long period, int flags, long lease, long asked, long now) {
        if (holder == CONTROL) throw new IllegalArgumentException("publish to CONTROL");
        long[] out = new long[1];
        for (int i = 0; i < capacity; i++) {
            if (slot(i) != 0 || hold(state(i)) != 0) continue;
            if (take(i, CONTROL, out) != CLAIMED) continue;
            if (slot(i) != 0) { // published by another thread between the look and the claim
                release(i, out[0], now);
                continue;
            }
            seg.set(U32, at(i, QUOTA), (int) quota);
            seg.set(U32, at(i, PERIOD), (int) period);
            seg.set(U32, at(i, FLAGS), flags);
            seg.set(U64, at(i, LEASE), lease);
            seg.set(U32, at(i, ASKED), (int) asked);
            seg.set(U64, at(i, IDLE_SINCE), now);
            seg.set(U32, at(i, SLOT), (int) slot);
            long n = state(gen(out[0]), holder);
            high.accumulateAndGet(i + 1, Math::max);
            STATE_WORD.setRelease(seg, at(i, STATE), n);
            return new Claimed(i, n);
        }
        return null;
    }

    /** An entry a thread holds: its index and the state its claim wrote. */
    record Claimed(int index, long state) {}

    /** What drop does with the entry's lease (RELEASE it, unless nobody backs it). */
    @FunctionalInterface
    interface Releaser {
        void release(long slot, long lease, int flags);
    }

    /**
     * drop(i): control, hand the lease to {@code releaser}, clear. False when the entry is held
     * (or another thread won).
     */
    boolean drop(int i, Releaser releaser, long now) {
        long[] out = new long[1];
        if (control(i, out) != CLAIMED) return false;
        long slot = slot(i);
        if (slot != 0) releaser.release(slot, lease(i), flags(i));
        clear(i, out[0], now);
        return true;
    }

    /**
     * find: the first entry at or after {@code from} (wrapping) among the first {@code limit}
     * that is free, holds a slot, is not GONE and was asked for {@code asked}; -1 if none. It
     * only looks: claim decides.
     */
    int find(long asked, int from, int limit) {
        int n = Math.min(limit, capacity);
        if (from < 0 || from >= n) from = 0;
        for (int k = 0; k < n; k++) {
            int i = from + k;
            if (i >= n) i -= n;
            if (asked(i) == asked && hold(state(i)) == 0 && slot(i) != 0 && !gone(i)) return i;
        }
        return -1;
    }

    /** find, then claim for tid, skipping {@code skip}; over the entries this process published. Null when none. */
    Claimed findAndClaim(long asked, int tid, int from, int skip, long now) {
        int n = used();
        if (from < 0 || from >= n) from = 0;
        for (int k = 0; k < n; k++) {
            int i = from + k;
            if (i >= n) i -= n;
            if (i < 0 || i == skip || slot(i) == 0 || asked(i) != asked || gone(i) || hold(state(i)) != 0) continue;
            long s = claim(i, tid, asked, now);
            if (s != 0) return new Claimed(i, s);
        }
        return null;
    }
}
