package dev.cpuslot.runtime.front;

import dev.cpuslot.runtime.guard.FileAccess;

import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.NetworkInterface;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.List;

/**
 * Who may use the runtime's endpoints that act as the platform: the invocation endpoints
 * ({@code /init}, {@code /run}, {@code POST /} with a body: OpenWhisk's, Knative's, Hydra's invoke)
 * and the control endpoints ({@code /register}, {@code /deregister}, {@code /warmup}). Never a
 * connection this process made, since function code runs only in this process, and whatever it
 * connects to the port over loopback or the pod's own address comes from one of its own sockets
 * (the platform's callers are other processes: OpenWhisk's invoker on another host, Knative's
 * queue-proxy in another container of the pod, over loopback). And, with
 * {@code CPUSLOT_CONTROL_TOKEN_FILE}, a control request only with that file's token ({@value #HEADER}),
 * which no function can read (the guard refuses the file to Java functions, JavaScript and Python
 * have no file access), for a relay in the pod (Knative's queue-proxy forwards any path a function
 * sends it); the invocation endpoints take no token: the platforms send none, and what a relay
 * forwards to them is a client's call of the service, as through its public address. With
 * {@code CPUSLOT_CONTROL_ENDPOINTS=false} the control endpoints answer no one: where the platform
 * never uses them (Knative's and OpenWhisk's recipes), nothing behind a relay can either. Never
 * a request marked as a probe: queue-proxy forwards those outside its containerConcurrency bound.
 */
public final class ControlGate {
    static final String HEADER = "X-Cpuslot-Control-Token";
    private final byte[] token;
    private final boolean controlServed;
    /** False only for a runtime whose tests are its clients in the same process (Harness). */
    private final boolean refuseSelf;

