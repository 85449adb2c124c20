package dev.cpuslot.runtime;

import org.junit.jupiter.api.Test;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import dev.cpuslot.runtime.front.ControlGate;
import dev.cpuslot.runtime.front.SockDiag;

class SockDiagTest {
    /**
     * The netlink lookup finds a connection's socket by its addresses (its inode is the one this
     * process holds), finds none for addresses nobody uses, and ControlGate tells this process's
     * connection to the runtime's port apart by it (the conformance tests show another process's
     * being served).
     */
    @Test
    void aConnectionOfThisProcessIsFoundByItsAddresses() throws Exception {
        try (ServerSocket server = new ServerSocket(0, 8, InetAddress.getLoopbackAddress());
             Socket client = new Socket(InetAddress.getLoopbackAddress(), server.getLocalPort());
             Socket accepted = server.accept()) {
            InetSocketAddress peer = (InetSocketAddress) accepted.getRemoteSocketAddress();
            InetSocketAddress local = (InetSocketAddress) accepted.getLocalSocketAddress();
            long inode = SockDiag.inode(peer, local);
            assertTrue(inode > 0, "inode " + inode);
            assertTrue(socketInodes().contains(inode), "inode " + inode + " is none of this process's sockets: " + socketInodes());
            assertEquals(-1, SockDiag.inode(new InetSocketAddress(peer.getAddress(), 1), local), "a connection nobody has");
            assertTrue(ControlGate.fromThisProcess(peer, local), "this process's connection");
        }
    }

    private static List<Long> socketInodes() throws Exception {
        List<Long> l = new ArrayList<>();
        try (var fds = Files.newDirectoryStream(Path.of("/proc/self/fd"))) {
            for (Path fd : fds) {
                try {
                    String t = Files.readSymbolicLink(fd).toString();
                    if (t.startsWith("socket:[")) l.add(Long.parseLong(t.substring(8, t.length() - 1)));
                } catch (java.io.IOException closed) {
                }
            }
        }
        return l;
    }
}
