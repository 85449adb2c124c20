package dev.cpuslot.slot;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;

import static dev.cpuslot.slot.NativeLink.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;
import static java.lang.foreign.ValueLayout.JAVA_SHORT;

/**
 * The few libc calls the slot protocol needs, through the Foreign Function &amp; Memory API
 * (no JNI). Linux only (x86_64 and aarch64, LP64). Sockets are non-blocking; callers wait with
 * {@link #poll}. Public so that tests and embedders can build a fake agent on the same calls.
 *
 * <p>Calls interrupted by a signal (EINTR) are retried here: recvmsg, sendmsg, write and pread
 * at once, poll with the time that is left. Native memory for the per-invocation calls (send,
 * recv, poll, write, pread) comes from a per-thread scratch area, so the hot path allocates
 * nothing natively.
 */
public final class Native extends NativeFiles {
    private Native() {}

    public static final int AF_UNIX = 1;
    public static final int SOCK_STREAM = 1;
    public static final int SOCK_NONBLOCK = 0x800;
    public static final int SOCK_CLOEXEC = 0x80000;
    public static final int SOL_SOCKET = 1;
    public static final int SCM_RIGHTS = 1;
    public static final int MSG_NOSIGNAL = 0x4000;
    public static final int MSG_CTRUNC = 0x8;
    public static final int MSG_CMSG_CLOEXEC = 0x40000000;
    public static final short POLLIN = 0x1, POLLOUT = 0x4, POLLERR = 0x8, POLLHUP = 0x10, POLLNVAL = 0x20;
    public static final int O_WRONLY = 1, O_RDONLY = 0, O_CREAT = 0x40, O_CLOEXEC = 0x80000, O_APPEND = 0x400;
    public static final int EINTR = 4, EAGAIN = 11, EINPROGRESS = 115, EBADF = 9, EISCONN = 106;

    private static final int SUN_PATH = 108;
    /** Most fds accepted in one message (a slot has at most 2). */
    public static final int MAX_FDS = 16;

    /**
     * Allocates the calling thread's native scratch area now (a few KB, once per thread), so that
     * its first slot call does not pay for it. Cheap when already done.
     */
    public static void prepareThread() {
        if (LOAD_ERROR == null) SCRATCH.get();
    }

    private static volatile boolean warmed;

