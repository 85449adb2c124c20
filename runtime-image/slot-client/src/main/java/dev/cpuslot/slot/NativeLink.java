package dev.cpuslot.slot;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;
import java.util.Optional;
import dev.cpuslot.slot.Native.NativeException;

import static dev.cpuslot.slot.Native.MAX_FDS;
import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

/**
 * The linking behind {@link Native}: libc's functions as downcall handles (linked once, when the
 * class loads; {@link #LOAD_ERROR} says why not), the per-thread native scratch memory, and the
 * errno of a failed call as a {@link NativeException}. Native's calls use these through a static
 * import, so the code of a call reads as if they were its own.
 */
final class NativeLink {
    private NativeLink() {}

    static final int MSGHDR_SIZE = 56;
    static final int CMSG_HDR = 16;
    static final Linker LINKER = Linker.nativeLinker();
    static final StructLayout CAPTURE = Linker.Option.captureStateLayout();
    static final VarHandle ERRNO = CAPTURE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    static final Linker.Option CCS = Linker.Option.captureCallState("errno");

    static final Throwable LOAD_ERROR;
    static final MethodHandle SOCKET, CONNECT, BIND, LISTEN, ACCEPT4, SENDMSG, RECVMSG, POLL, WRITE, CLOSE,
            OPEN, GETTID, SYSCALL, STRERROR, PREAD, MEMFD_CREATE, FTRUNCATE, FCNTL, MMAP, KILL,
            SETPRIORITY, SCHED_SETSCHEDULER;

    static {
        MethodHandle socket = null, connect = null, bind = null, listen = null, accept4 = null, sendmsg = null,
                recvmsg = null, poll = null, write = null, close = null, open = null, gettid = null, syscall = null,
                strerror = null, pread = null, memfd = null, ftruncate = null, fcntl = null, mmap = null, kill = null,
                setpriority = null, schedSetscheduler = null;
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
            setpriority = h(libc, "setpriority", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, JAVA_INT), CCS);
            schedSetscheduler = h(libc, "sched_setscheduler", FunctionDescriptor.of(JAVA_INT, JAVA_INT, JAVA_INT, ADDRESS), CCS);
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
        SETPRIORITY = setpriority; SCHED_SETSCHEDULER = schedSetscheduler;
        LOAD_ERROR = err;
    }

    /** Native memory reused by one thread's calls (never shared: a ThreadLocal). */
    static final class Scratch {
        static final int BUF = 4096;
        final Arena arena = Arena.ofAuto();
        final MemorySegment cs = arena.allocate(CAPTURE);
        final MemorySegment buf = arena.allocate(BUF, 8);
        final MemorySegment iov = arena.allocate(16, 8);
        final MemorySegment msg = arena.allocate(MSGHDR_SIZE, 8);
        final MemorySegment ctl = arena.allocate(CMSG_HDR + 4L * MAX_FDS, 8);
        final MemorySegment pfd = arena.allocate(8, 4);
    }

    static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    /** A msghdr with one iovec over data[0..len) and the given control buffer (may be NULL). */
    static MemorySegment msghdr(Scratch s, MemorySegment data, long len, MemorySegment ctl, long ctlLen) {
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

    static MethodHandle h(SymbolLookup l, String name, FunctionDescriptor d, Linker.Option... o) {
        MemorySegment s = l.find(name).orElseThrow(() -> new UnsatisfiedLinkError("libc has no " + name));
        return LINKER.downcallHandle(s, d, o);
    }

    static void check() throws NativeException {
        if (LOAD_ERROR != null) throw new NativeException("native calls unavailable: " + LOAD_ERROR, 0);
    }

    static int errno(MemorySegment cs) { return (int) ERRNO.get(cs, 0L); }

    static NativeException fail(String call, int errno) {
        String s = "errno " + errno;
        try {
            MemorySegment p = (MemorySegment) STRERROR.invokeExact(errno);
            s = p.reinterpret(256).getString(0);
        } catch (Throwable ignored) {
        }
        return new NativeException(call + ": " + s, errno);
    }

    static RuntimeException rethrow(Throwable t) {
        if (t instanceof RuntimeException r) return r;
        if (t instanceof Error e) throw e;
        return new IllegalStateException(t);
    }
}
