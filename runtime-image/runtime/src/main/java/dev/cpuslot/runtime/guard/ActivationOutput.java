package dev.cpuslot.runtime.guard;

import java.io.BufferedOutputStream;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The process's stdout and stderr, kept apart per activation. OpenWhisk stores what a container
 * writes on them, up to each activation's sentinel, as that activation's logs; many activations of
 * many functions share the two streams here. {@link #install} makes {@code System.out} and
 * {@code System.err} streams that send what a thread prints to the {@link Capture} of the
 * activation it belongs to (the worker's, inherited by every thread the function starts); when the
 * activation ends the runtime writes its output on each stream as one block of whole lines,
 * followed by the sentinel, under one lock ({@link Capture#close}). So concurrent activations do not
 * splice their lines, and a function cannot take, close or interleave into another's output: each
 * activation prints to a stream of its own (its own lock too), and {@code close()} on
 * {@code System.out} closes nothing. What a thread of no activation prints (the runtime's own
 * lines) goes through as whole lines between the blocks; what a function's thread prints after
 * its activation ended is dropped and counted ({@link #dropped}).
 */
public final class ActivationOutput {
    private ActivationOutput() {}

    public static final String SENTINEL = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX";
    /** OpenWhisk's own words for logs over the limit. */
    static final String TRUNCATED = "Logs were truncated because the total bytes size exceeds the limit of %d bytes.";

    /** The process's streams, written only under LOCK. */
    private static final Object LOCK = new Object();
    private static OutputStream realOut, realErr;
    /** The runtime's own output (threads of no activation): whole lines only reach the stream. */
    private static PrintStream directOut, directErr;
    private static volatile boolean installed;
    /** Most bytes one activation's output may hold (both streams); the rest is dropped. */
    private static volatile int limit = 10 << 20;
    private static final AtomicLong DROPPED = new AtomicLong();
    private static final InheritableThreadLocal<Capture> CURRENT = new InheritableThreadLocal<>();

    /**
     * Makes System.out and System.err the per-activation streams over the process's file
     * descriptors 1 and 2 (UTF-8 whatever the locale: a container usually has none).
     * @param limitBytes most bytes one activation's output may hold (OpenWhisk's default: 10 MiB)
     */
    public static void install(int limitBytes) {
        synchronized (LOCK) {
            limit = limitBytes;
            realOut = new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 8192);
            realErr = new BufferedOutputStream(new FileOutputStream(FileDescriptor.err), 8192);
            directOut = new PrintStream(new Lines(true), true, StandardCharsets.UTF_8);
            directErr = new PrintStream(new Lines(false), true, StandardCharsets.UTF_8);
            installed = true;
        }
        System.setOut(new Demux(true));
        System.setErr(new Demux(false));
    }

    /** A new activation's output, or null when the streams are not installed (embedded, tests). */
    public static Capture open() { return installed ? new Capture() : null; }

    /**
     * The calling thread (and the threads it starts from now on) prints to c (null: to the
     * process's streams). Returns what it printed to before.
     */
    public static Capture enter(Capture c) {
        Capture before = CURRENT.get();
        if (c == null) CURRENT.remove();
        else CURRENT.set(c);
        return before;
    }

    /** Where the calling thread prints (null: the process's streams). */
    public static Capture current() { return CURRENT.get(); }

    public static void leave() { CURRENT.remove(); }

    /** Bytes printed by functions' threads after their activation had ended, or past its limit. */
    public static long dropped() { return DROPPED.get(); }

    /** The sentinel on both streams, for a reply that had no activation (an /init that failed). */
    public static void sentinels(PrintStream out, PrintStream err) {
        if (!installed) {
            out.println(SENTINEL);
            err.println(SENTINEL);
            out.flush();
            err.flush();
            return;
        }
        synchronized (LOCK) {
            try {
                emit(realOut, new byte[0], null, true);
                emit(realErr, new byte[0], null, true);
            } catch (IOException e) {
                // the container's stream is gone: nothing to tell
            }
        }
    }

    /** Writes one block (ended by a newline when it has none), an extra line, the sentinel. Under LOCK. */
    private static void emit(OutputStream s, byte[] block, String extra, boolean sentinel) throws IOException {
        s.write(block);
        if (block.length > 0 && block[block.length - 1] != '\n') s.write('\n');
        if (extra != null) s.write((extra + "\n").getBytes(StandardCharsets.UTF_8));
        if (sentinel) s.write((SENTINEL + "\n").getBytes(StandardCharsets.UTF_8));
        s.flush();
    }

    /** One activation's stdout and stderr, held until it ends. */
    public static final class Capture {
        private final ByteArrayOutputStream out = new ByteArrayOutputStream(0), err = new ByteArrayOutputStream(0);
        /** Made on first use: most activations print nothing. */
        private PrintStream outStream, errStream;
        private int size;
        private boolean closed, truncated;
        /** Lines the runtime adds to the stdout (chain hops' records), rendered when the block is written; made on first use. */
        private java.util.List<Record> records;

        private record Record(int at, Object line) {}

        /** What a record is charged against the activation's limit before it is rendered (its line is about this long). */
        static final int RECORD_BYTES = 256;

        private Capture() {}

        private synchronized PrintStream stream(boolean stdout) {
            if (stdout) {
                if (outStream == null) outStream = new PrintStream(new Sink(this, true), false, StandardCharsets.UTF_8);
                return outStream;
            }
            if (errStream == null) errStream = new PrintStream(new Sink(this, false), false, StandardCharsets.UTF_8);
            return errStream;
        }

        private synchronized void add(boolean stdout, byte[] b, int off, int len) {
            if (closed) {
                DROPPED.addAndGet(len);
                return;
            }
            int n = Math.min(len, limit - size);
            if (n > 0) {
                (stdout ? out : err).write(b, off, n);
                size += n;
            }
            if (n < len) {
                truncated = true;
                DROPPED.addAndGet(len - Math.max(n, 0));
            }
        }

        /**
         * Adds a line of the runtime's to the activation's stdout, where it stands among the
         * function's lines now: {@code line.toString()} is called when the block is written (at
         * {@link #close}), not now, so adding it costs its caller no formatting. Counted against
         * the activation's limit as the function's own output is (dropped past it).
         */
        public synchronized void record(Object line) {
            if (closed) {
                DROPPED.addAndGet(RECORD_BYTES);
                return;
            }
            if (size + RECORD_BYTES > limit) {
                truncated = true;
                DROPPED.addAndGet(RECORD_BYTES);
                return;
            }
            size += RECORD_BYTES;
            if (records == null) records = new java.util.ArrayList<>();
            records.add(new Record(out.size(), line));
        }

        /** The stdout block with the records spliced in at their places, each a line of its own. */
        private static byte[] withRecords(byte[] o, java.util.List<Record> records) {
            if (records == null) return o;
            ByteArrayOutputStream b = new ByteArrayOutputStream(o.length + records.size() * 160);
            int pos = 0;
            for (Record r : records) {
                b.write(o, pos, r.at() - pos);
                pos = r.at();
                if (pos > 0 && o[pos - 1] != '\n') b.write('\n'); // the function's line so far ends here
                String line;
                try {
                    line = String.valueOf(r.line());
                } catch (RuntimeException e) {
                    line = "cpuslot: a record could not be written: " + e;
                }
                b.writeBytes((line + "\n").getBytes(StandardCharsets.UTF_8));
            }
            b.write(o, pos, o.length - pos);
            return b.toByteArray();
        }

        /**
         * Ends the activation's output: its stdout and stderr go to the process's streams, each
         * as one block, then (with {@code sentinels}) OpenWhisk's sentinel on each; what its
         * threads print later is dropped. Once; later calls do nothing.
         */
        public void close(boolean sentinels) {
            byte[] o, e;
            String extra;
            java.util.List<Record> recs;
            synchronized (this) {
                if (closed) return;
                closed = true;
                o = out.toByteArray();
                e = err.toByteArray();
                recs = records;
                records = null;
                extra = truncated ? String.format(Locale.ROOT, TRUNCATED, limit) : null;
            }
            o = withRecords(o, recs);
            synchronized (LOCK) {
                try {
                    emit(realOut, o, null, sentinels);
                    emit(realErr, e, extra, sentinels);
                } catch (IOException ex) {
                    // the container's stream is gone: nothing to tell
                }
            }
        }
    }

    /** An activation's end of System.out or System.err. */
    private static final class Sink extends OutputStream {
        private final Capture c;
        private final boolean stdout;

        Sink(Capture c, boolean stdout) {
            this.c = c;
            this.stdout = stdout;
        }

        @Override public void write(int b) { write(new byte[] {(byte) b}, 0, 1); }
        @Override public void write(byte[] b, int off, int len) {
            java.util.Objects.checkFromIndexSize(off, len, b.length);
            c.add(stdout, b, off, len);
        }
    }

    /** The runtime's own output: whole lines go to the process's stream between the activations' blocks. */
    private static final class Lines extends OutputStream {
        private final boolean stdout;
        private final ByteArrayOutputStream pending = new ByteArrayOutputStream();

        Lines(boolean stdout) { this.stdout = stdout; }

        @Override public void write(int b) { write(new byte[] {(byte) b}, 0, 1); }

        @Override
        public void write(byte[] b, int off, int len) {
            synchronized (LOCK) {
                pending.write(b, off, len);
                if (pending.size() > 65536) drain(true);
            }
        }

        @Override
        public void flush() {
            synchronized (LOCK) {
                drain(false);
            }
        }

        /** Writes what is pending up to its last newline (all of it when forced). Under LOCK. */
        private void drain(boolean all) {
            byte[] p = pending.toByteArray();
            int end = p.length;
            if (!all) while (end > 0 && p[end - 1] != '\n') end--;
            if (end == 0) return;
            OutputStream s = stdout ? realOut : realErr;
            try {
                s.write(p, 0, end);
                s.flush();
            } catch (IOException e) {
                // the container's stream is gone
            }
            pending.reset();
            pending.write(p, end, p.length - end);
        }
    }

    /**
     * System.out or System.err: every call goes to the calling thread's activation stream, or to
     * the runtime's own. Nothing locks this object (a function holding its monitor blocks no one),
     * and closing it closes nothing.
     */
    private static final class Demux extends PrintStream {
        private final boolean stdout;

        Demux(boolean stdout) {
            super(OutputStream.nullOutputStream(), false, StandardCharsets.UTF_8);
            this.stdout = stdout;
        }

        private PrintStream target() {
            Capture c = CURRENT.get();
            if (c != null) return c.stream(stdout);
            return stdout ? directOut : directErr;
        }

        @Override public void flush() { target().flush(); }
        @Override public void close() { target().flush(); }
        @Override public boolean checkError() { return target().checkError(); }
        @Override public void write(int b) { target().write(b); }
        @Override public void write(byte[] buf, int off, int len) { target().write(buf, off, len); }
        @Override public void write(byte[] buf) throws IOException { target().write(buf); }
        @Override public void writeBytes(byte[] buf) { target().writeBytes(buf); }
        @Override public void print(boolean b) { target().print(b); }
        @Override public void print(char c) { target().print(c); }
        @Override public void print(int i) { target().print(i); }
        @Override public void print(long l) { target().print(l); }
        @Override public void print(float f) { target().print(f); }
        @Override public void print(double d) { target().print(d); }
        @Override public void print(char[] s) { target().print(s); }
        @Override public void print(String s) { target().print(s); }
        @Override public void print(Object obj) { target().print(obj); }
        @Override public void println() { target().println(); }
        @Override public void println(boolean x) { target().println(x); }
        @Override public void println(char x) { target().println(x); }
        @Override public void println(int x) { target().println(x); }
        @Override public void println(long x) { target().println(x); }
        @Override public void println(float x) { target().println(x); }
        @Override public void println(double x) { target().println(x); }
        @Override public void println(char[] x) { target().println(x); }
        @Override public void println(String x) { target().println(x); }
        @Override public void println(Object x) { target().println(x); }
        @Override public PrintStream printf(String format, Object... args) { target().printf(format, args); return this; }
        @Override public PrintStream printf(Locale l, String format, Object... args) { target().printf(l, format, args); return this; }
        @Override public PrintStream format(String format, Object... args) { target().format(format, args); return this; }
        @Override public PrintStream format(Locale l, String format, Object... args) { target().format(l, format, args); return this; }
        @Override public PrintStream append(CharSequence csq) { target().append(csq); return this; }
        @Override public PrintStream append(CharSequence csq, int start, int end) { target().append(csq, start, end); return this; }
        @Override public PrintStream append(char c) { target().append(c); return this; }
        @Override public Charset charset() { return StandardCharsets.UTF_8; }
    }
}