    /**
     * Runs every downcall of the per-invocation path once (poll, sendmsg, recvmsg, write, pread,
     * close, gettid, strerror) on fd -1, which only returns EBADF: the first call of an FFM
     * downcall handle links and spins its invoker (milliseconds in a fresh JVM), which would
     * otherwise fall inside an invocation's acquire budget. Touches no real fd. Idempotent;
     * false when the native calls are unavailable.
     */
    public static boolean warmUp() {
        if (LOAD_ERROR != null) return false;
        if (warmed) return true;
        prepareThread();
        gettid();
        byte[] one = {'0'};
        try { poll(-1, POLLIN, 0); } catch (NativeException expected) { }
        try { send(-1, one, 0, 1, null); } catch (NativeException expected) { }
        try { recv(-1, new byte[4], 0, 4); } catch (NativeException expected) { }
        try { write(-1, one); } catch (NativeException expected) { }
        try { preadText(-1, 64); } catch (NativeException expected) { }
        try { pread(-1, new byte[1], 0, 1); } catch (NativeException expected) { }
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int r = (int) CLOSE.invokeExact(cs, -1);
        } catch (Throwable ignored) {
        }
        warmed = true;
        return true;
    }

    /** True when the native calls could be linked (Linux, native access enabled). */
    public static boolean available() { return LOAD_ERROR == null; }

    /** Why {@link #available()} is false, or null. */
    public static Throwable loadError() { return LOAD_ERROR; }

    /** A failed system call, with its errno. */
    public static final class NativeException extends java.io.IOException {
        private final int errno;
        public NativeException(String msg, int errno) { super(msg); this.errno = errno; }
        public int errno() { return errno; }
    }

    /** The calling thread's kernel thread id, in this process's PID namespace. */
    public static int gettid() {
        if (LOAD_ERROR != null) return -1;
        try {
            if (GETTID != null) return (int) GETTID.invokeExact();
            long nr = System.getProperty("os.arch").contains("aarch64") ? 178 : 186;
            return (int) (long) SYSCALL.invokeExact(nr);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    private static MemorySegment sockaddr(Arena a, String path) throws NativeException {
        byte[] p = path.getBytes(StandardCharsets.UTF_8);
        if (p.length >= SUN_PATH) throw new NativeException("socket path longer than 107 bytes: " + path, 0);
        MemorySegment sa = a.allocate(2 + SUN_PATH);
        sa.set(JAVA_SHORT, 0, (short) AF_UNIX);
        MemorySegment.copy(p, 0, sa, JAVA_BYTE, 2, p.length);
        return sa;
    }

    /** A non-blocking, close-on-exec AF_UNIX stream socket. */
    public static int socket() throws NativeException {
        return socket(AF_UNIX, SOCK_STREAM, 0);
    }

    /** A non-blocking, close-on-exec socket of any kind (the runtime's sock_diag lookups: AF_NETLINK). */
    public static int socket(int domain, int type, int protocol) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int fd = (int) SOCKET.invokeExact(cs, domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
            if (fd < 0) throw fail("socket", errno(cs));
            return fd;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /**
     * Connects a non-blocking socket; returns 0 when connected, or the errno (EAGAIN when the
     * listener's backlog is full, EINPROGRESS) for the caller to wait and retry. Throws on errors.
     */
    public static int connect(int fd, String path) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            MemorySegment sa = sockaddr(a, path);
            int r = (int) CONNECT.invokeExact(cs, fd, sa, (int) sa.byteSize());
            if (r == 0) return 0;
            int e = errno(cs);
            if (e == EISCONN) return 0; // a retry after EINTR/EINPROGRESS found it connected
            if (e == EAGAIN || e == EINPROGRESS || e == EINTR) return e;
            throw fail("connect " + path, e);
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** A listening socket bound to path (for fake agents in tests and tools). */
    public static int listen(String path, int backlog) throws NativeException {
        int fd = socket();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            MemorySegment sa = sockaddr(a, path);
            if ((int) BIND.invokeExact(cs, fd, sa, (int) sa.byteSize()) != 0) {
                int e = errno(cs);
                close(fd);
                throw fail("bind " + path, e);
            }
            if ((int) LISTEN.invokeExact(cs, fd, backlog) != 0) {
                int e = errno(cs);
                close(fd);
                throw fail("listen", e);
            }
            return fd;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** Accepts a connection; -1 when none is pending (EAGAIN). */
    public static int accept(int fd) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int c = (int) ACCEPT4.invokeExact(cs, fd, MemorySegment.NULL, MemorySegment.NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c >= 0) return c;
            int e = errno(cs);
            if (e == EAGAIN || e == EINTR) return -1;
            throw fail("accept", e);
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /**
     * Waits for events on one fd. Returns the revents (0 on timeout). timeoutMs -1 waits forever.
     * A signal (EINTR) restarts the wait with the time that is left.
     */
    public static int poll(int fd, short events, int timeoutMs) throws NativeException {
        check();
        Scratch s = SCRATCH.get();
        long end = timeoutMs > 0 ? System.nanoTime() + timeoutMs * 1_000_000L : 0;
        try {
            while (true) {
                MemorySegment pfd = s.pfd;
                pfd.set(JAVA_INT, 0, fd);
                pfd.set(JAVA_SHORT, 4, events);
                pfd.set(JAVA_SHORT, 6, (short) 0);
                int r = (int) POLL.invokeExact(s.cs, pfd, 1L, timeoutMs);
                if (r >= 0) return r == 0 ? 0 : pfd.get(JAVA_SHORT, 6) & 0xFFFF;
                int e = errno(s.cs);
                if (e != EINTR) throw fail("poll", e);
                if (timeoutMs > 0) {
                    long rem = end - System.nanoTime();
                    if (rem <= 0) return 0;
                    timeoutMs = (int) Math.max(1, (rem + 999_999) / 1_000_000);
                }
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /**
     * sendmsg with optional SCM_RIGHTS fds. Returns bytes sent, or -1 on EAGAIN. EINTR is retried.
     */
    public static long send(int fd, byte[] buf, int off, int len, int[] fds) throws NativeException {
        check();
        Scratch s = SCRATCH.get();
        try (Arena a = len > Scratch.BUF ? Arena.ofConfined() : null) {
            MemorySegment data = a == null ? s.buf : a.allocate(len);
            MemorySegment.copy(buf, off, data, JAVA_BYTE, 0, len);
            MemorySegment ctl = MemorySegment.NULL;
            long space = 0;
            if (fds != null && fds.length > 0) {
                if (fds.length > MAX_FDS) throw new NativeException("too many fds: " + fds.length, 0);
                long clen = CMSG_HDR + 4L * fds.length;
                space = (clen + 7) & ~7L;
                ctl = s.ctl;
                ctl.fill((byte) 0);
                ctl.set(JAVA_LONG, 0, clen);
                ctl.set(JAVA_INT, 8, SOL_SOCKET);
                ctl.set(JAVA_INT, 12, SCM_RIGHTS);
                for (int i = 0; i < fds.length; i++) ctl.set(JAVA_INT, CMSG_HDR + 4L * i, fds[i]);
            }
            while (true) {
                MemorySegment msg = msghdr(s, data, len, ctl, space);
                long n = (long) SENDMSG.invokeExact(s.cs, fd, msg, MSG_NOSIGNAL);
                if (n >= 0) return n;
                int e = errno(s.cs);
                if (e == EINTR) continue;
                if (e == EAGAIN) return -1;
                throw fail("sendmsg", e);
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** Result of one recvmsg: bytes read (0 = EOF, -1 = EAGAIN), fds received, control truncated. */
    public record Received(int n, int[] fds, boolean truncated) {}

    /** recvmsg of at most len bytes, collecting SCM_RIGHTS fds (close-on-exec). EINTR is retried. */
    public static Received recv(int fd, byte[] buf, int off, int len) throws NativeException {
        check();
        Scratch s = SCRATCH.get();
        try (Arena a = len > Scratch.BUF ? Arena.ofConfined() : null) {
            MemorySegment data = a == null ? s.buf : a.allocate(len);
            MemorySegment ctl = s.ctl;
            long space = ctl.byteSize();
            long n;
            MemorySegment msg;
            while (true) {
                msg = msghdr(s, data, len, ctl, space);
                n = (long) RECVMSG.invokeExact(s.cs, fd, msg, MSG_CMSG_CLOEXEC);
                if (n >= 0) break;
                int e = errno(s.cs);
                if (e == EINTR) continue;
                if (e == EAGAIN) return new Received(-1, new int[0], false);
                throw fail("recvmsg", e);
            }
            MemorySegment.copy(data, JAVA_BYTE, 0, buf, off, (int) n);
            int flags = msg.get(JAVA_INT, 48);
            long controllen = msg.get(JAVA_LONG, 40);
            int[] fds = new int[0];
            long p = 0;
            while (p + CMSG_HDR <= controllen) {
                long clen = ctl.get(JAVA_LONG, p);
                if (clen < CMSG_HDR || p + clen > controllen) break;
                int level = ctl.get(JAVA_INT, p + 8), type = ctl.get(JAVA_INT, p + 12);
                if (level == SOL_SOCKET && type == SCM_RIGHTS) {
                    int k = (int) ((clen - CMSG_HDR) / 4);
                    int[] more = new int[fds.length + k];
                    System.arraycopy(fds, 0, more, 0, fds.length);
                    for (int i = 0; i < k; i++) more[fds.length + i] = ctl.get(JAVA_INT, p + CMSG_HDR + 4L * i);
                    fds = more;
                }
                p += (clen + 7) & ~7L;
            }
            return new Received((int) n, fds, (flags & MSG_CTRUNC) != 0);
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** close(2), ignoring errors. */
    public static void close(int fd) {
        if (fd < 0 || LOAD_ERROR != null) return;
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int r = (int) CLOSE.invokeExact(cs, fd);
        } catch (Throwable ignored) {
        }
    }
}
