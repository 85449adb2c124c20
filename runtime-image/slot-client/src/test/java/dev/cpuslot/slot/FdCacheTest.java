package dev.cpuslot.slot;

import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.util.List;
import java.util.Set;

import static org.junit.jupiter.api.Assertions.*;

/** The fd cache alone, on made-up fd numbers. */
class FdCacheTest {
    final FakeFds ops = new FakeFds();
    final Counters counters = new Counters();
    final FdCache cache = new FdCache(ops, counters);
    /** The agent announces one placement fd and one counter fd per slot (cgroup v2). */
    final Protocol.HelloOk v2 = new Protocol.HelloOk(1, 2, 0, 1, 1, "c", 0, List.of());

    @Test
    void placementWritesToThePlacementFdsOnlyAndCountersComeFromTheStatFd() {
        cache.put(7, new int[]{100, 101}, v2);
        SlotCounters c = new SlotCounters(5, 0, 1, 0);
        ops.counters.put(101, c);
        assertNull(cache.place(7, "0".getBytes()));
        assertEquals(List.of(new FakeFds.Write(100, "0")), ops.writes);
        assertSame(c, cache.readCounters(7));
        assertEquals(1, cache.size());
    }

    @Test
    void withoutAnAnnouncedSplitAllFdsPlaceAndThereAreNoCounters() {
        // no HELLO_OK (or a count that does not add up): every fd is a placement fd
        cache.put(1, new int[]{10, 11}, null);
        cache.put(2, new int[]{20, 21, 22}, v2);
        assertNull(cache.place(1, "0".getBytes()));
        assertNull(cache.place(2, "0".getBytes()));
        assertEquals(List.of(10, 11, 20, 21, 22), ops.writes.stream().map(FakeFds.Write::fd).toList());
        assertNull(cache.readCounters(1));
        assertNull(cache.readCounters(2));
    }

    @Test
    void aGrantKeepsItsFdsOnlyWhenThereAreAsManyAsItAnnounced() {
        Protocol.AcquireOk two = new Protocol.AcquireOk(9, 5, 500, 100_000, 0, 0, Protocol.PLACE_SELF, 2);
        assertFalse(cache.keep(two, new int[]{50}, v2), "one fd where the grant announced two");
        assertEquals(Set.of(50), ops.closed);
        assertEquals(0, cache.size());
        assertTrue(cache.keep(two, new int[]{51, 52}, v2));
        assertNull(cache.place(5, "0".getBytes()));
        assertEquals(51, ops.writes.getFirst().fd());
        Protocol.AcquireOk cached = new Protocol.AcquireOk(10, 5, 500, 100_000, 0, 0, Protocol.PLACE_SELF, 0);
        assertTrue(cache.keep(cached, new int[0], v2), "no fds: the slot's cached ones stay");
        assertEquals(1, cache.size());
        assertEquals(Set.of(50), ops.closed);
    }

    @Test
    void newFdsReplaceTheOldOnesWhichAreClosed() {
        cache.put(3, new int[]{30, 31}, v2);
        cache.put(3, new int[]{32, 33}, v2);
        assertEquals(Set.of(30, 31), ops.closed);
        assertNull(cache.place(3, "0".getBytes()));
        assertEquals(32, ops.writes.getFirst().fd());
        assertEquals(1, counters.get("fds.replaced"));
        assertEquals(2, counters.get("fds.received"));
    }

    @Test
    void fdsReplacedWhileAPlacementUsesThemCloseOnlyAfterIt() {
        cache.put(4, new int[]{40, 41}, v2);
        ops.duringWrite = () -> {
            ops.duringWrite = () -> { };
            cache.put(4, new int[]{42, 43}, v2); // a response on another thread brings new fds
            assertTrue(ops.closed.isEmpty(), "fds in use must stay open: " + ops.closed);
        };
        assertNull(cache.place(4, "0".getBytes()));
        assertEquals(Set.of(40, 41), ops.closed, "closed once the placement was done");
    }

    @Test
    void aSlotWithoutFdsOrPlacementFdsIsAnErrorNotAThrow() {
        assertEquals("no fds cached for slot 9", cache.place(9, "0".getBytes()));
        cache.put(5, new int[0], null);
        assertEquals("no placement fd for slot 5", cache.place(5, "0".getBytes()));
        cache.put(6, new int[]{60, 61}, v2);
        ops.writeError = new IOException("EBADF");
        assertEquals("EBADF", cache.place(6, "0".getBytes()));
    }

    @Test
    void aFailedCounterReadIsNullAndCounted() {
        cache.put(8, new int[]{80, 81}, v2); // no counters set on 81: the read fails
        assertNull(cache.readCounters(8));
        assertEquals(1, counters.get("counters.failed"));
    }

    @Test
    void closeClosesEveryCachedFdOnce() {
        cache.put(1, new int[]{10, 11}, v2);
        cache.put(2, new int[]{20, 21}, v2);
        cache.close();
        assertEquals(Set.of(10, 11, 20, 21), ops.closed);
        assertEquals(0, cache.size());
        assertEquals("no fds cached for slot 1", cache.place(1, "0".getBytes()));
        cache.close(); // FakeFds fails on a second close of any fd
    }
}
