package dev.cpuslot.slot;

import java.io.IOException;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * Fd operations on made-up fd numbers, for unit tests of the fd cache and the lease logic: what
 * was written to which fd, which were closed, and counters a test sets per counter fd.
 */
final class FakeFds implements FdCache.FdOps {
    record Write(int fd, String text) {}

    final List<Write> writes = new CopyOnWriteArrayList<>();
    final Set<Integer> closed = ConcurrentHashMap.newKeySet();
    final Map<Integer, SlotCounters> counters = new ConcurrentHashMap<>();
    /** Runs during each write (lets a test act while a placement is in progress). */
    volatile Runnable duringWrite = () -> { };
    volatile IOException writeError;
    /** Counter reads so far (each one, on v1, two preads). */
    final java.util.concurrent.atomic.AtomicInteger reads = new java.util.concurrent.atomic.AtomicInteger();

    @Override
    public long write(int fd, byte[] b) throws IOException {
        if (closed.contains(fd)) throw new IOException("write to closed fd " + fd);
        duringWrite.run();
        if (writeError != null) throw writeError;
        writes.add(new Write(fd, new String(b)));
        return b.length;
    }

    @Override
    public SlotCounters readCounters(int statFd, int acctFd) throws IOException {
        if (closed.contains(statFd)) throw new IOException("read of closed fd " + statFd);
        reads.incrementAndGet();
        SlotCounters c = counters.get(statFd);
        if (c == null) throw new IOException("no counters on fd " + statFd);
        return c;
    }

    @Override
    public void close(int fd) {
        if (!closed.add(fd)) throw new AssertionError("fd " + fd + " closed twice");
    }
}
