package dev.cpuslot.slot;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;
import java.nio.charset.StandardCharsets;
import java.util.Optional;

import static java.lang.foreign.ValueLayout.ADDRESS;
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
public final class Native {
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
    private static final int MSGHDR_SIZE = 56;
    private static final int CMSG_HDR = 16;
    /** Most fds accepted in one message (a slot has at most 2). */
    public static final int MAX_FDS = 16;

    private static final Linker LINKER = Linker.nativeLinker();
    private static final StructLayout CAPTURE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO = CAPTURE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    private static final Linker.Option CCS = Linker.Option.captureCallState("errno");

    private static final Throwable LOAD_ERROR;
    private static final MethodHandle SOCKET, CONNECT, BIND, LISTEN, ACCEPT4, SENDMSG, RECVMSG, POLL, WRITE, CLOSE,
            OPEN, GETTID, SYSCALL, STRERROR, PREAD, MEMFD_CREATE, FTRUNCATE, FCNTL, MMAP, KILL;

    static {
        MethodHandle socket = null, connect = null, bind = null, listen = null, accept4 = null, sendmsg = null,
                recvmsg = null, poll = null, write = null, close = null, open = null, gettid = null, syscall = null,
                strerror = null, pread = null, memfd = null, ftruncate = null, fcntl = null, mmap = null, kill = null;
        Throwable err = null;
        try {
            if (!System.getProperty("os.name", "").toLowerCase().contains("linux"))
                throw new UnsupportedOperationException("the slot protocol needs Linux");
            SymbolLookup libc = LINKER.defaultLookup();
            socket = h(libc, "socket", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), CCS);
            connect = h(libc, "connect", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), CCS);
            bind = h(libc, "bind", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, JAVA_INT), CCS);
            listen = h(libc, "listen", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT), CCS);
            accept4 = h(libc, "accept4", FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS, ADDRESS, JAVA_INT), CCS);
            sendmsg = h(libc, "sendmsg", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), CCS);
            recvmsg = h(libc, "recvmsg", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_INT), CCS);
            poll = h(libc, "poll", FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT), CCS);
            write = h(libc, "write", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG), CCS);
            close = h(libc, "close", FunctionDescriptor.of(JAVA_INT, JAVA_INT), CCS);
            open = h(libc, "open", FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT, JAVA_INT), CCS,
                    Linker.Option.firstVariadicArg(2));
            strerror = h(libc, "strerror", FunctionDescriptor.of(ADDRESS, JAVA_INT));
            pread = h(libc, "pread", FunctionDescriptor.of(JAVA_LONG, JAVA_INT, ADDRESS, JAVA_LONG, JAVA_LONG), CCS);
            memfd = h(libc, "memfd_create", FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_INT), CCS);
            ftruncate = h(libc, "ftruncate", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_LONG), CCS);
            fcntl = h(libc, "fcntl", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), CCS,
                    Linker.Option.firstVariadicArg(2));
            mmap = h(libc, "mmap", FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT, JAVA_INT, JAVA_INT, JAVA_LONG), CCS);
            kill = h(libc, "kill", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT), CCS);
            Optional<MemorySegment> gt = libc.find("gettid");
            if (gt.isPresent()) {
                gettid = LINKER.downcallHandle(gt.get(), FunctionDescriptor.of(JAVA_INT));
            } else {
                syscall = h(libc, "syscall", FunctionDescriptor.of(JAVA_LONG, JAVA_LONG), Linker.Option.firstVariadicArg(1));
            }
        } catch (Throwable t) {
            err = t;
        }
        SOCKET = socket; CONNECT = connect; BIND = bind; LISTEN = listen; ACCEPT4 = accept4; SENDMSG = sendmsg;
        RECVMSG = recvmsg; POLL = poll; WRITE = write; CLOSE = close; OPEN = open; GETTID = gettid; SYSCALL = syscall;
        STRERROR = strerror;
        PREAD = pread;
        MEMFD_CREATE = memfd; FTRUNCATE = ftruncate; FCNTL = fcntl; MMAP = mmap; KILL = kill;
        LOAD_ERROR = err;
    }

    /** Native memory reused by one thread's calls (never shared: a ThreadLocal). */
    private static final class Scratch {
        static final int BUF = 4096;
        final Arena arena = Arena.ofAuto();
        final MemorySegment cs = arena.allocate(CAPTURE);
        final MemorySegment buf = arena.allocate(BUF, 8);
        final MemorySegment iov = arena.allocate(16, 8);
        final MemorySegment msg = arena.allocate(MSGHDR_SIZE, 8);
        final MemorySegment ctl = arena.allocate(CMSG_HDR + 4L * MAX_FDS, 8);
        final MemorySegment pfd = arena.allocate(8, 4);
    }

    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

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

    /** A msghdr with one iovec over data[0..len) and the given control buffer (may be NULL). */
    private static MemorySegment msghdr(Scratch s, MemorySegment data, long len, MemorySegment ctl, long ctlLen) {
        s.iov.set(ADDRESS, 0, data);
        s.iov.set(JAVA_LONG, 8, len);
        MemorySegment m = s.msg;
        m.set(ADDRESS, 0, MemorySegment.NULL);   // msg_name
        m.set(JAVA_INT, 8, 0);                   // msg_namelen
        m.set(ADDRESS, 16, s.iov);               // msg_iov
        m.set(JAVA_LONG, 24, 1L);                // msg_iovlen
        m.set(ADDRESS, 32, ctl);                 // msg_control
        m.set(JAVA_LONG, 40, ctlLen);            // msg_controllen
        m.set(JAVA_INT, 48, 0);                  // msg_flags
        return m;
    }

    private static MethodHandle h(SymbolLookup l, String name, FunctionDescriptor d, Linker.Option... o) {
        MemorySegment s = l.find(name).orElseThrow(() -> new UnsatisfiedLinkError("libc has no " + name));
        return LINKER.downcallHandle(s, d, o);
    }

    /** True when the native calls could be linked (Linux, native access enabled). */
    public static boolean available() { return LOAD_ERROR == null; }

    /** Why {@link #available()} is false, or null. */
    public static Throwable loadError() { return LOAD_ERROR; }

    private static void check() throws NativeException {
        if (LOAD_ERROR != null) throw new NativeException("native calls unavailable: " + LOAD_ERROR, 0);
    }

    /** A failed system call, with its errno. */
    public static final class NativeException extends java.io.IOException {
        private final int errno;
        public NativeException(String msg, int errno) { super(msg); this.errno = errno; }
        public int errno() { return errno; }
    }

    private static int errno(MemorySegment cs) { return (int) ERRNO.get(cs, 0L); }

    private static NativeException fail(String call, int errno) {
        String s = "errno " + errno;
        try {
            MemorySegment p = (MemorySegment) STRERROR.invokeExact(errno);
            s = p.reinterpret(256).getString(0);
        } catch (Throwable ignored) {
        }
        return new NativeException(call + ": " + s, errno);
    }

    private static RuntimeException rethrow(Throwable t) {
        if (t instanceof RuntimeException r) return r;
        if (t instanceof Error e) throw e;
        return new IllegalStateException(t);
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

    /** write(2) of the given bytes; returns the count written. EINTR is retried. */
    public static long write(int fd, byte[] b) throws NativeException {
        check();
        Scratch s = SCRATCH.get();
        try (Arena a = b.length > Scratch.BUF ? Arena.ofConfined() : null) {
            MemorySegment data = a == null ? s.buf : a.allocate(b.length);
            MemorySegment.copy(b, 0, data, JAVA_BYTE, 0, b.length);
            while (true) {
                long n = (long) WRITE.invokeExact(s.cs, fd, data, (long) b.length);
                if (n >= 0) return n;
                int e = errno(s.cs);
                if (e != EINTR) throw fail("write", e);
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /**
     * pread(2) at offset 0 of up to max bytes (at most 4096), as text. Reading a cgroup file
     * this way renders it afresh each time. EINTR is retried.
     */
    public static String preadText(int fd, int max) throws NativeException {
        byte[] b = new byte[Math.max(0, Math.min(max, Scratch.BUF))];
        int n = pread(fd, b, 0, b.length);
        return new String(b, 0, n, StandardCharsets.US_ASCII);
    }

    /**
     * pread(2) at offset 0 of up to max bytes into dst[off..]; returns the bytes read. As
     * {@link #preadText} without a String per call: the per-invocation counter reads use it.
     */
    public static int pread(int fd, byte[] dst, int off, int max) throws NativeException {
        check();
        Scratch s = SCRATCH.get();
        int len = Math.min(Math.min(max, Scratch.BUF), dst.length - off);
        try {
            while (true) {
                long n = (long) PREAD.invokeExact(s.cs, fd, s.buf, (long) len, 0L);
                if (n >= 0) {
                    MemorySegment.copy(s.buf, JAVA_BYTE, 0, dst, off, (int) n);
                    return (int) n;
                }
                int e = errno(s.cs);
                if (e != EINTR) throw fail("pread", e);
            }
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /**
     * True when no thread has id {@code tid} in this PID namespace: kill(tid, 0) fails with ESRCH.
     * A live thread of any process (EPERM included) is not gone.
     */
    public static boolean threadGone(int tid) {
        if (LOAD_ERROR != null) return false;
        try {
            MemorySegment cs = SCRATCH.get().cs;
            if ((int) KILL.invokeExact(cs, tid, 0) == 0) return false;
            return errno(cs) == 3; // ESRCH
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** open(2); used by tests and tools (a fake agent opens files to pass as slot fds). */
    public static int open(String path, int flags, int mode) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int fd = (int) OPEN.invokeExact(cs, a.allocateFrom(path), flags | O_CLOEXEC, mode);
            if (fd < 0) throw fail("open " + path, errno(cs));
            return fd;
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

    // ---- the slot table's shared memory ---------------------------------------------------------

    public static final int MFD_CLOEXEC = 1, MFD_ALLOW_SEALING = 2;
    public static final int F_ADD_SEALS = 1033, F_GET_SEALS = 1034;
    public static final int F_SEAL_SEAL = 1, F_SEAL_SHRINK = 2, F_SEAL_GROW = 4;
    private static final int PROT_READ = 1, PROT_WRITE = 2, MAP_SHARED = 1;

    /**
     * A sealed memfd of exactly {@code size} bytes (spec: "Slot table layout"): memfd_create with
     * MFD_CLOEXEC | MFD_ALLOW_SEALING, ftruncate, then F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL,
     * so that no mapping of it can ever fault past its end. Returns the fd.
     */
    public static int sealedMemfd(String name, long size) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int fd = (int) MEMFD_CREATE.invokeExact(cs, a.allocateFrom(name), MFD_CLOEXEC | MFD_ALLOW_SEALING);
            if (fd < 0) throw fail("memfd_create", errno(cs));
            try {
                if ((int) FTRUNCATE.invokeExact(cs, fd, size) != 0) throw fail("ftruncate", errno(cs));
                if ((int) FCNTL.invokeExact(cs, fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
                    throw fail("fcntl F_ADD_SEALS", errno(cs));
            } catch (NativeException e) {
                close(fd);
                throw e;
            }
            return fd;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** The seals of a memfd (F_GET_SEALS). */
    public static int seals(int fd) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            int r = (int) FCNTL.invokeExact(cs, fd, F_GET_SEALS, 0);
            if (r < 0) throw fail("fcntl F_GET_SEALS", errno(cs));
            return r;
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /**
     * Maps {@code size} bytes of fd read-write, MAP_SHARED. The mapping lives until the process
     * ends (threads may still touch it while a client closes; unmapping then would fault them).
     */
    public static MemorySegment mapShared(int fd, long size) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            MemorySegment p = (MemorySegment) MMAP.invokeExact(cs, MemorySegment.NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0L);
            if (p.address() == -1L) throw fail("mmap", errno(cs));
            return p.reinterpret(size);
        } catch (NativeException e) {
            throw e;
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }
}
