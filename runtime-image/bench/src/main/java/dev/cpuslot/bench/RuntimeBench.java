package dev.cpuslot.bench;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

/**
 * Closed-loop HTTP/1.1 benchmark of runtime targets, side by side in one run. Each client thread
 * keeps one keep-alive connection and sends the same POST back to back; rounds alternate between
 * the targets (and their order) so that machine noise hits all of them alike. Prints latency
 * percentiles, throughput, the ratio of every target to the last one (the baseline), and what
 * the runtime said about slots (X-Cpuslot-Outcome / X-Cpuslot-Noslot response headers).
 *
 * <pre>
 * java -jar bench.jar --threads 1,4 --requests 2000 --rounds 6 --warmup 3000 \
 *   --target "with slots"  http://127.0.0.1:18080/run '{"value":{"name":"bench"}}' \
 *   --target "no cgroups"  http://127.0.0.1:18081/run '{"value":{"name":"bench"}}'
 * </pre>
 */
public final class RuntimeBench {
    record Target(String label, URI uri, byte[] body) {}

    /** What one target gathered over all rounds of one thread count. */
    static final class Result {
        final Target target;
        final List<long[]> latencies = new ArrayList<>();
        long requests, nanos;
        final Map<String, LongAdder> slot = new ConcurrentHashMap<>();
        final AtomicLong errors = new AtomicLong();
        volatile String firstError;
        Result(Target t) { this.target = t; }

        long[] sorted() {
            int n = 0;
            for (long[] a : latencies) n += a.length;
            long[] all = new long[n];
            int i = 0;
            for (long[] a : latencies) {
                System.arraycopy(a, 0, all, i, a.length);
                i += a.length;
            }
            Arrays.sort(all);
            return all;
        }

        double throughput() { return nanos == 0 ? 0 : requests * 1e9 / nanos; }
    }

