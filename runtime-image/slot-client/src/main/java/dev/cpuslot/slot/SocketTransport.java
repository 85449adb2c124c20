package dev.cpuslot.slot;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The slot protocol over a Unix socket: a pool of up to maxConnections connections, each said
 * HELLO once, framed requests, and the fds that arrive with answers (SCM_RIGHTS).
 */
final class SocketTransport implements Transport {
    private final String socket, clientName;
    private final int maxConnections;
    private final long backoffNs;
    private final boolean fdPassing;
    private final Counters counters;
    private volatile Listener listener = new Listener() {
        public void connected(Connection c) { }
        public void lost(Connection c) { }
    };

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition freed = lock.newCondition();
    private final List<Connection> conns = new ArrayList<>();
    private volatile long downUntil;
    private volatile boolean closed;
    private volatile Protocol.HelloOk lastHello;

    SocketTransport(String socket, String clientName, int maxConnections, long backoffNs, boolean fdPassing, Counters counters) {
        this.socket = socket;
        this.clientName = clientName;
        this.maxConnections = maxConnections;
        this.backoffNs = backoffNs;
        this.fdPassing = fdPassing;
        this.counters = counters;
    }

    void listener(Listener l) { this.listener = l; }

    private volatile boolean local;

    /** Ask for local leasing (HELLO flag LOCAL) on connections opened from now on; needs fd passing. */
    void local(boolean on) { this.local = on; }

    @Override
    public Protocol.HelloOk lastHello() { return lastHello; }

    // ---- the pool ---------------------------------------------------------------------------

    @Override
    public boolean isAlive(Connection c) {
        lock.lock();
        try {
            return c.alive;
        } finally {
            lock.unlock();
        }
    }

    @Override
    public Connection borrow(long deadline, boolean backoff) throws IOException, TimeoutException {
        Connection fresh = null;
        lock.lock();
        try {
            while (fresh == null) {
                if (closed) throw new IOException("client closed");
                boolean probed = false;
                for (Connection c : conns) {
                    if (c.alive && !c.busy && !c.reserved && c.hello != null) {
                        c.busy = true;
                        return c;
                    }
                    probed |= c.alive && c.probing;
                }
                // a connection the monitor is checking is free again in a moment: wait for it
                // rather than open another one
                if (probed) {
                    awaitFreed(deadline);
                    continue;
                }
                if (conns.size() - reserved() < maxConnections) {
                    if (System.nanoTime() < downUntil) {
                        counters.count("connect.backoff");
                        throw new IOException("agent unreachable (backing off)");
                    }
                    fresh = new Connection();
                    fresh.busy = true;
                    conns.add(fresh);
                    break;
                }
                awaitFreed(deadline);
            }
        } finally {
            lock.unlock();
        }
        try {
            open(fresh, deadline);
            return fresh;
        } catch (IOException | TimeoutException | Protocol.ProtocolException e) {
            Native.close(fresh.fd);
            lock.lock();
            try {
                fresh.alive = false;
                conns.remove(fresh);
                freed.signalAll();
            } finally {
                lock.unlock();
            }
            if (!(e instanceof TimeoutException)) {
                if (backoff) downUntil = System.nanoTime() + backoffNs;
                counters.count("connect.failed");
            }
            if (e instanceof TimeoutException te) throw te;
            if (e instanceof IOException io) throw io;
            throw new IOException(e.getMessage(), e);
        }
    }

    @Override
    public void borrow(Connection c, long deadline) throws IOException, TimeoutException {
        lock.lock();
        try {
            while (c.alive && c.busy) awaitFreed(deadline);
            if (!c.alive) throw new IOException("connection closed");
            c.busy = true;
        } finally {
            lock.unlock();
        }
    }

    /** Reserved connections (the hold connection) come on top of maxConnections. Caller holds lock. */
    private int reserved() {
        int n = 0;
        for (Connection c : conns) if (c.reserved) n++;
        return n;
    }

    @Override
    public void reserve(Connection c) {
        lock.lock();
        try {
            c.reserved = true;
        } finally {
            lock.unlock();
        }
    }

    /** Caller holds lock. */
    private void awaitFreed(long deadline) throws TimeoutException {
        long rem = deadline - System.nanoTime();
        if (rem <= 0) throw new TimeoutException();
        try {
            freed.awaitNanos(rem);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new TimeoutException();
        }
    }

    @Override
    public void giveBack(Connection c) {
        lock.lock();
        try {
            c.busy = false;
            c.probing = false;
            freed.signalAll();
        } finally {
            lock.unlock();
        }
    }

    @Override
    public void kill(Connection c, String why) {
        lock.lock();
        try {
            if (!c.alive) return;
            c.alive = false;
            c.busy = false;
            c.probing = false;
            conns.remove(c);
            freed.signalAll();
        } finally {
            lock.unlock();
        }
        counters.count("connection.lost");
        closeFd(c);
        closeAll(c.takeFds());
        listener.lost(c);
    }

    @Override
    public void reapDead() {
        List<Connection> idle = new ArrayList<>();
        lock.lock();
        try {
            for (Connection c : conns) {
                if (c.alive && !c.busy && c.hello != null) {
                    c.busy = true;
                    c.probing = true;
                    idle.add(c);
                }
            }
        } finally {
            lock.unlock();
        }
        for (Connection c : idle) {
            int ev;
            try {
                ev = Native.poll(c.fd, Native.POLLIN, 0);
            } catch (IOException e) {
                ev = Native.POLLERR;
            }
            if (ev != 0) kill(c, "agent went away");
            else giveBack(c);
        }
    }

