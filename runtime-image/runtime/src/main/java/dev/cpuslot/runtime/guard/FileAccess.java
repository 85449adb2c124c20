package dev.cpuslot.runtime.guard;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileAttribute;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A function's files: its own temporary directory ({@code java.io.tmpdir} and the temporary-file
 * calls, redirected here), and the check {@link FilePaths} inserts before every JDK call that names
 * a file: not the process's, the kernel's, a device, the runtime's own files or another function's
 * temporary directory. Its own class: the functions' directories and the runtime's protected files
 * are what the check compares against.
 */
public final class FileAccess {
    private FileAccess() {}

    // ---- the function's own temporary directory ----------------------------------------------

    /** Each function's class loader -> its temporary directory (removed with the function). */
    private static final Map<ClassLoader, Path> TMP = new ConcurrentHashMap<>();
    /** The same with its links resolved, as the path checks compare it. */
    private static final Map<ClassLoader, Path> TMP_REAL = new ConcurrentHashMap<>();

    /** Gives the function whose classes the loader defines its own temporary directory (null removes it). */
    public static void setTmpdir(ClassLoader function, Path dir) {
        if (dir == null) {
            TMP.remove(function);
            TMP_REAL.remove(function);
            ThreadBudget.forget(function); // its threads still alive keep their count object
        } else {
            TMP.put(function, dir);
            TMP_REAL.put(function, real(dir.toAbsolutePath().normalize()));
        }
    }

    /** Whether the loader is a function's (one given a temporary directory, until it is removed). */
    static boolean function(ClassLoader l) { return l != null && TMP.containsKey(l); }

    /**
     * The calling function's temporary directory: found from the class that made the call (the
     * rewritten call site), so threads the function starts have it too.
     */
    private static Path tmpdir() {
        Class<?> caller = OwnReflection.caller();
        Path p = TMP.get(caller.getClassLoader());
        if (p == null) throw new SecurityException("no temporary directory for " + caller.getName());
        return p;
    }

    public static String getProperty(String key) {
        if ("java.io.tmpdir".equals(key)) return tmpdir().toString();
        return System.getProperty(key);
    }

    public static String getProperty(String key, String def) {
        if ("java.io.tmpdir".equals(key)) return tmpdir().toString();
        return System.getProperty(key, def);
    }

    /** A copy: a function cannot change the JVM's properties through it. */
    public static Properties getProperties() {
        Properties p = new Properties();
        p.putAll(System.getProperties());
        p.setProperty("java.io.tmpdir", tmpdir().toString());
        return p;
    }

    public static File createTempFile(String prefix, String suffix) throws IOException {
        return File.createTempFile(prefix, suffix, tmpdir().toFile());
    }

    public static File createTempFile(String prefix, String suffix, File dir) throws IOException {
        if (dir != null) path(dir);
        return File.createTempFile(prefix, suffix, dir != null ? dir : tmpdir().toFile());
    }

    public static Path createTempFile(String prefix, String suffix, FileAttribute<?>... attrs) throws IOException {
        return Files.createTempFile(tmpdir(), prefix, suffix, attrs);
    }

    public static Path createTempDirectory(String prefix, FileAttribute<?>... attrs) throws IOException {
        return Files.createTempDirectory(tmpdir(), prefix, attrs);
    }

    // ---- file access by path (the checks FilePaths inserts before the JDK's file calls) --------

    /** Devices a function may open; the rest of /dev (and /dev/fd, the process's descriptors) not. */
    private static final Set<String> DEVICES = Set.of("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", "/dev/full");

    /** The runtime's temporary directory, every function's own below it: a function reaches only its own. */
    private static final Path RUNTIME_TMP = real(Path.of(System.getProperty("java.io.tmpdir")).toAbsolutePath().normalize());

    /** Files of the runtime that no function may open (its log, wherever CPUSLOT_LOG puts it). */
    private static final Set<Path> PROTECTED = ConcurrentHashMap.newKeySet();

    /** Keeps functions from a file of the runtime's own, or from a directory and everything below it. */
    public static void protect(Path p) {
        PROTECTED.add(real(p.toAbsolutePath().normalize()));
    }

    public static void path(String name) {
        if (name == null) return; // the JDK call throws its NullPointerException
        Path p;
        try {
            p = Path.of(name);
        } catch (java.nio.file.InvalidPathException e) {
            throw new SecurityException(name + ": not a path: file access " + Rewriter.NOT_ALLOWED);
        }
        check(p, name);
    }