    static long pct(long[] sorted, double q) {
        if (sorted.length == 0) return 0;
        int i = (int) Math.ceil(q * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(sorted.length - 1, i))];
    }

    public static void main(String[] args) throws Exception {
        List<Target> targets = new ArrayList<>();
        int[] threads = {1};
        int requests = 2000, rounds = 6, warmup = 3000;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--target" -> {
                    targets.add(new Target(args[i + 1], URI.create(args[i + 2]), args[i + 3].getBytes(StandardCharsets.UTF_8)));
                    i += 3;
                }
                case "--threads" -> threads = Arrays.stream(args[++i].split(",")).mapToInt(Integer::parseInt).toArray();
                case "--requests" -> requests = Integer.parseInt(args[++i]);
                case "--rounds" -> rounds = Integer.parseInt(args[++i]);
                case "--warmup" -> warmup = Integer.parseInt(args[++i]);
                case "-h", "--help" -> {
                    usage();
                    return;
                }
                default -> {
                    System.err.println("unknown argument " + args[i]);
                    usage();
                    System.exit(2);
                }
            }
        }
        if (targets.isEmpty()) {
            usage();
            System.exit(2);
        }
        System.out.printf(Locale.ROOT, "closed loop, keep-alive; %d rounds x %d requests per client thread per target, "
                + "targets alternate every round; %d warm-up requests per target first%n", rounds, requests, warmup);
        boolean failed = false;
        for (int c : threads) {
            List<Result> results = new ArrayList<>();
            for (Target t : targets) results.add(new Result(t));
            for (Result r : results) run(r, c, Math.max(1, warmup / c), false);
            for (int round = 0; round < rounds; round++) {
                List<Result> order = new ArrayList<>(results);
                if (round % 2 == 1) java.util.Collections.reverse(order);
                for (Result r : order) run(r, c, requests, true);
            }
            failed |= print(c, results);
        }
        if (failed) System.exit(1);
    }

    static void usage() {
        System.err.println("usage: java -jar bench.jar [--threads 1,4] [--requests N] [--rounds R] [--warmup W] "
                + "--target LABEL URL BODY [--target LABEL URL BODY ...]   (the last target is the baseline of the ratios)");
    }

    /** c client threads, n requests each; records latencies when measure. */
    static void run(Result r, int c, int n, boolean measure) throws Exception {
        long[][] lat = new long[c][n];
        CountDownLatch ready = new CountDownLatch(c), go = new CountDownLatch(1), done = new CountDownLatch(c);
        List<Thread> ts = new ArrayList<>();
        for (int k = 0; k < c; k++) {
            long[] mine = lat[k];
            ts.add(Thread.ofPlatform().name("bench-" + k).start(() -> {
                try (Client cl = new Client(r.target)) {
                    cl.call(r, false); // connect outside the measurement
                    ready.countDown();
                    go.await();
                    for (int i = 0; i < n; i++) {
                        long t0 = System.nanoTime();
                        cl.call(r, measure);
                        mine[i] = System.nanoTime() - t0;
                    }
                } catch (Exception e) {
                    r.errors.incrementAndGet();
                    if (r.firstError == null) r.firstError = e.toString();
                    ready.countDown();
                } finally {
                    done.countDown();
                }
            }));
        }
        ready.await();
        long t0 = System.nanoTime();
        go.countDown();
        done.await();
        long wall = System.nanoTime() - t0;
        if (measure) {
            for (long[] a : lat) r.latencies.add(a);
            r.requests += (long) c * n;
            r.nanos += wall;
        }
    }

    static boolean print(int c, List<Result> results) {
        System.out.printf(Locale.ROOT, "%nclient threads = %d%n", c);
        System.out.println("| target | requests | p50 | p90 | p99 | throughput | slots (runtime's X-Cpuslot headers) |");
        System.out.println("|---|---|---|---|---|---|---|");
        boolean failed = false;
        List<long[]> sorted = new ArrayList<>();
        for (Result r : results) {
            long[] s = r.sorted();
            sorted.add(s);
            Map<String, Long> slot = new TreeMap<>();
            r.slot.forEach((k, v) -> slot.put(k, v.sum()));
            long total = slot.values().stream().mapToLong(Long::longValue).sum();
            StringBuilder sb = new StringBuilder();
            slot.forEach((k, v) -> sb.append(sb.isEmpty() ? "" : ", ").append(k).append(' ')
                    .append(String.format(Locale.ROOT, "%.1f%%", 100.0 * v / Math.max(1, total))));
            System.out.printf(Locale.ROOT, "| %s | %d | %s | %s | %s | %.0f req/s | %s |%n", r.target.label(), s.length,
                    us(pct(s, .5)), us(pct(s, .9)), us(pct(s, .99)), r.throughput(), sb);
            if (r.errors.get() > 0) {
                System.out.println("  " + r.target.label() + ": " + r.errors.get() + " failed requests, first: " + r.firstError);
                failed = true;
            }
        }
        Result base = results.get(results.size() - 1);
        long[] b = sorted.get(sorted.size() - 1);
        for (int i = 0; i < results.size() - 1; i++) {
            long[] s = sorted.get(i);
            System.out.printf(Locale.ROOT, "ratio %s / %s: p50 %.3f  p90 %.3f  p99 %.3f  throughput %.3f%n",
                    results.get(i).target.label(), base.target.label(), ratio(pct(s, .5), pct(b, .5)),
                    ratio(pct(s, .9), pct(b, .9)), ratio(pct(s, .99), pct(b, .99)), results.get(i).throughput() / base.throughput());
        }
        return failed;
    }

    static double ratio(long a, long b) { return b == 0 ? Double.NaN : (double) a / b; }

    static String us(long ns) { return String.format(Locale.ROOT, "%.1f us", ns / 1e3); }

    /** One keep-alive HTTP/1.1 connection. */
    static final class Client implements Closeable {
        final Target t;
        final byte[] request;
        Socket s;
        InputStream in;
        OutputStream out;

        Client(Target t) {
            this.t = t;
            String path = t.uri().getRawPath() == null || t.uri().getRawPath().isEmpty() ? "/" : t.uri().getRawPath();
            if (t.uri().getRawQuery() != null) path += "?" + t.uri().getRawQuery();
            String head = "POST " + path + " HTTP/1.1\r\nHost: " + t.uri().getHost() + ":" + t.uri().getPort()
                    + "\r\nContent-Type: application/json\r\nContent-Length: " + t.body().length + "\r\n\r\n";
            byte[] h = head.getBytes(StandardCharsets.US_ASCII);
            request = Arrays.copyOf(h, h.length + t.body().length);
            System.arraycopy(t.body(), 0, request, h.length, t.body().length);
        }

        void connect() throws IOException {
            close();
            s = new Socket();
            s.setTcpNoDelay(true);
            s.connect(new InetSocketAddress(t.uri().getHost(), t.uri().getPort()), 5000);
            s.setSoTimeout(120_000);
            in = new BufferedInputStream(s.getInputStream(), 16384);
            out = s.getOutputStream();
        }

        void call(Result r, boolean count) throws IOException {
            for (int attempt = 0; ; attempt++) {
                if (s == null) connect();
                try {
                    out.write(request);
                    out.flush();
                    readResponse(r, count);
                    return;
                } catch (EOFException | java.net.SocketException e) {
                    if (attempt > 0) throw e;
                    connect(); // the server closed an idle keep-alive connection
                }
            }
        }

        private void readResponse(Result r, boolean count) throws IOException {
            String status = line();
            if (status == null) throw new EOFException("connection closed");
            int code = Integer.parseInt(status.split(" ")[1]);
            long len = -1;
            boolean close = false;
            String outcome = null, noslot = null;
            boolean reused = false;
            for (String l; (l = line()) != null && !l.isEmpty(); ) {
                int i = l.indexOf(':');
                if (i < 0) continue;
                String k = l.substring(0, i).trim().toLowerCase(Locale.ROOT), v = l.substring(i + 1).trim();
                switch (k) {
                    case "content-length" -> len = Long.parseLong(v);
                    case "connection" -> close = v.equalsIgnoreCase("close");
                    case "x-cpuslot-outcome" -> outcome = v;
                    case "x-cpuslot-noslot" -> noslot = v;
                    case "x-cpuslot-reused" -> reused = v.equalsIgnoreCase("true");
                    default -> { }
                }
            }
            if (len < 0) throw new IOException("no Content-Length");
            byte[] body = in.readNBytes((int) len);
            if (body.length != len) throw new EOFException("short body");
            if (code != 200) throw new IOException("HTTP " + code + ": " + new String(body, StandardCharsets.UTF_8));
            if (count) {
                String key = reused ? "reused (lingering)" : outcome != null ? outcome : noslot != null ? "noslot " + noslot : "no slot asked";
                r.slot.computeIfAbsent(key, x -> new LongAdder()).increment();
            }
            if (close) {
                s.close();
                s = null;
            }
        }

        private String line() throws IOException {
            StringBuilder sb = new StringBuilder(64);
            int b;
            while ((b = in.read()) >= 0) {
                if (b == '\n') {
                    int n = sb.length();
                    if (n > 0 && sb.charAt(n - 1) == '\r') sb.setLength(n - 1);
                    return sb.toString();
                }
                sb.append((char) b);
            }
            return sb.isEmpty() ? null : sb.toString();
        }

        @Override
        public void close() throws IOException {
            if (s != null) s.close();
            s = null;
        }
    }
}
