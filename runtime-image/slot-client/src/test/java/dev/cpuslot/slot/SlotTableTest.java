package dev.cpuslot.slot;

import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import static org.junit.jupiter.api.Assertions.*;

/** The slot table alone: its memfd, its layout, and each operation of the spec. */
class SlotTableTest {
    static final ValueLayout.OfInt U32 = ValueLayout.JAVA_INT.withOrder(ByteOrder.LITTLE_ENDIAN);
    static final ValueLayout.OfLong U64 = ValueLayout.JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN);

    @BeforeEach
    void native_() {
        assertTrue(Native.available(), "FFM calls must link: " + Native.loadError());
    }

    static long entry(int i, int field) { return SlotTable.HEADER + 64L * i + field; }

    @Test
    void createMakesASealedMemfdOfExactlyTheTablesSizeWithTheHeader() throws Exception {
        SlotTable t = SlotTable.create(3);
        try {
            assertTrue(t.fd() >= 0);
            assertEquals(64 + 64 * 3, Files.size(Path.of("/proc/self/fd/" + t.fd())), "64 + 64 * capacity bytes");
            int seals = Native.seals(t.fd());
            int want = Native.F_SEAL_SHRINK | Native.F_SEAL_GROW | Native.F_SEAL_SEAL;
            assertEquals(want, seals & want, "sealed against shrinking, growing and more sealing");
            MemorySegment m = t.memory();
            assertEquals("cpuslotT", new String(m.asSlice(0, 8).toArray(ValueLayout.JAVA_BYTE)));
            assertEquals(1, m.get(U32, 8));
            assertEquals(64, m.get(U32, 12));
            assertEquals(3, m.get(U32, 16));
            for (long o = 20; o < m.byteSize(); o++) assertEquals(0, m.get(ValueLayout.JAVA_BYTE, o), "zero at " + o);
            // what another mapping of the memfd sees (a child sharing it): the same table
            String link = Files.readSymbolicLink(Path.of("/proc/self/fd/" + t.fd())).toString();
            assertTrue(link.startsWith("/memfd:cpuslot-table"), link);
            assertEquals(3, SlotTable.over(m).capacity());
        } finally {
            Native.close(t.fd());
        }
        assertThrows(IllegalArgumentException.class, () -> SlotTable.create(0));
        assertThrows(IllegalArgumentException.class, () -> SlotTable.create(1025));
    }

    static SlotTable fresh(Arena a, int cap) {
        MemorySegment m = a.allocate(SlotTable.size(cap), 64);
        SlotTable.format(m, cap);
        return SlotTable.over(m);
    }

    @Test
    void aReaderRefusesATableItCannotTrust() {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment m = a.allocate(SlotTable.size(2), 64);
            SlotTable.format(m, 2);
            SlotTable.over(m);
            m.set(ValueLayout.JAVA_BYTE, 0, (byte) 'C');
            assertThrows(IllegalArgumentException.class, () -> SlotTable.over(m), "magic");
            SlotTable.format(m, 2);
            m.set(U32, 8, 2);
            assertThrows(IllegalArgumentException.class, () -> SlotTable.over(m), "a table of layout 2 (another version)");
            SlotTable.format(m, 2);
            m.set(U32, 12, 32);
            assertThrows(IllegalArgumentException.class, () -> SlotTable.over(m), "entry size");
            SlotTable.format(m, 2);
            m.set(U32, 16, 3);
            assertThrows(IllegalArgumentException.class, () -> SlotTable.over(m), "capacity past the memory's end");
            m.set(U32, 16, 0xFFFFFFFF);
            assertThrows(IllegalArgumentException.class, () -> SlotTable.over(m), "capacity 2^32-1");
            assertThrows(IllegalArgumentException.class, () -> SlotTable.over(m.asSlice(0, 40)), "shorter than a header");
        }
    }

    @Test
    void claimReleaseAndTheGenerationFollowTheSpec() {
        try (Arena a = Arena.ofConfined()) {
            SlotTable t = fresh(a, 4);
            assertNull(t.findAndClaim(250, 42, 0, -1, 1), "an empty table has nothing to claim");
            SlotTable.Claimed p = t.publish(42, 7, 240, 100_000, SlotTable.FLAG_DEGRADED, 0x1122334455667788L, 250, 1);
            assertEquals(0, p.index());
            assertEquals((1L << 32) | 42, p.state(), "publish claims (generation 1) and hands it to the thread");
            assertEquals(p.state(), t.state(0));
            MemorySegment m = t.memory();
            assertEquals(7, m.get(U32, entry(0, 8)));
            assertEquals(240, m.get(U32, entry(0, 12)));
            assertEquals(100_000, m.get(U32, entry(0, 16)));
            assertEquals(SlotTable.FLAG_DEGRADED, m.get(U32, entry(0, 20)));
            assertEquals(0x1122334455667788L, m.get(U64, entry(0, 24)));
            assertEquals(250, m.get(U32, entry(0, 32)));
            assertEquals(0, t.claim(0, 43, 250, 2), "held: another thread cannot claim it");
            t.release(0, p.state(), 123_456_789L);
            assertEquals(1L << 32, t.state(0), "free, same generation");
            assertEquals(123_456_789L, t.idleSince(0));
            long s = t.claim(0, 43, 250, 2);
            assertEquals((2L << 32) | 43, s, "+1 on every claim");
            t.release(0, s, 5);
            assertEquals(0, t.claim(0, 43, 500, 2), "another quota");
            assertEquals(3L << 32, t.state(0), "a claim of the wrong quota counts and is given back");
            assertEquals(2, t.idleSince(0), "by a release (stamping its time)");
            t.markGone(0);
            assertEquals(0, t.claim(0, 43, 250, 2), "GONE: nothing is claimed there");
            assertNull(t.findAndClaim(250, 43, 0, -1, 1));
        }
    }

    @Test
    void findClaimsAFreeEntryOfTheQuotaWithoutTouchingOthers() {
        try (Arena a = Arena.ofConfined()) {
            SlotTable t = fresh(a, 8);
            var e0 = t.publish(1, 10, 500, 100_000, 0, 1, 500, 1);
            var e1 = t.publish(1, 11, 250, 100_000, 0, 2, 250, 1);
            var e2 = t.publish(1, 12, 250, 100_000, 0, 3, 250, 1);
            t.release(0, e0.state(), 1);
            t.release(1, e1.state(), 1);
            assertEquals(3, t.used());
            SlotTable.Claimed c = t.findAndClaim(250, 9, 0, -1, 1);
            assertEquals(1, c.index(), "entry 2 is held, entry 0 is 500m");
            assertEquals(1L << 32, t.state(0), "entry 0 was not claimed for nothing");
            assertNull(t.findAndClaim(250, 9, 0, -1, 1), "both 250m entries held now");
            t.release(2, e2.state(), 1);
            assertEquals(2, t.findAndClaim(250, 9, 2, 1, 1).index(), "from the given entry, skipping one");
        }
    }

    @Test
    void publishTakesTheLowestEmptyEntryAndSaysWhenTheTableIsFull() {
        try (Arena a = Arena.ofConfined()) {
            SlotTable t = fresh(a, 2);
            assertEquals(0, t.publish(5, 1, 250, 100_000, 0, 100, 250, 1).index());
            var b = t.publish(0, 2, 250, 100_000, 0, 101, 250, 1);
            assertEquals(1, b.index());
            assertEquals(1L << 32, b.state(), "tid 0: published free");
            assertNull(t.publish(5, 3, 250, 100_000, 0, 102, 250, 1), "full");
        }
    }

    @Test
    void dropReleasesTheLeaseAndZeroesEverythingButTheState() {
        try (Arena a = Arena.ofConfined()) {
            SlotTable t = fresh(a, 2);
            var p = t.publish(5, 9, 250, 100_000, 0, 777, 250, 1);
            List<Long> released = new ArrayList<>();
            assertFalse(t.drop(0, (slot, lease, flags) -> released.add(lease), 3), "held by a thread: not dropped");
            t.release(0, p.state(), 99);
            assertTrue(t.drop(0, (slot, lease, flags) -> {
                assertEquals(SlotTable.CONTROL, SlotTable.hold(t.state(0)), "held by CONTROL while it is released");
                released.add(lease);
            }, 3));
            assertEquals(List.of(777L), released);
            assertEquals(2L << 32, t.state(0), "free; the drop's claim counted");
            for (long o = 8; o < 40; o++) assertEquals(0, t.memory().get(ValueLayout.JAVA_BYTE, entry(0, (int) o)), "zero at " + o);
            assertEquals(3, t.idleSince(0), "released when cleared");
            for (long o = 48; o < 64; o++) assertEquals(0, t.memory().get(ValueLayout.JAVA_BYTE, entry(0, (int) o)), "zero at " + o);
            assertEquals(0, t.publish(6, 3, 250, 100_000, 0, 778, 250, 1).index(), "the empty entry is reused");
        }
    }

    @Test
    void threadsRacingForOneEntryNeverHoldItTogether() throws Exception {
        SlotTable t = SlotTable.create(1);
        try {
            var p = t.publish(1, 3, 250, 100_000, 0, 1, 250, 1);
            t.release(0, p.state(), 0);
            int threads = 4, rounds = 20_000;
            AtomicInteger inside = new AtomicInteger();
            AtomicLong claims = new AtomicLong();
            AtomicInteger overlaps = new AtomicInteger();
            CountDownLatch go = new CountDownLatch(1);
            List<Thread> ts = new ArrayList<>();
            for (int k = 0; k < threads; k++) {
                int tid = 100 + k;
                ts.add(Thread.ofPlatform().start(() -> {
                    try {
                        go.await();
                    } catch (InterruptedException e) {
                        return;
                    }
                    for (int r = 0; r < rounds; r++) {
                        long s = t.claim(0, tid, 250, r);
                        if (s == 0) continue;
                        claims.incrementAndGet();
                        if (inside.incrementAndGet() != 1) overlaps.incrementAndGet();
                        if (SlotTable.hold(t.state(0)) != tid) overlaps.incrementAndGet();
                        inside.decrementAndGet();
                        t.release(0, s, r);
                    }
                }));
            }
            go.countDown();
            for (Thread th : ts) th.join();
            assertEquals(0, overlaps.get(), "two threads held the entry at once");
            assertTrue(claims.get() > 0);
            assertEquals(0, SlotTable.hold(t.state(0)), "free at the end");
            assertEquals(1 + claims.get(), SlotTable.gen(t.state(0)) & 0xFFFFFFFFL, "one generation per claim");
        } finally {
            Native.close(t.fd());
        }
    }
}