    ControlGate(String tokenFile, boolean controlServed, boolean refuseSelf) {
        this.refuseSelf = refuseSelf;
        this.controlServed = controlServed;
        if (tokenFile == null) {
            token = null;
            return;
        }
        Path p = Path.of(tokenFile);
        try {
            String t = Files.readString(p, StandardCharsets.UTF_8).strip();
            if (t.isEmpty()) throw new IllegalArgumentException("CPUSLOT_CONTROL_TOKEN_FILE " + tokenFile + " is empty");
            token = t.getBytes(StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new IllegalArgumentException("CPUSLOT_CONTROL_TOKEN_FILE " + tokenFile + " cannot be read: " + e.getMessage(), e);
        }
        FileAccess.protect(p); // no Java function opens it
    }

    /**
     * Why a request is refused (403), or null: the one decision for every endpoint. Open to all:
     * {@code /ready}, {@code GET /} and an empty {@code POST /} (Knative's probes), unknown paths.
     */
    String refusal(String path, String method, int bodyLength, InetSocketAddress peer, InetSocketAddress local,
                   com.sun.net.httpserver.Headers headers) {
        boolean control = path.equals("/register") || path.equals("/deregister") || path.equals("/warmup");
        boolean invocation = path.equals("/init") || path.equals("/run")
                || path.equals("/") && !method.equals("GET") && bodyLength > 0;
        if (!control && !invocation) return null;
        if (markedAsProbe(headers)) return path + " does not answer a request marked as a probe (K-Kubelet-Probe, K-Network-Probe, kube-probe/)";
        if (control && !controlServed) return "this runtime serves no control endpoints (CPUSLOT_CONTROL_ENDPOINTS=false)";
        String presented = headers.getFirst(HEADER);
        if (control && token != null && (presented == null
                || !MessageDigest.isEqual(token, presented.strip().getBytes(StandardCharsets.UTF_8)))) {
            return "the control endpoints need the runtime's control token (" + HEADER + ")";
        }
        if (!refuseSelf) return null;
        try {
            if (fromThisProcess(peer, local)) return path + " does not answer connections of the runtime's own process";
        } catch (IOException | RuntimeException e) {
            return "whose connection this is cannot be told: " + e.getMessage();
        }
        return null;
    }

    /**
     * Whether a request is marked as a probe: Knative's queue-proxy forwards one with
     * {@code K-Kubelet-Probe} (or a {@code kube-probe/} User-Agent) outside its containerConcurrency
     * breaker, from any peer, so such a request may only probe; probes never invoke.
     */
    private static boolean markedAsProbe(com.sun.net.httpserver.Headers h) {
        String ua = h.getFirst("User-Agent");
        return h.containsKey("K-Kubelet-Probe") || h.containsKey("K-Network-Probe") || ua != null && ua.startsWith("kube-probe/");
    }

    /**
     * Whether the peer's socket is one of this process's descriptors, or cannot be told apart from
     * one: a peer with a local address whose socket the kernel no longer has, or has without a
     * descriptor (closed, reset, or behind a NAT that loops back into the pod), is refused too.
     */
    public static boolean fromThisProcess(InetSocketAddress peer, InetSocketAddress local) throws IOException {
        InetAddress a = peer.getAddress();
        if (a == null || !(a.isLoopbackAddress() || a.isAnyLocalAddress() || NetworkInterface.getByInetAddress(a) != null)) {
            return false; // another host's: not this process
        }
        long inode;
        try {
            inode = SockDiag.inode(peer, local);
        } catch (IOException | RuntimeException | LinkageError noNetlink) {
            inode = tableInode(peer, local.getPort());
        }
        if (inode <= 0) return true; // gone, or no descriptor: whose it was cannot be told
        Long seen = FOREIGN.get(inode);
        if (seen != null && System.nanoTime() - seen < FOREIGN_NANOS) return false; // a kept-alive platform connection
        try (DirectoryStream<Path> fds = Files.newDirectoryStream(Path.of("/proc/self/fd"))) {
            String want = "socket:[" + inode + "]";
            for (Path fd : fds) {
                try {
                    if (Files.readSymbolicLink(fd).toString().equals(want)) return true;
                } catch (IOException closed) {
                }
            }
        }
        if (FOREIGN.size() >= 1024) FOREIGN.clear();
        FOREIGN.put(inode, System.nanoTime());
        return false;
    }

    /**
     * Sockets found to be another process's, by inode, for a minute: a socket's inode names it
     * while it lives and is not reused for billions of sockets after, and this process receives
     * no TCP socket from another (function code cannot receive descriptors), so one that is not
     * ours stays not ours. The descriptor scan is paid once per platform connection, not per request.
     */
    private static final java.util.concurrent.ConcurrentHashMap<Long, Long> FOREIGN = new java.util.concurrent.ConcurrentHashMap<>();
    private static final long FOREIGN_NANOS = 60_000_000_000L;

    /**
     * The peer socket's inode from the network namespace's tables (where netlink is not
     * available): its line has the peer's port as its own and the runtime's as its remote one;
     * 0 without a descriptor, -1 when there is none. Reading the tables walks the kernel's whole
     * socket hash (milliseconds on a busy node), hence {@link SockDiag} first.
     */
    private static long tableInode(InetSocketAddress peer, int localPort) throws IOException {
        long found = -1;
        for (String table : List.of("/proc/self/net/tcp", "/proc/self/net/tcp6")) {
            List<String> lines;
            try {
                lines = Files.readAllLines(Path.of(table));
            } catch (java.nio.file.NoSuchFileException e) {
                continue; // no IPv6
            }
            for (String line : lines) {
                String[] f = line.trim().split("\\s+");
                if (f.length < 10 || f[0].equals("sl")) continue;
                if (port(f[1]) == peer.getPort() && port(f[2]) == localPort) {
                    long i = Long.parseLong(f[9]);
                    if (i == 0) return 0;
                    found = i;
                }
            }
        }
        return found;
    }

    /** The port of an address in /proc/net/tcp's form ({@code 0100007F:1F90}). */
    private static int port(String hexAddress) {
        return Integer.parseInt(hexAddress.substring(hexAddress.indexOf(':') + 1), 16);
    }
}
