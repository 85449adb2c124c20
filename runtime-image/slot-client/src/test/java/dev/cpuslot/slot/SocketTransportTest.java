package dev.cpuslot.slot;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The transport alone, on a real Unix socket against a scripted peer that checks the bytes the
 * client writes against the shared vectors and answers with vector bytes, one byte per write,
 * fds on the first byte.
 */
class SocketTransportTest {
    @TempDir
    Path dir;
    Path sock;
    final Counters counters = new Counters();
    final List<Connection> lost = new CopyOnWriteArrayList<>();
    final List<Throwable> peerErrors = new CopyOnWriteArrayList<>();
    SocketTransport transport;
    int listenFd = -1;
    Thread peer;

    @BeforeEach
    void setUp() throws Exception {
        assertTrue(Native.available(), Native.loadError() == null ? "" : Native.loadError().toString());
        sock = dir.resolve("agent.sock");
        transport = transport(sock, 3_600_000_000_000L);
    }

    SocketTransport transport(Path socket, long backoffNs) {
        SocketTransport t = new SocketTransport(socket.toString(), "java", 2, backoffNs, true, counters);
        t.listener(new Transport.Listener() {
            public void connected(Connection c) { }
            public void lost(Connection c) { lost.add(c); }
        });
        return t;
    }

    @AfterEach
    void tearDown() throws Exception {
        transport.close();
        if (peer != null) {
            peer.join(TimeUnit.SECONDS.toMillis(30));
            assertFalse(peer.isAlive(), "the scripted peer is stuck");
        }
        if (listenFd >= 0) Native.close(listenFd);
        assertEquals(List.of(), peerErrors);
    }

    static byte[] vector(String name) throws Exception {
        for (JsonElement e : VectorsTest.vectors().getAsJsonArray("valid")) {
            JsonObject v = e.getAsJsonObject();
            if (v.get("name").getAsString().equals(name)) return HexFormat.of().parseHex(v.get("hex").getAsString());
        }
        throw new AssertionError("no vector " + name);
    }

    /** One step of the peer's script, run on the accepted connection's fd. */
    interface Step { void run(int fd) throws Exception; }

    /** The peer reads exactly the vector's bytes. */
    static Step expect(String name) {
        return fd -> {
            byte[] want = vector(name);
            byte[] got = new byte[want.length];
            int off = 0;
            while (off < got.length) {
                Native.Received r = Native.recv(fd, got, off, got.length - off);
                if (r.n() == 0) throw new IOException("client closed before " + name);
                if (r.n() < 0) Native.poll(fd, Native.POLLIN, -1);
                else off += r.n();
            }
            assertEquals(HexFormat.of().formatHex(want), HexFormat.of().formatHex(got), "the client's " + name);
        };
    }

    /** The peer writes the vector's bytes one at a time, the fds with the first one. */
    static Step answer(String name, int... fds) {
        return answer(name, Integer.MAX_VALUE, null, fds);
    }

    /** ... waiting for {@code go} after {@code before} bytes. */
    static Step answer(String name, int before, CountDownLatch go, int... fds) {
        return fd -> {
            byte[] b = vector(name);
            for (int i = 0; i < b.length; i++) {
                if (i == before) go.await();
                while (Native.send(fd, b, i, 1, i == 0 ? fds : null) <= 0) Native.poll(fd, Native.POLLOUT, -1);
            }
        };
    }

    /** Set by a step that closed the peer's end itself. */
    volatile boolean hungUp;

    void peer(Step... steps) throws Exception {
        listenFd = Native.listen(sock.toString(), 8);
        peer = Thread.ofPlatform().daemon().name("scripted-peer").start(() -> {
            try {
                Native.poll(listenFd, Native.POLLIN, -1);
                int fd = Native.accept(listenFd);
                for (Step s : steps) s.run(fd);
                if (!hungUp) Native.close(fd);
            } catch (Throwable t) {
                peerErrors.add(t);
            }
        });
    }

    static long deadline() { return System.nanoTime() + TimeUnit.SECONDS.toNanos(30); }

