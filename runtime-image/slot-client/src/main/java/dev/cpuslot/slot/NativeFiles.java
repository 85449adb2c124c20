package dev.cpuslot.slot;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import dev.cpuslot.slot.Native.NativeException;

import static dev.cpuslot.slot.Native.EINTR;
import static dev.cpuslot.slot.Native.O_CLOEXEC;
import static dev.cpuslot.slot.Native.close;
import static dev.cpuslot.slot.NativeLink.*;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;

/**
 * {@link Native}'s calls on files rather than sockets: writing and reading a slot's files (a
 * cgroup's cpu.max, its counters), whether a thread still exists, and the slot table's sealed
 * shared memory. Declared here and called as Native's (Native extends this class).
 */
abstract sealed class NativeFiles permits Native {
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

    /**
     * Gives thread {@code tid} of this process the least CPU an unprivileged process can: nice 19
     * (setpriority(PRIO_PROCESS, tid): Linux applies it to that one thread), then SCHED_IDLE
     * (sched_setscheduler on the tid): lowering one's own threads needs no privilege. Throws with
     * the first call that failed (after nice 19 the thread keeps it even if SCHED_IDLE is refused).
     */
    public static void leastCpu(int tid) throws NativeException {
        check();
        try (Arena a = Arena.ofConfined()) {
            MemorySegment cs = a.allocate(CAPTURE);
            if ((int) SETPRIORITY.invokeExact(cs, 0, tid, 19) != 0) throw fail("setpriority", errno(cs));
            MemorySegment param = a.allocate(JAVA_INT); // struct sched_param { int sched_priority = 0; }
            if ((int) SCHED_SETSCHEDULER.invokeExact(cs, tid, 5, param) != 0) throw fail("sched_setscheduler SCHED_IDLE", errno(cs));
        } catch (NativeException e) {
            throw e;
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
