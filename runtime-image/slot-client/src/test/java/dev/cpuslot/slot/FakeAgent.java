package dev.cpuslot.slot;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * An in-process stand-in for the node agent, speaking the real wire protocol over a real Unix
 * socket, with real SCM_RIGHTS fds. A "slot" is a regular file: the fd passed is that file opened
 * for writing, so a test can read what the client wrote to it ("0" per placement).
 */
public final class FakeAgent implements AutoCloseable {
    public final Path dir, socket;
    final Map<Long, Path> slotFiles = new ConcurrentHashMap<>();
    final Map<Long, Long> slotQuota = new ConcurrentHashMap<>();
    /** lease id -> slot, for leases currently held. */
    final Map<Long, Long> leases = new ConcurrentHashMap<>();
    final Map<Long, Long> slotTid = new ConcurrentHashMap<>();  // which tid sat in a slot last
    final AtomicLong nextLease = new AtomicLong(100);
    final AtomicLong nextSlot = new AtomicLong(1);
    public final List<Protocol.Message> received = new CopyOnWriteArrayList<>();
    final AtomicInteger pipelined = new AtomicInteger();
    final AtomicInteger connections = new AtomicInteger();
    volatile long helloFlags = 0;
    /** Announce LEND in HELLO_OK: the client then sends SLEEP and WAKE (spec: "Lending"). */
    public volatile boolean lends;
    /** Grant HOLD leases (HELLO_OK flag LOCAL) to a client that asks for local leasing. */
    public volatile boolean grantsLocal;
    volatile long acquireDelayMs = 0;
    /**
     * Strict, as the real agent (0: off): an ACQUIRE is admitted against this many millicores
     * and waits up to its wait_us for them (else TIMEOUT), reading the connection's one-way frames
     * meanwhile; a lease is the connection's that got it, so a frame naming it on another one is
     * UNKNOWN_LEASE (counted in {@link #foreign}), and it ends when its connection closes.
     */
    public volatile long budgetMilli = 0;
    /** Frames that named a lease of another connection (strict mode). */
    final AtomicInteger foreign = new AtomicInteger();
    private long usedMilli;                       // guarded by this
    private final Map<Long, long[]> owned = new ConcurrentHashMap<>(); // lease -> {connection, quota}
    private final AtomicLong connIds = new AtomicLong();
    volatile boolean alwaysSendFds = false;
    /**
     * Counter fds sent after the placement fd: 0 (an agent that passes placement fds only), 1
     * (v2: cpu.stat) or 2 (v1: cpu.stat, cpuacct.usage). The files are slot-N.stat and
     * slot-N.acct; tests write counters into them.
     */
    public volatile int statFds = 0;
    /** Optional override: return an answer for an ACQUIRE, or null for the normal path. */
    public volatile Function<Protocol.Acquire, Protocol.Message> acquireHook;
    private volatile int listenFd = -1;
    private volatile boolean running;
    private final List<Thread> servers = new CopyOnWriteArrayList<>();
    private volatile int generation;
    private Thread acceptor;

    public FakeAgent(Path dir) {
        this.dir = dir;
        this.socket = dir.resolve("agent.sock");
    }

    public FakeAgent start() throws IOException {
        Files.deleteIfExists(socket);
        listenFd = Native.listen(socket.toString(), 64);
        running = true;
        acceptor = Thread.ofPlatform().daemon().name("fake-agent-accept").start(this::acceptLoop);
        return this;
    }

    /** Closes the listener and every connection, like an agent that died. State survives. */
    public void stop() throws Exception {
        running = false;
        generation++;
        int l = listenFd;
        listenFd = -1;
        if (acceptor != null) acceptor.join(2000);
        Native.close(l);
        // each connection's thread closes its own fd (no fd-number reuse races)
        for (Thread t : servers) t.join(2000);
        servers.clear();
        Files.deleteIfExists(socket);
    }

    /** What an agent that restarts does: adopts slots, forgets leases. */
    public void restart(boolean keepSlots) throws Exception {
        stop();
        leases.clear();
        if (!keepSlots) {
            slotFiles.clear();
            slotQuota.clear();
        }
        start();
    }