    @Test
    void helloAndACallOnTheWireAreTheVectorsAndFdsArriveWithTheAnswer() throws Exception {
        Path slot = Files.writeString(dir.resolve("slot"), "");
        int slotFd = Native.open(slot.toString(), Native.O_RDONLY | Native.O_CLOEXEC, 0);
        peer(expect("hello"), answer("hello_ok_v2"), expect("acquire"), answer("acquire_ok_self", slotFd));

        Connection c = transport.borrow(deadline(), true);
        assertEquals(Protocol.decodeFrame(vector("hello_ok_v2")).message(), transport.lastHello());
        assertSame(transport.lastHello(), c.hello);
        assertFalse(c.agentPlaces);

        c.nextRequest = 7; // the vector's request id
        var acq = (Protocol.Acquire) Protocol.decodeFrame(vector("acquire")).message();
        Transport.Reply r = transport.call(c, acq, deadline());
        assertEquals(Protocol.decodeFrame(vector("acquire_ok_self")).message(), r.message());
        assertEquals(1, r.fds().length);
        assertEquals(slot.toRealPath(), Files.readSymbolicLink(Path.of("/proc/self/fd/" + r.fds()[0])));
        Native.close(r.fds()[0]);
        Native.close(slotFd);
        transport.giveBack(c);
        assertSame(c, transport.borrow(deadline(), true), "an idle connection is reused");
        assertEquals(1, counters.get("connect.ok"));
    }

    @Test
    void anAnswerToAnotherRequestIsAProtocolError() throws Exception {
        peer(expect("hello"), answer("hello_ok_v2"), expect("release_no_reply"), answer("release_ok"));
        Connection c = transport.borrow(deadline(), true);
        c.nextRequest = 16; // the vector's request id; the peer answers request 12
        var rel = (Protocol.Release) Protocol.decodeFrame(vector("release_no_reply")).message();
        Protocol.ProtocolException e = assertThrows(Protocol.ProtocolException.class, () -> transport.call(c, rel, deadline()));
        assertEquals(Protocol.E_BAD_REQUEST, e.code());
        assertTrue(e.getMessage().endsWith("answer to request 12, expected 16"), e.getMessage());
    }

    @Test
    void aCallThatTimesOutMidAnswerIsFinishedByTheNextReader() throws Exception {
        CountDownLatch go = new CountDownLatch(1);
        peer(expect("hello"), answer("hello_ok_v2"), expect("release"), answer("release_ok", 5, go));
        Connection c = transport.borrow(deadline(), true);
        c.nextRequest = 12;
        var rel = (Protocol.Release) Protocol.decodeFrame(vector("release")).message();
        // the peer holds back the rest of the answer until go: the call can only time out
        assertThrows(TimeoutException.class, () -> transport.call(c, rel, System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(20)));
        go.countDown();
        Transport.Reply r = transport.finish(c, deadline());
        assertEquals(Protocol.decodeFrame(vector("release_ok")), r.frame());
    }

    @Test
    void anAgentThatHangsUpKillsItsIdleConnectionAndTheListenerHears() throws Exception {
        CountDownLatch gone = new CountDownLatch(1);
        peer(expect("hello"), answer("hello_ok_v2"), fd -> { hungUp = true; Native.close(fd); gone.countDown(); });
        Connection c = transport.borrow(deadline(), true);
        transport.giveBack(c);
        gone.await();
        transport.reapDead();
        assertEquals(List.of(c), lost);
        assertFalse(transport.isAlive(c));
        assertEquals(1, counters.get("connection.lost"));
    }

    @Test
    void aFailedConnectBacksOffUnlessAskedNotTo() {
        // nobody listens on sock
        assertThrows(IOException.class, () -> transport.borrow(deadline(), false));
        assertThrows(IOException.class, () -> transport.borrow(deadline(), true));
        assertEquals(2, counters.get("connect.failed"), "warm-up's failed connect did not back off");
        IOException e = assertThrows(IOException.class, () -> transport.borrow(deadline(), true));
        assertEquals("agent unreachable (backing off)", e.getMessage());
        assertEquals(1, counters.get("connect.backoff"));
        assertEquals(2, counters.get("connect.failed"), "no connect attempt while backing off");
    }

    @Test
    void afterCloseBorrowsFail() throws Exception {
        peer(expect("hello"), answer("hello_ok_v2"));
        Connection c = transport.borrow(deadline(), true);
        transport.close();
        assertFalse(transport.isAlive(c));
        assertEquals("client closed", assertThrows(IOException.class, () -> transport.borrow(deadline(), true)).getMessage());
    }
}
