package dev.cpuslot.runtime.lang;

import dev.cpuslot.runtime.guard.FileAccess;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;
import org.graalvm.polyglot.Context;
import dev.cpuslot.runtime.base.Log;

/**
 * Where GraalVM's languages find their files (GraalPy's standard library, Truffle's native helper).
 * Truffle unpacks them from the jars into {@code user.home/.cache/org.graalvm.polyglot} at a
 * process's first context: in a container whose {@code /tmp} starts empty that is every pod's
 * cold start, and the copy is writable by the runtime's own user. The image ships them unpacked
 * instead, beside the jar in {@code polyglot/} (root's, read-only), with the standard library's
 * bytecode compiled ({@code .pyc}), and the runtime points Truffle there.
 */
public final class PolyglotCache {
    private PolyglotCache() {}

    /** Truffle's system property for the directory of unpacked resources. */
    static final String PROPERTY = "polyglot.engine.userResourceCache";

    /**
     * The cache to use: {@code polyglot/} beside the runtime's jar when it is a directory, unless
     * the command line names one (property); empty: Truffle's own default.
     */
    public static Optional<Path> chosen(String property, Path jarDir) {
        if (property != null || jarDir == null) return Optional.empty();
        Path p = jarDir.resolve("polyglot");
        return Files.isDirectory(p) ? Optional.of(p) : Optional.empty();
    }

    /**
     * Before the first engine (Truffle reads the property once). Java functions may not open the
     * cache in use, wherever it is: every Python function imports its modules and bytecode.
     */
    public static void useBesideJar() {
        Path jarDir = null;
        try {
            Path jar = Path.of(PolyglotCache.class.getProtectionDomain().getCodeSource().getLocation().toURI());
            if (Files.isRegularFile(jar)) jarDir = jar.getParent();
        } catch (Exception e) { // no code source (an unusual class loader): Truffle's default
        }
        chosen(System.getProperty(PROPERTY), jarDir).ifPresent(p -> {
            System.setProperty(PROPERTY, p.toString());
            Log.info("polyglot resources from " + p);
        });
        String dir = System.getProperty(PROPERTY);
        FileAccess.protect(dir != null ? Path.of(dir) : Path.of(System.getProperty("user.home"), ".cache", "org.graalvm.polyglot"));
    }

    /**
     * Builds the cache (the image build runs it, as root): {@code PolyglotCache DIR [RUNTIME_DIR]}.
     * Unpacks the resources of every language the runtime has, and compiles GraalPy's standard
     * library to {@code .pyc} next to its sources, as unchecked hash-based pycs (PEP 552: valid
     * whatever the files' times in the image's layer; the directory is read-only where it runs).
     * RUNTIME_DIR, where the image puts DIR, is the path the bytecode names its sources by (GraalPy
     * does not rename a loaded function's file: tracebacks would name the build's directory).
     * Fails when a module does not compile.
     */
    public static void main(String[] args) {
        if (args.length < 1 || args.length > 2) throw new IllegalArgumentException("usage: PolyglotCache DIR [RUNTIME_DIR]");
        String dir = Path.of(args[0]).toAbsolutePath().normalize().toString();
        String runtimeDir = args.length > 1 ? args[1] : dir;
        System.setProperty(PROPERTY, dir);
        System.setProperty("polyglot.engine.WarnInterpreterOnly", "false");
        try (Context js = Context.newBuilder("js").build()) {
            js.eval("js", "1");
        }
        // build time, no function's code: the compiler writes into the cache
        try (Context py = Context.newBuilder("python").allowAllAccess(true).option("python.ForceImportSite", "false").build()) {
            boolean ok = py.eval("python", String.join("\n",
                    "import compileall, os, py_compile, sys",
                    "def compile_all(dir, runtime_dir):",
                    "    ok, n = True, 0",
                    "    for d in sys.path:",
                    "        if os.path.isdir(d) and d.startswith(dir + '/'):",
                    "            n += 1",
                    "            ok = compileall.compile_dir(d, ddir=runtime_dir + d[len(dir):], quiet=1,",
                    "                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH) and ok",
                    "    return ok and n > 0",
                    "compile_all")).execute(dir, runtimeDir).asBoolean();
            if (!ok) throw new IllegalStateException("GraalPy's standard library did not compile (above), or is not in " + dir);
        }
    }
}