    @Override
    public void close() throws Exception { stop(); }

    public String slotContent(long slot) throws IOException { return Files.readString(slotFiles.get(slot)); }

    public long count(Class<?> type) { return received.stream().filter(type::isInstance).count(); }

    private void acceptLoop() {
        while (running) {
            try {
                int fd = listenFd;
                if (fd < 0) return;
                if (Native.poll(fd, Native.POLLIN, 50) == 0) continue;
                int c = Native.accept(fd);
                if (c < 0) continue;
                connections.incrementAndGet();
                int gen = generation;
                servers.add(Thread.ofPlatform().daemon().name("fake-agent-conn").start(() -> serve(c, gen)));
            } catch (IOException e) {
                return;
            }
        }
    }

    private void serve(int fd, int gen) {
        Set<Long> sentSlots = new HashSet<>();
        java.util.ArrayDeque<byte[]> ahead = new java.util.ArrayDeque<>();
        long conn = connIds.incrementAndGet();
        try {
            while (running && gen == generation) {
                byte[] frame = ahead.isEmpty() ? readFrame(fd, gen) : ahead.poll();
                if (frame == null) return;
                // one request in flight per connection: no other request may be waiting already
                // (one-way frames, request 0, may: the client writes them beside a request)
                while (Protocol.decodeFrame(frame).request() != 0 && ahead.isEmpty() && Native.poll(fd, Native.POLLIN, 0) != 0) {
                    byte[] next = readFrame(fd, gen);
                    if (next == null) break;
                    ahead.add(next);
                    if (Protocol.decodeFrame(next).request() != 0) pipelined.incrementAndGet();
                }
                Protocol.Frame f = Protocol.decodeFrame(frame);
                received.add(f.message());
                Protocol.Message answer;
                int[] fds = new int[0];
                switch (f.message()) {
                    case Protocol.Hello h -> answer = new Protocol.HelloOk(1, statFds == 2 ? 1 : 2,
                            helloFlags | (lends ? Protocol.HELLO_OK_LEND : 0) | (grantsLocal && (h.flags() & Protocol.HELLO_LOCAL) != 0 ? Protocol.HELLO_OK_LOCAL : 0),
                            1, statFds, "fake/container", 0, List.of());
                    case Protocol.UsageReport u -> {
                        continue; // one-way
                    }
                    case Protocol.Acquire a -> {
                        if (acquireDelayMs > 0) Thread.sleep(acquireDelayMs);
                        if (budgetMilli > 0 && !admit(fd, gen, conn, a, ahead)) {
                            answer = new Protocol.Error(Protocol.E_TIMEOUT, 10, "no budget");
                            break;
                        }
                        Protocol.Message hook = acquireHook == null ? null : acquireHook.apply(a);
                        if (hook != null) {
                            answer = hook;
                            break;
                        }
                        long slot = slotFor(a.quotaMilli());
                        long lease = nextLease.incrementAndGet();
                        leases.put(lease, slot);
                        if (budgetMilli > 0) owned.put(lease, new long[]{conn, a.quotaMilli()});
                        boolean agentPlaces = (a.flags() & Protocol.ACQUIRE_AGENT_PLACES) != 0;
                        Long lastTid = slotTid.put(slot, a.tid());
                        int outcome = lastTid != null && lastTid == a.tid() && a.currentSlot() == slot ? Protocol.OUTCOME_AFFINITY_HIT
                                : lastTid != null ? Protocol.OUTCOME_CACHE_HIT : Protocol.OUTCOME_CREATED;
                        int place = agentPlaces ? Protocol.PLACE_DONE
                                : outcome == Protocol.OUTCOME_AFFINITY_HIT ? Protocol.PLACE_NONE : Protocol.PLACE_SELF;
                        if (!agentPlaces && place == Protocol.PLACE_SELF && (alwaysSendFds || sentSlots.add(slot))) {
                            fds = slotFds(slot);
                        }
                        answer = new Protocol.AcquireOk(lease, slot, a.quotaMilli(), 100000, outcome, 0, place, fds.length);
                    }
                    case Protocol.Release r when budgetMilli > 0 -> {
                        boolean mine = strictRelease(conn, r);
                        if ((r.flags() & Protocol.RELEASE_NO_REPLY) != 0) continue;
                        answer = !mine ? new Protocol.Error(Protocol.E_UNKNOWN_LEASE, 0, "not this connection's lease")
                                : new Protocol.ReleaseOk(1000 * r.lease(), 7, 3, 1);
                    }
                    case Protocol.Release r -> {
                        // a SLEEP or WAKE keeps the lease (one-way, as the client sends them)
                        if ((r.flags() & (Protocol.RELEASE_SLEEP | Protocol.RELEASE_WAKE)) != 0) continue;
                        Long slot = leases.remove(r.lease());
                        if ((r.flags() & Protocol.RELEASE_NO_REPLY) != 0) continue; // nothing is sent
                        answer = slot == null ? new Protocol.Error(Protocol.E_UNKNOWN_LEASE, 0, "unknown lease")
                                : new Protocol.ReleaseOk(1000 * r.lease(), 7, 3, 1);
                    }
                    case Protocol.Reclaim r -> {
                        if (!slotFiles.containsKey(r.slot()) || leases.containsValue(r.slot())) {
                            answer = new Protocol.Error(Protocol.E_UNKNOWN_LEASE, 0, "no such slot");
                        } else {
                            long lease = nextLease.incrementAndGet();
                            leases.put(lease, r.slot());
                            if (budgetMilli > 0) {
                                owned.put(lease, new long[]{conn, r.quotaMilli()});
                                synchronized (this) { usedMilli += r.quotaMilli(); }
                            }

                            answer = new Protocol.AcquireOk(lease, r.slot(), r.quotaMilli(), 100000,
                                    Protocol.OUTCOME_AFFINITY_HIT, 0, Protocol.PLACE_NONE, fds.length);
                        }
                    }
                    default -> answer = new Protocol.Error(Protocol.E_BAD_REQUEST, 0, "unexpected");
                }
                byte[] out = Protocol.encode(f.request(), answer);
                long n = Native.send(fd, out, 0, 1, fds);      // fds ride on the first byte
                for (int x : fds) Native.close(x);
                if (n != 1) return;
                int off = 1;
                while (off < out.length) {
                    long k = Native.send(fd, out, off, out.length - off, null);
                    if (k > 0) off += (int) k;
                    else Native.poll(fd, Native.POLLOUT, 100);
                }
            }
        } catch (Exception e) {
            // connection ends
        } finally {
            Native.close(fd);
            // its leases end with it
            owned.forEach((lease, o) -> {
                if (o[0] == conn && owned.remove(lease) != null) {
                    leases.remove(lease);
                    freeBudget(o[1]);
                }
            });
        }
    }

