package dev.cpuslot.slot;

import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

/**
 * Not a test: bytes allocated, time and the thread's CPU time per warm local acquire + release on
 * one thread, with real preads of v1-style counter files and a fake agent; rounds alternate
 * between usage batching (the default) and a counter read at every release ({@code batchNs} 0,
 * as before batching), so both are measured side by side under the same load. Run after
 * {@code ./build.sh -DskipTests package}:
 * {@code java --enable-native-access=ALL-UNNAMED -cp slot-client/target/classes:slot-client/target/test-classes dev.cpuslot.slot.AllocProbe 200000}
 */
public class AllocProbe {
    static final long S = 1_000_000_000L;
    public static void main(String[] args) throws Exception {
        Counters counters = new Counters();
        FakeTransport transport = new FakeTransport();
        FdCache fds = new FdCache(FdCache.NATIVE, counters);
        Recovery recovery = new Recovery(transport, fds, counters, S, S, S);
        Leases leases = new Leases(transport, fds, recovery, counters, S, S, 0, false, true);
        transport.hello = new Protocol.HelloOk(1, 1, Protocol.HELLO_OK_LOCAL, 1, 2, "fake", 0, List.of());
        Path d = Files.createTempDirectory("alloc-probe");
        Files.writeString(d.resolve("tasks"), "");
        Files.writeString(d.resolve("cpu.stat"), "nr_periods 12345\nnr_throttled 12\nthrottled_time 123456789\nnr_bursts 0\nburst_time 0\n");
        Files.writeString(d.resolve("cpuacct.usage"), "98765432101\n");
        transport.script = m -> {
            if (m instanceof Protocol.Acquire a) {
                int[] f = {Native.open(d.resolve("tasks").toString(), Native.O_WRONLY, 0),
                        Native.open(d.resolve("cpu.stat").toString(), Native.O_RDONLY, 0),
                        Native.open(d.resolve("cpuacct.usage").toString(), Native.O_RDONLY, 0)};
                var ok = new Protocol.AcquireOk(7, 1, a.quotaMilli(), 100_000, Protocol.OUTCOME_CREATED, 0, Protocol.PLACE_SELF, 3);
                return new Transport.Reply(new Protocol.Frame(1, ok.type(), 1, ok), f);
            }
            return null;
        };
        SlotTable table = SlotTable.create(4);
        LocalLeases local = new LocalLeases(transport, fds, recovery, leases, counters, table, S, S, 300 * S, S, false);
        var mx = (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
        int n = Integer.parseInt(args.length > 0 ? args[0] : "200000");
        for (int round = 0; round < 10; round++) {
            boolean batched = round % 2 == 0;
            local.batchNs = batched ? LocalLeases.BATCH_NS : 0;
            long b0 = mx.getCurrentThreadAllocatedBytes(), c0 = mx.getCurrentThreadCpuTime();
            long a = 0, r = 0;
            for (int i = 0; i < n; i++) {
                String act = new String("/guest/hello".toCharArray()), inv = new String("b".toCharArray());
                long x = System.nanoTime();
                SlotLease l = local.acquire(1000, Leases.clip(act), Leases.clip(inv));
                long y = System.nanoTime();
                l.release(ReleaseOutcome.OK);
                r += System.nanoTime() - y;
                a += y - x;
                if ((i & 1023) == 0) local.reports().take(1000);
            }
            long b1 = mx.getCurrentThreadAllocatedBytes(), c1 = mx.getCurrentThreadCpuTime();
            // the two strings per iteration are the probe's own: 2 x (24 + 16 + len) bytes
            System.out.printf("round %d %s: %.0f bytes/op (incl. the probe's 2 strings), thread CPU %.0f ns/op, acquire %.0f ns, release %.0f ns%n",
                    round, batched ? "batched     " : "read always ", (b1 - b0) / (double) n, (c1 - c0) / (double) n, a / (double) n, r / (double) n);
        }
        System.out.println(counters.snapshot());
        try (var files = Files.list(d)) {
            for (Path f : (Iterable<Path>) files::iterator) Files.delete(f);
        }
        Files.delete(d);
    }
}
