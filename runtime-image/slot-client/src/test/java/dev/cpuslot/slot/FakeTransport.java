package dev.cpuslot.slot;

import java.io.IOException;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A transport for unit tests of the lease and recovery logic: no socket, answers come from a
 * script, and a test can make connecting or a call fail. Connections are plain objects with
 * fd -1; the logic never looks at the fd.
 */
final class FakeTransport implements Transport {
    /** Answers one request: a message, a Reply (message with fds), or throws. */
    @FunctionalInterface
    interface Script {
        Object answer(Protocol.Message m) throws IOException, TimeoutException, Protocol.ProtocolException;
    }

    final List<Protocol.Message> sent = new CopyOnWriteArrayList<>();
    final List<Protocol.Message> oneWay = new CopyOnWriteArrayList<>();
    /** Every request with the connection it went on. */
    record Sent(Connection on, Protocol.Message m) {}
    final List<Sent> log = new CopyOnWriteArrayList<>();
    final List<Connection> killed = new CopyOnWriteArrayList<>();
    final AtomicInteger connects = new AtomicInteger();
    volatile Script script = m -> { throw new IOException("no script for " + m); };
    /** When set, borrowing a new connection fails with it (agent away). */
    volatile IOException connectError;
    volatile Protocol.HelloOk hello = new Protocol.HelloOk(1, 1, 0, 1, 1, "fake", 0, List.of());
    volatile Listener listener;
    private Connection current;

    @Override
    public synchronized Connection borrow(long deadline, boolean backoff) throws IOException {
        if (current == null || !current.alive) {
            if (connectError != null) throw connectError;
            current = new Connection();
            current.hello = hello;
            connects.incrementAndGet();
            if (listener != null) listener.connected(current);
        }
        current.busy = true;
        return current;
    }

    /**
     * When set, borrowing a given connection waits while another holds it, as on a socket (one
     * request at a time): the hold connection's requests go in turn.
     */
    volatile boolean exclusive;

    @Override
    public synchronized void borrow(Connection c, long deadline) throws IOException, TimeoutException {
        while (exclusive && c.alive && c.busy) {
            long left = deadline - System.nanoTime();
            if (left <= 0) throw new TimeoutException("connection busy");
            try {
                java.util.concurrent.TimeUnit.NANOSECONDS.timedWait(this, left);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IOException(e);
            }
        }
        if (!c.alive) throw new IOException("connection closed");
        c.busy = true;
    }

    @Override
    public synchronized void giveBack(Connection c) {
        c.busy = false;
        notifyAll();
    }

    @Override
    public void kill(Connection c, String why) {
        synchronized (this) {
            if (!c.alive) return;
            c.alive = false;
            c.busy = false;
            notifyAll(); // a borrower waiting for it (exclusive) gets its IOException now
        }
        killed.add(c);
        if (listener != null) listener.lost(c);
    }

    @Override
    public synchronized boolean isAlive(Connection c) { return c.alive; }

    @Override
    public Reply call(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        sent.add(m);
        log.add(new Sent(c, m));
        return reply(script.answer(m));
    }

    static Reply reply(Object a) {
        if (a instanceof Reply r) return r;
        Protocol.Message msg = (Protocol.Message) a;
        return new Reply(new Protocol.Frame(1, msg.type(), 1, msg), new int[0]);
    }

    @Override
    public void send(Connection c, Protocol.Message m, long deadline) {
        sent.add(m);
        log.add(new Sent(c, m));
        oneWay.add(m);
    }

    @Override
    public void sendBeside(Connection c, Protocol.Message m, long deadline) throws IOException {
        if (!isAlive(c)) throw new IOException("connection closed");
        send(c, m, deadline);
    }

    /** One connection serves all here: reserving it changes nothing. */
    @Override
    public void reserve(Connection c) { }

    /** What a drainer reads: the script's answer to null (the timed-out request). */
    volatile Script late = m -> { throw new IOException("nothing late"); };

    @Override
    public Reply finish(Connection c, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException {
        return reply(late.answer(null));
    }

    @Override
    public void reapDead() { }

    @Override
    public Protocol.HelloOk lastHello() { return hello; }

    @Override
    public void close() { }

    /** The next borrow opens another connection; the current one stays open (all were busy). */
    synchronized void openAnother() { current = null; }

    /** Kills the current connection, as when the agent restarts. */
    void dropConnection() {
        Connection c;
        synchronized (this) { c = current; }
        if (c != null) kill(c, "agent restarted");
    }

    long count(Class<?> type) { return sent.stream().filter(type::isInstance).count(); }
}