    /** Strict admission: waits for budget, taking the connection's one-way frames meanwhile. */
    private boolean admit(int fd, int gen, long conn, Protocol.Acquire a, java.util.ArrayDeque<byte[]> ahead) throws Exception {
        long until = System.nanoTime() + Math.max(1, a.waitUs()) * 1000L;
        while (true) {
            synchronized (this) {
                if (usedMilli + a.quotaMilli() <= budgetMilli) {
                    usedMilli += a.quotaMilli();
                    return true;
                }
            }
            if (System.nanoTime() >= until) return false;
            while (!ahead.isEmpty() && Protocol.decodeFrame(ahead.peek()).request() == 0) takeOneWay(conn, ahead.poll());
            if (ahead.isEmpty() && Native.poll(fd, Native.POLLIN, 1) != 0) {
                byte[] next = readFrame(fd, gen);
                if (next == null) return false;
                if (Protocol.decodeFrame(next).request() == 0) takeOneWay(conn, next);
                else ahead.add(next); // answered after this ACQUIRE
            } else if (!ahead.isEmpty()) {
                synchronized (this) { wait(1); }
            }
        }
    }

    private void takeOneWay(long conn, byte[] frame) throws Protocol.ProtocolException {
        Protocol.Message m = Protocol.decodeFrame(frame).message();
        received.add(m);
        if (m instanceof Protocol.Release r) strictRelease(conn, r);
    }

