package dev.cpuslot.slot;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;

import java.util.List;

import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * What the local-leasing unit tests share: a fake transport (the agent is each test's script)
 * and fds on made-up numbers, the client's parts over them, and the fake agent's grants. Slot n
 * has fds 10n (places) and 10n+1 (counts, at zero until a test sets them).
 */
abstract class LocalFixture {
    static final long S = 1_000_000_000L;

    final Counters counters = new Counters();
    final FakeTransport transport = new FakeTransport();
    final FakeFds ops = new FakeFds();
    final FdCache fds = new FdCache(ops, counters);
    final Recovery recovery = new Recovery(transport, fds, counters, S, S, S);
    SlotTable table;
    long nextLease = 100, nextSlot = 1;

    @BeforeEach
    void needNative() {
        assertTrue(Native.available(), "acquire reads the thread's kernel tid: " + Native.loadError());
        transport.listener = recovery;
    }

    @AfterEach
    void closeTable() {
        if (table != null) Native.close(table.fd());
    }

    /** The agent's HELLO_OK flags (HELLO_OK_LOCAL: it grants HOLD leases). */
    void agentFlags(long flags) { transport.hello = new Protocol.HelloOk(1, 1, flags, 1, 1, "fake", 0, List.of()); }

    Leases leases(long budgetNs, long releaseNs, long lingerNs) {
        return new Leases(transport, fds, recovery, counters, budgetNs, releaseNs, lingerNs, false, true);
    }

    /** The local path on a new table of capacity entries, told of the transport's connections. */
    LocalLeases local(Leases leases, int capacity, long budgetNs, long releaseNs) throws Native.NativeException {
        if (table != null) Native.close(table.fd());
        table = SlotTable.create(capacity);
        LocalLeases l = new LocalLeases(transport, fds, recovery, leases, counters, table, budgetNs, releaseNs, 30 * S, releaseNs, false);
        transport.listener = new Transport.Listener() {
            public void connected(Connection c) { recovery.connected(c); l.connected(c); }
            public void lost(Connection c) { recovery.lost(c); l.lost(c); }
        };
        return l;
    }

    /** A grant of a new slot at the asked quota, with its two fds. */
    synchronized Transport.Reply grant(Protocol.Acquire a) {
        long slot = nextSlot++;
        int[] f = {(int) slot * 10, (int) slot * 10 + 1};
        ops.counters.put(f[1], new SlotCounters(0, 0, 0, 0));
        var ok = new Protocol.AcquireOk(++nextLease, slot, a.quotaMilli(), 100_000, Protocol.OUTCOME_CACHE_HIT, 0,
                Protocol.PLACE_SELF, 2);
        return new Transport.Reply(new Protocol.Frame(1, ok.type(), 1, ok), f);
    }

    /** A RECLAIM's answer: a new lease on the same slot. */
    synchronized Protocol.AcquireOk reclaimed(Protocol.Reclaim r) {
        return new Protocol.AcquireOk(++nextLease, r.slot(), r.quotaMilli(), 100_000, Protocol.OUTCOME_AFFINITY_HIT, 0,
                Protocol.PLACE_NONE, 0);
    }
}