    @Override
    public void close() {
        List<Connection> all;
        lock.lock();
        try {
            closed = true;
            all = new ArrayList<>(conns);
            conns.clear();
            for (Connection c : all) c.alive = false;
            freed.signalAll();
        } finally {
            lock.unlock();
        }
        for (Connection c : all) closeFd(c);
    }

    /** Closes c's socket, never while a write is on it (its fd number could be reused). */
    private static void closeFd(Connection c) {
        c.writeLock.lock();
        try {
            Native.close(c.fd);
            c.fd = -1;
        } finally {
            c.writeLock.unlock();
        }
    }

    private static void closeAll(int[] fds) {
        for (int fd : fds) Native.close(fd);
    }

    // ---- one connection ---------------------------------------------------------------------

    private void open(Connection c, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        c.fd = Native.socket();
        while (true) {
            int r = Native.connect(c.fd, socket);
            if (r == 0) break;
            if (System.nanoTime() >= deadline) throw new TimeoutException();
            // AF_UNIX answers EAGAIN when the listener's backlog is full: wait a little and retry
            LockSupport.parkNanos(200_000);
        }
        long flags = fdPassing ? Protocol.HELLO_FD_PASSING | (local ? Protocol.HELLO_LOCAL : 0) : 0;
        Reply r = call(c, new Protocol.Hello(1, 1, flags, clientName), deadline);
        closeAll(r.fds());
        if (r.message() instanceof Protocol.HelloOk ok) {
            if (ok.version() != 1) throw new IOException("agent chose version " + ok.version());
            c.hello = ok;
            c.agentPlaces = (ok.flags() & Protocol.HELLO_OK_AGENT_PLACES) != 0;
            lastHello = ok;
            counters.count("connect.ok");
            listener.connected(c);
            return;
        }
        if (r.message() instanceof Protocol.Error e) {
            counters.count("hello." + Protocol.errorName(e.code()));
            throw new IOException("HELLO refused: " + Protocol.errorName(e.code()) + " " + e.message());
        }
        throw new IOException("HELLO answered with " + Protocol.typeName(r.frame().type()));
    }

    @Override
    public Reply call(Connection c, Protocol.Message m, long deadline)
            throws IOException, TimeoutException, Protocol.ProtocolException {
        long req = write(c, m, deadline);
        // wait for the answer before the first recvmsg (saves a recvmsg that would say EAGAIN)
        if (!c.reader.midFrame() && waitFor(c.fd, Native.POLLIN, deadline) == 0) throw new TimeoutException();
        Protocol.Frame r = c.reader.read((b, off, len, dl) -> recvSome(c, b, off, len, dl), deadline);
        if (r.request() != req)
            throw new Protocol.ProtocolException(Protocol.E_BAD_REQUEST, "answer to request " + r.request() + ", expected " + req);
        return new Reply(r, c.takeFds());
    }

    @Override
    public void send(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException {
        write(c, m, deadline);
    }

    @Override
    public void sendBeside(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException {
        writeFrame(c, Protocol.encode(0, m), deadline);
    }

    @Override
    public Reply finish(Connection c, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        Protocol.Frame r = c.reader.read((b, off, len, dl) -> recvSome(c, b, off, len, dl), deadline);
        return new Reply(r, c.takeFds());
    }

    /** Writes one request; returns its request id. */
    private long write(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException {
        long req = c.nextRequestId();
        writeFrame(c, Protocol.encode(req, m), deadline);
        return req;
    }

    /** Writes one whole frame, under c's write lock. */
    private static void writeFrame(Connection c, byte[] f, long deadline) throws IOException, TimeoutException {
        c.writeLock.lock();
        try {
            if (c.fd < 0) throw new IOException("connection closed");
            int off = 0;
            while (off < f.length) {
                long n = Native.send(c.fd, f, off, f.length - off, null);
                if (n > 0) {
                    off += (int) n;
                    continue;
                }
                if (waitFor(c.fd, Native.POLLOUT, deadline) == 0) {
                    if (off > 0) throw new IOException("timed out in the middle of a request");
                    throw new TimeoutException();
                }
            }
        } finally {
            c.writeLock.unlock();
        }
    }

    private static int waitFor(int fd, short events, long deadline) throws IOException {
        while (true) {
            long rem = deadline - System.nanoTime();
            if (rem <= 0) return 0;
            int ms = (int) Math.min(Integer.MAX_VALUE, Math.max(1, (rem + 999_999) / 1_000_000));
            int ev = Native.poll(fd, events, ms);
            if (ev != 0) return ev;
        }
    }

    /** Reads some bytes; fds that come with them are kept in c.fds. */
    private int recvSome(Connection c, byte[] buf, int off, int len, long deadline) throws IOException, TimeoutException {
        while (true) {
            Native.Received r = Native.recv(c.fd, buf, off, len);
            for (int fd : r.fds()) c.fds.add(fd);
            if (r.truncated()) counters.count("fds.truncated");
            if (r.n() > 0) return r.n();
            if (r.n() == 0) throw new IOException("agent closed the connection");
            if (waitFor(c.fd, Native.POLLIN, deadline) == 0) throw new TimeoutException();
        }
    }
}
