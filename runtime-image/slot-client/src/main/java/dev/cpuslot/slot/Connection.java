package dev.cpuslot.slot;

import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;

/**
 * One connection to the agent: its socket, what HELLO_OK said, the leases it granted and its
 * read state. One request in flight at a time (the holder has it "busy").
 */
final class Connection {
    private static final AtomicLong IDS = new AtomicLong();

    final long id = IDS.incrementAndGet();
    int fd = -1;
    boolean busy, alive = true;        // guarded by the transport's lock
    /** Busy only while the monitor checks it is still open (a borrower waits, not opens another). */
    boolean probing;                   // guarded by the transport's lock
    /** Borrowed by name only (the hold connection of local leasing), never by borrow(deadline). */
    boolean reserved;                  // guarded by the transport's lock
    /** Orders writes: a lease's one-way frames go out beside a request in flight (sendBeside). */
    final ReentrantLock writeLock = new ReentrantLock();
    /** An ACQUIRE is in flight: it may wait for budget, so a lease's RELEASE goes beside it. */
    volatile boolean acquiring;
    boolean agentPlaces;
    Protocol.HelloOk hello;
    long nextRequest = 1;              // used only while busy
    /** Leases granted or re-declared on this connection that are still held. */
    final Set<SlotLease> leases = ConcurrentHashMap.newKeySet();
    final FrameReader reader = new FrameReader();
    /** Fds received with the bytes read so far. */
    final List<Integer> fds = new ArrayList<>();

    /** The next request id (u32, never 0). */
    long nextRequestId() {
        long req = nextRequest++;
        if (nextRequest > 0xFFFFFFFFL) nextRequest = 1;
        return req;
    }

    int[] takeFds() {
        int[] a = new int[fds.size()];
        for (int i = 0; i < a.length; i++) a[i] = fds.get(i);
        fds.clear();
        return a;
    }
}