    public static void path(File f) {
        if (f == null) return;
        // the JDK asks a File for its path again after the check: only File's own answer is trusted
        if (f.getClass() != File.class) throw new SecurityException("a " + f.getClass().getName() + " as a file: " + Rewriter.NOT_ALLOWED);
        path(f.getPath());
    }

    public static void path(Path p) {
        if (p == null) return;
        if (p.getClass().getModule().getLayer() != ModuleLayer.boot()) {
            throw new SecurityException("a " + p.getClass().getName() + " as a path: " + Rewriter.NOT_ALLOWED);
        }
        if (p.getFileSystem() != java.nio.file.FileSystems.getDefault()) return; // inside an archive the function opened
        check(p, p.toString());
    }

    public static void path(java.net.URL u) {
        if (u == null) return;
        String proto = u.getProtocol();
        if (proto.equalsIgnoreCase("jar")) { // jar:<url of the archive>!/<entry>
            String f = u.getFile();
            int bang = f.indexOf("!/");
            try {
                path(java.net.URI.create(bang < 0 ? f : f.substring(0, bang)).toURL());
            } catch (IllegalArgumentException | java.net.MalformedURLException e) {
                throw new SecurityException(u + ": not a jar URL: file access " + Rewriter.NOT_ALLOWED);
            }
        } else if (proto.equalsIgnoreCase("file")) {
            try {
                check(Path.of(u.toURI()), u.toString());
            } catch (java.net.URISyntaxException | IllegalArgumentException | java.nio.file.FileSystemNotFoundException e) {
                throw new SecurityException(u + ": not a file URL: file access " + Rewriter.NOT_ALLOWED);
            }
        }
    }

    /**
     * An XML system id the parser opens itself ({@code DocumentBuilder.parse(String)}, an
     * {@code InputSource} or {@code StreamSource} of one): a URI is checked as a URL ({@code file:},
     * {@code jar:}), one without a scheme as a path; one that is neither is refused (the parser
     * would fix it up and open it).
     */
    public static void systemId(String id) {
        if (id == null) return;
        int colon = id.indexOf(':'), slash = id.indexOf('/');
        if (colon < 0 || (slash >= 0 && slash < colon)) {
            path(id);
            return;
        }
        try {
            java.net.URI u = new java.net.URI(id);
            if (u.getScheme() == null) path(id);
            else if (u.getScheme().equalsIgnoreCase("file") || u.getScheme().equalsIgnoreCase("jar")) path(u.toURL());
        } catch (java.net.URISyntaxException | IllegalArgumentException | java.net.MalformedURLException e) {
            throw new SecurityException(id + ": not a URI: an XML system id of a function " + Rewriter.NOT_ALLOWED);
        }
    }

    /** Refuses a path (as named, and with its links resolved) in the process, the kernel, a device or the runtime's files. */
    private static void check(Path p, String name) {
        Path abs = p.toAbsolutePath().normalize();
        String why = denied(abs);
        if (why == null) {
            Path r = real(abs);
            if (!r.equals(abs)) why = denied(r);
        }
        if (why != null) throw new SecurityException(name + " is " + why + ": file access there is " + Rewriter.NOT_ALLOWED);
    }

    private static String denied(Path x) {
        if (x.startsWith("/proc") || x.startsWith("/sys")) return "the process's or the kernel's";
        if (x.startsWith("/dev") && !DEVICES.contains(x.toString())) return "a device";
        for (Path q : PROTECTED) if (x.startsWith(q)) return "the runtime's own";
        if (x.startsWith(RUNTIME_TMP)) {
            Path own = TMP_REAL.get(OwnReflection.caller().getClassLoader());
            if (own == null || !x.startsWith(own)) return "in the runtime's temporary directory, outside the function's own";
        }
        return null;
    }

    /** The path with the links of its longest existing prefix resolved (what the kernel opens). */
    private static Path real(Path abs) {
        for (Path q = abs; q != null; q = q.getParent()) {
            try {
                return q.toRealPath().resolve(q.relativize(abs)).normalize();
            } catch (IOException | SecurityException e) {
                // not there (yet): its parent
            }
        }
        return abs;
    }
}
