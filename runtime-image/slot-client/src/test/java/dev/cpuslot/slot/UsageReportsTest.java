package dev.cpuslot.slot;

import org.junit.jupiter.api.Test;

import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

/** Usage summed per (action, outcome) for USAGE, alone. */
class UsageReportsTest {
    final Counters counters = new Counters();
    final UsageReports r = new UsageReports(counters);

    static Usage u(long cpu, long thr) { return new Usage(true, cpu, thr, 0, 0); }

    @Test
    void sumsPerActionAndOutcomeOldestKeyFirstAndSaysWhenEightKeysWait() {
        assertFalse(r.add("a", ReleaseOutcome.OK, u(10, 1)));
        assertFalse(r.add("a", ReleaseOutcome.OK, u(5, 0)));
        assertFalse(r.add("a", ReleaseOutcome.FAILED, u(7, 0)));
        assertFalse(r.add("b", ReleaseOutcome.TIMEOUT, Usage.NONE), "an unmeasured invocation counts with zero time");
        assertFalse(r.add("a", ReleaseOutcome.PLACEMENT_FAILED, u(1, 1)), "no invocation ran: not reported");
        assertEquals(3, r.keys());
        for (int k = 0; k < 4; k++) assertFalse(r.add("k" + k, ReleaseOutcome.OK, u(1, 0)));
        assertTrue(r.add("k4", ReleaseOutcome.OK, u(1, 0)), "the eighth key: send early");
        List<Protocol.UsageRecord> first = r.take(2);
        assertEquals(List.of(new Protocol.UsageRecord("a", 0, 2, 15, 1), new Protocol.UsageRecord("a", 1, 1, 7, 0)), first);
        assertEquals(6, r.keys());
        r.putBack(first); // not sent: merged back, nothing lost
        r.add("a", ReleaseOutcome.OK, u(1, 0));
        List<Protocol.UsageRecord> all = r.take(Protocol.MAX_USAGE_RECORDS);
        assertEquals(8, all.size());
        assertTrue(all.contains(new Protocol.UsageRecord("a", 0, 3, 16, 1)), all.toString());
        assertTrue(all.contains(new Protocol.UsageRecord("b", 2, 1, 0, 0)), all.toString());
        assertEquals(0, r.keys());
        Protocol.encode(1, new Protocol.UsageReport(all)); // what take gives is always sendable
    }

    @Test
    void anInvocationAfterItsKeyWasTakenStartsANewRecordAndNothingIsLost() {
        r.add("a", ReleaseOutcome.OK, u(10, 1));
        r.add("a", ReleaseOutcome.OK, u(5, 0));
        assertEquals(List.of(new Protocol.UsageRecord("a", 0, 2, 15, 1)), r.take(Protocol.MAX_USAGE_RECORDS));
        r.add("a", ReleaseOutcome.OK, u(3, 0));
        r.add("a", ReleaseOutcome.FAILED, u(4, 0));
        r.add("a", ReleaseOutcome.OK, u(2, 2));
        assertEquals(2, r.keys());
        assertEquals(List.of(new Protocol.UsageRecord("a", 0, 2, 5, 2), new Protocol.UsageRecord("a", 1, 1, 4, 0)),
                r.take(Protocol.MAX_USAGE_RECORDS));
        assertEquals(0, r.keys());
    }

    @Test
    void pendingKeysAreBoundedAndWhatDoesNotFitIsCounted() {
        for (int k = 0; k < UsageReports.MAX_KEYS + 10; k++) r.add("act-" + k, ReleaseOutcome.OK, u(1, 0));
        assertEquals(UsageReports.MAX_KEYS, r.keys());
        assertEquals(10, counters.get("usage.dropped"));
        r.add("act-0", ReleaseOutcome.OK, u(1, 0));
        assertEquals(10, counters.get("usage.dropped"), "a known key still adds up");
    }
}
