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

    /**
     * A table over memory that already holds one (validated: magic, layout, entry size, a
     * capacity that matches the size). The memory must be 8-aligned.
     */
    static SlotTable over(MemorySegment m) {
        if (m.byteSize() < HEADER) throw new IllegalArgumentException("table of " + m.byteSize() + " bytes: shorter than its header");
        if ((m.address() & 7) != 0) throw new IllegalArgumentException("table memory is not 8-aligned");
        for (int i = 0; i < MAGIC.length; i++)
            if (m.get(ValueLayout.JAVA_BYTE, i) != MAGIC[i]) throw new IllegalArgumentException("not a slot table (magic)");
        int layout = m.get(U32, 8), entrySize = m.get(U32, 12), cap = m.get(U32, 16);
        if (layout != LAYOUT) throw new IllegalArgumentException("table layout " + Integer.toUnsignedString(layout) + ", want 1");
        if (entrySize != ENTRY) throw new IllegalArgumentException("entry size " + Integer.toUnsignedString(entrySize) + ", want 64");
        if (cap < 1 || cap > MAX_CAPACITY || size(cap) != m.byteSize())
            throw new IllegalArgumentException("capacity " + Integer.toUnsignedString(cap) + " does not match " + m.byteSize() + " bytes");
        SlotTable t = new SlotTable(m, cap, -1);
        for (int i = cap - 1; i >= 0; i--) {
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

    /** Sets the lease id (re-declared after a reconnect). Only the holder of CONTROL, or the one control thread. */
    void setLease(int i, long lease) { seg.set(U64, at(i, LEASE), lease); }

    /** Marks the entry GONE: the agent no longer backs it; nothing is claimed there from now on. */
    void markGone(int i) { seg.set(U32, at(i, FLAGS), flags(i) | FLAG_GONE); }

    // ---- operations (spec: "Operations") ------------------------------------------------------

    /**
     * Takes entry i for {@code holder} (a TID, or {@link #CONTROL}): compare-and-swap of a free
     * state to the next generation. Returns the state written, or 0 when the entry is held or
     * another thread won.
     */
    long claimState(int i, int holder) {
        long s = state(i);
        if (hold(s) != 0) return 0;
        long n = state(gen(s) + 1, holder);
        return STATE_WORD.compareAndSet(seg, at(i, STATE), s, n) ? n : 0;
    }

    /**
     * claim(i, tid) for quota {@code asked}: the state written, or 0 when the entry is held,
     * another thread won, or (given back at once) it is empty, GONE or of another quota.
     */
    long claim(int i, int tid, long asked) {
        long s = claimState(i, tid);
        if (s == 0) return 0;
        if (slot(i) == 0 || gone(i) || asked(i) != asked) {
            free(i, s);
            return 0;
        }
        return s;
    }

    /** release(i): idle_since, then state = gen << 32 (release ordering); s is what the claim wrote. */
    void release(int i, long s, long nowNs) {
        seg.set(U64, at(i, IDLE_SINCE), nowNs);
        free(i, s);
    }

    /** Frees a claimed entry without touching idle_since (a claim that found the entry unfit). */
    private void free(int i, long s) {
        STATE_WORD.setRelease(seg, at(i, STATE), state(gen(s), 0));
    }

    /**
     * publish after a HOLD grant: claims an empty entry with holder CONTROL, writes the lease,
     * then hands it to {@code tid} (or frees it when tid is 0). Returns the entry index and the
     * state written as {@code (index, state)} packed in a {@link Claimed}, or null when the table is
     * full.
     */
    Claimed publish(int tid, long slot, long quota, long period, int flags, long lease, long asked) {
        for (int i = 0; i < capacity; i++) {
            if (slot(i) != 0 || hold(state(i)) != 0) continue;
            long s = claimState(i, CONTROL);
            if (s == 0) continue;
            if (slot(i) != 0) { // published by another thread between the look and the claim
                free(i, s);
                continue;
            }
            seg.set(U32, at(i, SLOT), (int) slot);
            seg.set(U32, at(i, QUOTA), (int) quota);
            seg.set(U32, at(i, PERIOD), (int) period);
            seg.set(U32, at(i, FLAGS), flags);
            seg.set(U64, at(i, LEASE), lease);
            seg.set(U32, at(i, ASKED), (int) asked);
            long n = state(gen(s), tid);
            high.accumulateAndGet(i + 1, Math::max);
            STATE_WORD.setRelease(seg, at(i, STATE), n);
            return new Claimed(i, n);
        }
        return null;
    }

    /** An entry a thread holds: its index and the state its claim wrote. */
    record Claimed(int index, long state) {}

    /** What drop does with the entry's lease (RELEASE it, unless GONE). */
    @FunctionalInterface
    interface Releaser {
        void release(long slot, long lease, int flags);
    }

    /**
     * drop(i): claims the entry with holder CONTROL, hands its lease to {@code releaser}, zeroes
     * every field but {@code state}, then frees it. False when the entry is held (or another
     * thread won).
     */
    boolean drop(int i, Releaser releaser) {
        long s = claimState(i, CONTROL);
        if (s == 0) return false;
        long slot = slot(i);
        if (slot != 0) releaser.release(slot, lease(i), flags(i));
        seg.asSlice(at(i, SLOT), ENTRY - SLOT).fill((byte) 0);
        free(i, s);
        return true;
    }

    /**
     * find: a free entry for quota {@code asked} that is not GONE, claimed for tid, from
     * {@code from} on (wrapping), skipping {@code skip}. Looks before it claims, so that entries of
     * other quotas are not claimed (and their generation not bumped) for nothing. Null when none.
     */
    Claimed find(long asked, int tid, int from, int skip) {
        int n = high.get();
        if (from >= n) from = 0;
        for (int k = 0; k < n; k++) {
            int i = from + k;
            if (i >= n) i -= n;
            if (i == skip || slot(i) == 0 || asked(i) != asked || gone(i) || hold(state(i)) != 0) continue;
            long s = claim(i, tid, asked);
            if (s != 0) return new Claimed(i, s);
        }
        return null;
    }
}
