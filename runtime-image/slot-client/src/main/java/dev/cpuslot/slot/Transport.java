package dev.cpuslot.slot;

import java.io.IOException;
import java.util.concurrent.TimeoutException;

/**
 * The client's connections to the agent, as the lease and recovery logic sees them: borrow a
 * connection (one request in flight on it), make a call, give it back or kill it. The real one
 * is {@link SocketTransport}; unit tests of the logic use a fake.
 */
interface Transport extends AutoCloseable {
    /** An answer and the fds that came with it (the receiver owns them). */
    record Reply(Protocol.Frame frame, int[] fds) {
        Protocol.Message message() { return frame.message(); }
    }

    /** What the rest of the client hears about connections. */
    interface Listener {
        /** A connection said HELLO. */
        void connected(Connection c);
        /** A connection died; its held leases must be re-declared. */
        void lost(Connection c);
    }

    /**
     * An idle connection, or a new one (connect and HELLO) when all are busy and the pool has
     * room. backoff false: a failed connect does not make the next borrows back off (warm-up).
     */
    Connection borrow(long deadline, boolean backoff) throws IOException, TimeoutException;

    /** Waits until c is idle and takes it; IOException when it died. */
    void borrow(Connection c, long deadline) throws IOException, TimeoutException;

    void giveBack(Connection c);

    /** Closes a broken connection and tells the listener. */
    void kill(Connection c, String why);

    boolean isAlive(Connection c);

    /** One request, one answer. Caller has c borrowed. */
    Reply call(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException;

    /**
     * Writes one request with no answer to wait for. TimeoutException only when nothing was
     * written (c stays usable); a partial write is an IOException.
     */
    void send(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException;

    /**
     * Writes a one-way frame (RELEASE with NO_REPLY, USAGE) on c whether or not c is borrowed: the
     * agent takes one-way frames while an ACQUIRE waits there (spec: "Transport"), and a frame
     * naming a lease must go on the connection that holds the lease. TimeoutException only when
     * nothing was written.
     */
    void sendBeside(Connection c, Protocol.Message m, long deadline) throws IOException, TimeoutException;

    /** c is borrowed by name only from now on ({@link #borrow(Connection, long)}). */
    void reserve(Connection c);

    /** Reads the answer to a request whose call timed out. Caller has c borrowed. */
    Reply finish(Connection c, long deadline) throws IOException, TimeoutException, Protocol.ProtocolException;

    /** Kills idle connections the agent went away from (an idle connection must be silent). */
    void reapDead();

    /** The last HELLO_OK seen, or null. */
    Protocol.HelloOk lastHello();

    /** Closes every connection (the agent releases their leases); borrows fail from now on. */
    @Override
    void close();
}
