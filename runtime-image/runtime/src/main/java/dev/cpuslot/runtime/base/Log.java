package dev.cpuslot.runtime.base;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Instant;

/**
 * The runtime's own log lines (start-up, warnings, one line per activation). They never go to the
 * tenant's stdout/stderr: OpenWhisk stores a container's stdout/stderr as the activation's logs.
 * Destination ({@code CPUSLOT_LOG}): a file (default {@code <tmpdir>/cpuslot-runtime.log}, rotated
 * once at {@code CPUSLOT_LOG_MAX_BYTES}), {@code fd:N} (an inherited descriptor), {@code stderr},
 * {@code stdout} (for non-OpenWhisk deployments), or {@code off}. Format ({@code CPUSLOT_LOG_FORMAT}):
 * plain text lines, or {@code json}: one object per line ({@code time}, {@code level}, {@code logger},
 * {@code msg}; {@code kind: "activation"} on activation lines, {@code stack} with a stack trace),
 * the message escaped whatever it holds.
 */
public final class Log {
    private Log() {}

    private static volatile PrintStream sink = null;
    private static volatile Path file;
    private static volatile long maxBytes;
    private static long written;
    private static volatile boolean json;

    /** {@code text} or {@code json} (Config checks the name). */
    public static void format(String f) { json = "json".equals(f); }

    /** Opens the destination named by {@code spec} (see class comment). */
    public static synchronized void configure(String spec, long maxBytes) throws IOException {
        Log.maxBytes = maxBytes;
        file = null;
        String s = spec == null || spec.isBlank() ? "file:" + defaultFile() : spec.trim();
        if (s.equals("off")) sink = null;
        else if (s.equals("stderr")) sink = new PrintStream(new FileOutputStream(java.io.FileDescriptor.err), true, StandardCharsets.UTF_8);
        else if (s.equals("stdout")) sink = new PrintStream(new FileOutputStream(java.io.FileDescriptor.out), true, StandardCharsets.UTF_8);
        else if (s.startsWith("fd:")) {
            int fd;
            try {
                fd = Integer.parseInt(s.substring(3));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("CPUSLOT_LOG: fd:N needs a descriptor number: " + spec);
            }
            if (fd < 3) throw new IllegalArgumentException("CPUSLOT_LOG: fd 0-2 are the tenant's streams; use stdout/stderr explicitly: " + spec);
            sink = new PrintStream(new FileOutputStream("/proc/self/fd/" + fd, true), true, StandardCharsets.UTF_8);
        } else {
            Path p = Path.of(s.startsWith("file:") ? s.substring(5) : s);
            file = p;
            dev.cpuslot.runtime.guard.FileAccess.protect(p); // no function reads or removes it
            written = Files.exists(p) ? Files.size(p) : 0;
            sink = open(p);
        }
    }

    static String defaultFile() { return Path.of(System.getProperty("java.io.tmpdir"), "cpuslot-runtime.log").toString(); }

    private static PrintStream open(Path p) throws IOException {
        OutputStream os = Files.newOutputStream(p, java.nio.file.StandardOpenOption.CREATE, java.nio.file.StandardOpenOption.APPEND,
                java.nio.file.StandardOpenOption.WRITE);
        return new PrintStream(new java.io.BufferedOutputStream(os, 8192), false, StandardCharsets.UTF_8);
    }

    /** For tests: write to this stream. */
    public static synchronized void to(PrintStream ps) {
        file = null;
        sink = ps;
    }

    /** Nanoseconds as milliseconds with three decimals (what %.3f printed, without the formatter's cost per invocation). */
    public static String ms(long ns) {
        long us = Math.max(0, (ns + 500) / 1000);
        String frac = Long.toString(us % 1000);
        return us / 1000 + "." + "000".substring(frac.length()) + frac;
    }

    public static void info(String m) { line(entry("INFO", m, null)); }
    public static void warn(String m) { line(entry("WARN", m, null)); }

    /** The per-activation line. */
    public static void activation(String m) { line(activationEntry(m)); }

    /** Lines written by the writer thread, off the caller's path (chain hops' records, rendered there). */
    private static final java.util.concurrent.BlockingQueue<Object> LATER = new java.util.concurrent.ArrayBlockingQueue<>(4096);
    private static volatile Thread writer;

    /**
     * A per-activation line written off the critical path: queued for the runtime's log writer
     * thread, which renders it ({@code m.toString()}: a record's text is made there, not by the
     * caller). A full queue (a writer far behind) writes it here instead: lines are never dropped.
     */
    public static void later(Object m) {
        if (writer == null) startWriter();
        if (!LATER.offer(m)) activation(String.valueOf(m));
    }

    private static synchronized void startWriter() {
        if (writer != null) return;
        // the runtime's thread: in no worker's group, no function's activation inherited
        writer = dev.cpuslot.runtime.guard.RuntimeThreads.startRuntimeThread("cpuslot-log-writer", () -> {
            while (true) {
                try {
                    line(activationEntry(String.valueOf(LATER.take())));
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    // a line that could not be written; the next one may
                }
            }
        });
    }

    public static void stackTrace(String what, Throwable t) {
        java.io.StringWriter w = new java.io.StringWriter();
        t.printStackTrace(new java.io.PrintWriter(w));
        line(entry("WARN", what, w.toString()));
    }

    private static String entry(String level, String m, String stack) {
        if (!json) return Instant.now() + " cpuslot-runtime " + level + " " + m + (stack == null ? "" : "\n" + stack);
        com.google.gson.JsonObject o = new com.google.gson.JsonObject();
        o.addProperty("time", Instant.now().toString());
        o.addProperty("level", level);
        o.addProperty("logger", "cpuslot-runtime");
        o.addProperty("msg", m);
        if (stack != null) o.addProperty("stack", stack);
        return o.toString();
    }

    /** An activation's line: as given in text ({@code cpuslot: k=v ...}), its fields as {@code msg} in JSON. */
    private static String activationEntry(String m) {
        if (!json) return m;
        com.google.gson.JsonObject o = new com.google.gson.JsonObject();
        o.addProperty("time", Instant.now().toString());
        o.addProperty("level", "INFO");
        o.addProperty("logger", "cpuslot-runtime");
        o.addProperty("kind", "activation");
        o.addProperty("msg", m.startsWith("cpuslot: ") ? m.substring(9) : m);
        return o.toString();
    }

    private static synchronized void line(String m) {
        PrintStream s = sink;
        if (s == null) return;
        s.println(m);
        s.flush();
        if (file != null && maxBytes > 0) {
            written += m.length() + 1;
            if (written > maxBytes) rotate();
        }
    }

    private static void rotate() {
        try {
            sink.close();
            Files.move(file, Path.of(file + ".1"), StandardCopyOption.REPLACE_EXISTING);
            sink = open(file);
            written = 0;
        } catch (IOException e) {
            sink = null; // nowhere left to write: drop runtime lines rather than fill the disk
        }
    }
}
