package dev.cpuslot.conformance;

import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import java.util.zip.ZipEntry;
import java.util.zip.ZipOutputStream;

/** Base64 jars compiled from Java sources, and base64 zips (upstream's JarBuilder and ZipBuilder roles). */
final class Archives {
    private Archives() {}

    /** Compiles {@code path -> source} (paths like {@code example/HelloWhisk.java}) against Gson; a base64 jar. */
    static String jar(Map<String, String> sources) throws Exception { return jarBundling(sources, null, null); }

    /**
     * As {@link #jar}, with the classes of {@code library} (a jar; null: none) under {@code prefix}
     * bundled in, as a fat jar ships a library the runtime also provides.
     */
    static String jarBundling(Map<String, String> sources, Path library, String prefix) throws Exception {
        Path src = Files.createTempDirectory("conf-src"), classes = Files.createTempDirectory("conf-classes");
        try {
            if (library != null) unpack(library, prefix, classes);
            return compile(sources, src, classes);
        } finally {
            deleteTree(src);
            deleteTree(classes);
        }
    }

    private static void unpack(Path library, String prefix, Path into) throws Exception {
        try (java.util.zip.ZipFile z = new java.util.zip.ZipFile(library.toFile())) {
            for (ZipEntry e : java.util.Collections.list(z.entries())) {
                if (e.isDirectory() || !e.getName().startsWith(prefix)) continue;
                Path p = into.resolve(e.getName());
                Files.createDirectories(p.getParent());
                try (var in = z.getInputStream(e)) {
                    Files.copy(in, p);
                }
            }
        }
    }

    private static String compile(Map<String, String> sources, Path src, Path classes) throws Exception {
        List<String> args = new ArrayList<>(List.of("-d", classes.toString(), "-classpath", classpath(), "-encoding", "UTF-8", "-nowarn"));
        for (Map.Entry<String, String> e : sources.entrySet()) {
            Path p = src.resolve(e.getKey());
            Files.createDirectories(p.getParent());
            Files.writeString(p, e.getValue());
            args.add(p.toString());
        }
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        ByteArrayOutputStream diag = new ByteArrayOutputStream();
        int rc = javac.run(null, diag, diag, args.toArray(String[]::new));
        if (rc != 0) throw new IllegalStateException("javac failed: " + diag.toString(StandardCharsets.UTF_8));
        Map<String, byte[]> files = new LinkedHashMap<>();
        try (Stream<Path> w = Files.walk(classes)) {
            for (Path p : w.filter(Files::isRegularFile).toList())
                files.put(classes.relativize(p).toString().replace(File.separatorChar, '/'), Files.readAllBytes(p));
        }
        return zipBytes(files);
    }

    private static void deleteTree(Path root) throws Exception {
        try (Stream<Path> w = Files.walk(root)) {
            for (Path p : w.sorted(java.util.Comparator.reverseOrder()).toList()) Files.deleteIfExists(p);
        }
    }

    /** A base64 zip of {@code path -> text}. */
    static String zip(Map<String, String> files) throws Exception {
        Map<String, byte[]> b = new LinkedHashMap<>();
        files.forEach((k, v) -> b.put(k, v.getBytes(StandardCharsets.UTF_8)));
        return zipBytes(b);
    }

    private static String zipBytes(Map<String, byte[]> files) throws Exception {
        ByteArrayOutputStream bos = new ByteArrayOutputStream();
        try (ZipOutputStream z = new ZipOutputStream(bos)) {
            for (Map.Entry<String, byte[]> e : files.entrySet()) {
                z.putNextEntry(new ZipEntry(e.getKey()));
                z.write(e.getValue());
                z.closeEntry();
            }
        }
        return Base64.getEncoder().encodeToString(bos.toByteArray());
    }

    /** Gson, and the runtime jar when the build names it (the function API {@code dev.cpuslot.chain}). */
    private static String classpath() {
        String rt = System.getProperty("cpuslot.runtime.jar");
        return rt == null ? gsonJar() : gsonJar() + File.pathSeparator + rt;
    }

    private static String gsonJar() {
        return Path.of(com.google.gson.JsonObject.class.getProtectionDomain().getCodeSource().getLocation().getPath()).toString();
    }
}