    /** Whether connection conn holds r's lease; a RELEASE (not a SLEEP or WAKE) then ends it. */
    private boolean strictRelease(long conn, Protocol.Release r) {
        long[] o = owned.get(r.lease());
        if (o == null) return false;
        if (o[0] != conn) {
            foreign.incrementAndGet();
            return false;
        }
        if ((r.flags() & (Protocol.RELEASE_SLEEP | Protocol.RELEASE_WAKE)) != 0) return true;
        if (owned.remove(r.lease()) != null) {
            leases.remove(r.lease());
            freeBudget(o[1]);
        }
        return true;
    }

    private synchronized void freeBudget(long quota) {
        usedMilli -= quota;
        notifyAll();
    }

    /** A slot's fds as the real agent sends them: placement fd, then statFds counter fds. */
    private int[] slotFds(long slot) throws IOException {
        int[] fds = new int[1 + statFds];
        fds[0] = Native.open(slotFiles.get(slot).toString(), Native.O_WRONLY | Native.O_APPEND, 0);
        if (statFds >= 1) fds[1] = Native.open(statFile(slot).toString(), Native.O_RDONLY, 0);
        if (statFds >= 2) fds[2] = Native.open(acctFile(slot).toString(), Native.O_RDONLY, 0);
        return fds;
    }

    public Path statFile(long slot) { return dir.resolve("slot-" + slot + ".stat"); }
    public Path acctFile(long slot) { return dir.resolve("slot-" + slot + ".acct"); }

    /** Sets a slot's counters as the kernel would render them (v2 style, or v1 when statFds is 2). */
    public void setCounters(long slot, long cpuNanos, long throttledNanos, long periods, long throttledPeriods) throws IOException {
        if (statFds == 2) {
            Files.writeString(statFile(slot), "nr_periods " + periods + "\nnr_throttled " + throttledPeriods
                    + "\nthrottled_time " + throttledNanos + "\n");
            Files.writeString(acctFile(slot), cpuNanos + "\n");
        } else {
            Files.writeString(statFile(slot), "usage_usec " + cpuNanos / 1000 + "\nuser_usec 0\nsystem_usec 0\nnr_periods "
                    + periods + "\nnr_throttled " + throttledPeriods + "\nthrottled_usec " + throttledNanos / 1000 + "\n");
        }
    }

    private synchronized long slotFor(long quota) throws IOException {
        for (Map.Entry<Long, Long> e : slotQuota.entrySet()) {
            if (e.getValue() == quota && !leases.containsValue(e.getKey())) return e.getKey();
        }
        long slot = nextSlot.getAndIncrement();
        Path p = dir.resolve("slot-" + slot);
        Files.writeString(p, "");
        slotFiles.put(slot, p);
        setCounters(slot, 0, 0, 0, 0);
        slotQuota.put(slot, quota);
        return slot;
    }

    private byte[] readFrame(int fd, int gen) throws IOException {
        byte[] hdr = new byte[4];
        if (!readFully(fd, hdr, 0, 4, gen)) return null;
        int len = ((hdr[0] & 0xFF) << 24) | ((hdr[1] & 0xFF) << 16) | ((hdr[2] & 0xFF) << 8) | (hdr[3] & 0xFF);
        if (len < Protocol.MIN_LENGTH || len > Protocol.MAX_REQUEST_LENGTH) return null; // as the agent: no longer request exists
        byte[] frame = new byte[4 + len];
        System.arraycopy(hdr, 0, frame, 0, 4);
        if (!readFully(fd, frame, 4, len, gen)) return null;
        return frame;
    }

    private boolean readFully(int fd, byte[] b, int off, int len, int gen) throws IOException {
        while (len > 0) {
            if (!running || gen != generation) return false;
            Native.Received r = Native.recv(fd, b, off, len);
            if (r.n() == 0) return false;
            if (r.n() < 0) {
                Native.poll(fd, Native.POLLIN, 50);
                continue;
            }
            off += r.n();
            len -= r.n();
        }
        return true;
    }
}
