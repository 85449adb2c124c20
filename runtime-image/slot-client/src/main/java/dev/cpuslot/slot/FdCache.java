package dev.cpuslot.slot;

import java.io.IOException;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A slot's fds by slot id: HELLO_OK {@code place_fds} placement fds, then {@code stat_fds}
 * read-only counter fds. New fds for a slot replace the cached ones; replaced fds are closed once
 * no thread uses them any more (reference counts), so a placement never writes to a closed, or
 * reused, fd number.
 */
final class FdCache {
    /** The system calls the cache makes on fds (real ones: {@link #NATIVE}; tests use fakes). */
    interface FdOps {
        long write(int fd, byte[] b) throws IOException;
        SlotCounters readCounters(int statFd, int acctFd) throws IOException;
        void close(int fd);
    }

    static final FdOps NATIVE = new FdOps() {
        public long write(int fd, byte[] b) throws IOException { return Native.write(fd, b); }
        public SlotCounters readCounters(int statFd, int acctFd) throws IOException { return SlotCounters.read(statFd, acctFd); }
        public void close(int fd) { Native.close(fd); }
    };

    static final class SlotFds {
        final int[] fds;
        /** fds[0..placeN) place a thread; fds[placeN..) are read-only counter fds. */
        final int placeN;
        final AtomicInteger refs = new AtomicInteger(1); // the cache's own reference
        SlotFds(int[] fds, int placeN) { this.fds = fds; this.placeN = placeN; }
        boolean retain() {
            for (;;) {
                int r = refs.get();
                if (r <= 0) return false;
                if (refs.compareAndSet(r, r + 1)) return true;
            }
        }
    }

    private final Map<Long, SlotFds> cache = new ConcurrentHashMap<>();
    private final FdOps ops;
    private final Counters counters;

    FdCache(FdOps ops, Counters counters) {
        this.ops = ops;
        this.counters = counters;
    }

    /** Closes fds that came with an answer and are not a slot's to keep. */
    void discard(int[] fds) {
        for (int fd : fds) ops.close(fd);
    }

    /** Number of slots whose fds are cached. */
    int size() { return cache.size(); }

    /** Caches a slot's fds, split as the agent's HELLO_OK announced (all placement fds if it did not). */
    void put(long slot, int[] fds, Protocol.HelloOk hello) {
        counters.count("fds.received");
        int p = hello == null ? 0 : hello.placeFds(), st = hello == null ? 0 : hello.statFds();
        int placeN = p > 0 && fds.length == p + st ? p : fds.length;
        SlotFds old = cache.put(slot, new SlotFds(fds, placeN));
        if (old != null) {
            counters.count("fds.replaced");
            unref(old);
        }
    }

    /**
     * Takes the fds that came with a grant (ACQUIRE_OK) for its slot, on either leasing path. False,
     * with the fds closed, when they are not the nfds the grant announced: the caller gives the lease
     * back.
     */
    boolean keep(Protocol.AcquireOk ok, int[] got, Protocol.HelloOk hello) {
        if (got.length != ok.nfds()) {
            discard(got);
            return false;
        }
        if (got.length > 0) put(ok.slot(), got, hello);
        return true;
    }

    /** Writes {@code what} to each placement fd of the slot. Returns null or an error message. */
    String place(long slot, byte[] what) {
        for (int attempt = 0; attempt < 2; attempt++) {
            SlotFds sf = cache.get(slot);
            if (sf == null) return "no fds cached for slot " + slot;
            if (!sf.retain()) continue; // replaced and closed meanwhile: look again
            try {
                if (sf.placeN == 0) return "no placement fd for slot " + slot;
                for (int i = 0; i < sf.placeN; i++) {
                    long n = ops.write(sf.fds[i], what);
                    if (n != what.length) return "short write to slot fd";
                }
                return null;
            } catch (IOException e) {
                return e.getMessage();
            } finally {
                unref(sf);
            }
        }
        return "slot fds replaced while placing";
    }

    /**
     * Reads the slot's counters from its counter fds; null when there are none (an agent that
     * passes placement fds only) or the read failed (counted).
     */
    SlotCounters readCounters(long slot) {
        for (int attempt = 0; attempt < 2; attempt++) {
            SlotFds sf = cache.get(slot);
            if (sf == null || sf.placeN >= sf.fds.length) return null;
            if (!sf.retain()) continue;
            try {
                int stat = sf.fds[sf.placeN];
                int acct = sf.fds.length > sf.placeN + 1 ? sf.fds[sf.placeN + 1] : -1;
                return ops.readCounters(stat, acct);
            } catch (IOException e) {
                counters.count("counters.failed");
                return null;
            } finally {
                unref(sf);
            }
        }
        return null;
    }

    void unref(SlotFds sf) {
        if (sf.refs.decrementAndGet() == 0) discard(sf.fds);
    }

    /** Drops every slot; fds in use close when their user is done. */
    void close() {
        for (Long slot : cache.keySet()) {
            SlotFds sf = cache.remove(slot);
            if (sf != null) unref(sf);
        }
    }
}
