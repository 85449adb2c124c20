package dev.cpuslot.runtime.front;

import dev.cpuslot.slot.Native;

import java.io.IOException;
import java.net.Inet4Address;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * One TCP socket of this network namespace by its addresses, through the kernel's sock_diag
 * netlink lookup ({@code SOCK_DIAG_BY_FAMILY}, no dump): a hash lookup, where reading
 * {@code /proc/net/tcp} walks every socket of the node. Needs no privilege.
 */
public final class SockDiag {
    private SockDiag() {}

    private static final int AF_INET = 2, AF_INET6 = 10, AF_NETLINK = 16, SOCK_DGRAM = 2, NETLINK_SOCK_DIAG = 4;
    private static final short SOCK_DIAG_BY_FAMILY = 20, NLMSG_ERROR = 2, NLM_F_REQUEST = 1;
    private static final int ENOENT = 2, REQUEST = 72;

    /**
     * The inode of the socket whose own address is {@code self} and whose remote one is
     * {@code remote}: 0 when it has no descriptor (closed, in TIME_WAIT), -1 when there is none.
     */
    public static long inode(InetSocketAddress self, InetSocketAddress remote) throws IOException {
        InetAddress s = self.getAddress(), r = remote.getAddress();
        boolean v4 = s instanceof Inet4Address && r instanceof Inet4Address;
        ByteBuffer b = ByteBuffer.allocate(REQUEST).order(ByteOrder.nativeOrder());
        b.putInt(0, REQUEST).putShort(4, SOCK_DIAG_BY_FAMILY).putShort(6, NLM_F_REQUEST).putInt(8, 1).putInt(12, 0);
        // struct inet_diag_req_v2: family, protocol (TCP), no extensions, every state
        b.put(16, (byte) (v4 ? AF_INET : AF_INET6)).put(17, (byte) 6).putInt(20, -1);
        // struct inet_diag_sockid: ports and addresses in network order, any interface, no cookie
        b.order(ByteOrder.BIG_ENDIAN).putShort(24, (short) self.getPort()).putShort(26, (short) remote.getPort());
        b.put(28, v4 ? s.getAddress() : v6(s)).put(44, v4 ? r.getAddress() : v6(r));
        b.order(ByteOrder.nativeOrder()).putInt(60, 0).putInt(64, -1).putInt(68, -1);
        int fd = Native.socket(AF_NETLINK, SOCK_DGRAM, NETLINK_SOCK_DIAG);
        try {
            if (Native.send(fd, b.array(), 0, REQUEST, null) != REQUEST) throw new IOException("sock_diag: request not sent");
            byte[] in = new byte[4096];
            int n = Native.recv(fd, in, 0, in.length).n(); // the kernel answers within the send
            if (n < 20) throw new IOException("sock_diag: no answer (" + n + ")");
            ByteBuffer a = ByteBuffer.wrap(in, 0, n).order(ByteOrder.nativeOrder());
            short type = a.getShort(4);
            if (type == NLMSG_ERROR) {
                int err = -a.getInt(16);
                if (err == ENOENT) return -1;
                throw new IOException("sock_diag: errno " + err);
            }
            // struct inet_diag_msg after the header: its inode at 68
            if (type != SOCK_DIAG_BY_FAMILY || n < 16 + 72) throw new IOException("sock_diag: answer of type " + type);
            return a.getInt(16 + 68) & 0xffffffffL;
        } finally {
            Native.close(fd);
        }
    }

    private static byte[] v6(InetAddress a) {
        byte[] x = a.getAddress();
        if (x.length == 16) return x;
        byte[] m = new byte[16]; // IPv4-mapped
        m[10] = (byte) 0xff;
        m[11] = (byte) 0xff;
        System.arraycopy(x, 0, m, 12, 4);
        return m;
    }
}
