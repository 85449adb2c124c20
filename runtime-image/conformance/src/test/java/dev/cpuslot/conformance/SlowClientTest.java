package dev.cpuslot.conformance;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;

import static dev.cpuslot.conformance.ActionContainer.*;
import static dev.cpuslot.conformance.JavaContainmentTest.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * Issue 30: a client that sends its request slowly (a byte at a time, headers or body) holds one
 * of the HTTP front's threads only as long as the front's read limit
 * ({@code CPUSLOT_FRONT_READ_TIMEOUT}); then its connection is closed. Before, the JDK's server
 * read a request for as long as it took: as many slow clients as the cap and the reserve left the
 * front no thread for {@code /ready}, a 503 or a real request, for as long as they kept sending.
 */
@DisplayName("slow clients and the HTTP front")
class SlowClientTest {
    /** Longer than a healthy request takes to arrive here, short for the test. */
    private static final String LIMIT = "2s";
    private static final int CAP = 2, RESERVE = dev.cpuslot.runtime.front.HttpFront.RESERVE;

    @Test
    void slowClientsAreCutOffAtTheReadLimitAndTheFrontServesOn() throws Exception {
        String hello = probe(HeapPressureTest.HELLO);
        with("java", env("CPUSLOT_FRONT_MAX_REQUESTS", String.valueOf(CAP), "CPUSLOT_FRONT_READ_TIMEOUT", LIMIT), c -> {
            assertEquals(200, register(c, "hello", jarFile(c, "hello", hello), null).code());
            // more than the cap, the reserve and the cap's waiting room: half dribble their headers,
            // half a body (those past the cap are refused, and the front reads their body first)
            List<Dribbler> slow = new ArrayList<>();
            for (int i = 0; i < 2 * (CAP + RESERVE + CAP); i++) slow.add(new Dribbler(c.port(), i % 2 == 0));
            try {
                // each is cut off by the runtime; a minute is many read limits on a loaded machine,
                // and a dribbler keeps sending for ten
                long until = System.nanoTime() + 60_000_000_000L;
                while (slow.stream().anyMatch(d -> !d.cutOff()) && System.nanoTime() < until) Thread.sleep(100);
                long held = slow.stream().filter(d -> !d.cutOff()).count();
                assertEquals(0, held, held + " of " + slow.size() + " slow clients still held the front a minute after they began ("
                        + slow.stream().filter(d -> !d.cutOff()).mapToInt(Dribbler::sent).summaryStatistics() + " bytes sent each)");
                // their threads are free: the front answers its probe and serves (a request
                // waiting for a thread counts against the limit too, so none is sent while the
                // slow ones hold every thread)
                assertEquals(200, c.get("/ready").code(), "/ready");
                assertEquals(200, invoke(c, "hello").code(), "a real request after the slow ones");
            } finally {
                for (Dribbler d : slow) d.close();
            }
        });
    }

    /**
     * A client sending {@code POST /} a byte every 200 ms for at most ten minutes: its headers
     * (never ending them) or, after complete headers, a body it declared long. Cut off when the
     * runtime closes the connection.
     */
    private static final class Dribbler implements AutoCloseable {
        private final Socket s = new Socket();
        private final AtomicInteger sent = new AtomicInteger();
        private volatile boolean cutOff;
        private final Thread writer, reader;

        Dribbler(int port, boolean headers) throws IOException {
            s.connect(new InetSocketAddress("127.0.0.1", port), 10_000);
            String head = "POST / HTTP/1.1\r\nHost: runtime\r\nContent-Type: application/json\r\n";
            byte[] start = (headers ? head : head + "Content-Length: 100000\r\n\r\n{").getBytes(StandardCharsets.US_ASCII);
            OutputStream out = s.getOutputStream();
            InputStream in = s.getInputStream();
            writer = Thread.ofPlatform().daemon().name("dribbler-out").start(() -> {
                try {
                    out.write(start);
                    out.flush();
                    sent.addAndGet(start.length);
                    for (int i = 0; i < 3000 && !cutOff; i++) {
                        Thread.sleep(200);
                        out.write(headers ? 'X' : ' ');
                        out.flush();
                        sent.incrementAndGet();
                    }
                } catch (IOException e) {
                    cutOff = true; // the runtime closed it (a reset)
                } catch (InterruptedException e) {
                    // closed by the test
                }
            });
            reader = Thread.ofPlatform().daemon().name("dribbler-in").start(() -> {
                try {
                    // to the end of the stream or a reset: the runtime let the connection go (an
                    // answer alone does not, a refused request's body is read after it)
                    while (in.read() >= 0) {
                    }
                } catch (IOException e) {
                    // reset
                }
                cutOff = true;
            });
        }

        boolean cutOff() { return cutOff; }

        int sent() { return sent.get(); }

        @Override
        public void close() throws IOException, InterruptedException {
            cutOff = true;
            s.close();
            writer.interrupt();
            writer.join(10_000);
            reader.join(10_000);
        }
    }
}
