package dev.cpuslot.conformance;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The generic image's root file system, staged once per test JVM by the image's own build
 * ({@code image/build-image.sh --stage}: the jlinked JRE, Graal on the module path, the AOT cache of
 * a training run), entered as a container ({@code image/chroot-image.sh}), with the suite's work
 * directory bind-mounted at its own path inside it: a container's stdout, stderr, runtime.log, tmp
 * and the files a case writes for it have one path inside and out. Its JavaScript and Python
 * containers start with the image's entrypoint, under chroot as nobody. Root only (chroot, mount):
 * without it, {@link #get()} is null and the suite starts the runtime with the JDK.
 */
final class ImageRoot {
    private static ImageRoot root;
    private static boolean tried;

    final Path dir, work;
    final List<String> entrypoint;
    private final Path chrootImage, mount;

    /** The staged root, or null when not root (said once). Fails when staging fails as root. */
    static synchronized ImageRoot get() throws Exception {
        if (!tried) {
            tried = true;
            if (!((Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid") == 0)) {
                System.err.println("conformance: not root: every container starts with the JDK's java, not the image's JRE and AOT cache");
            } else {
                root = new ImageRoot();
                System.err.println("conformance: JavaScript and Python containers start as the image does: " + String.join(" ", root.entrypoint));
            }
        }
        return root;
    }

    private ImageRoot() throws Exception {
        Path image = Path.of(prop("cpuslot.image.dir")).toAbsolutePath().normalize();
        dir = Path.of(prop("cpuslot.image.root")).toAbsolutePath().normalize();
        work = Path.of(System.getProperty("cpuslot.work", "target/conformance")).toAbsolutePath().normalize();
        chrootImage = image.resolve("chroot-image.sh");
        mount = Path.of(dir + work.toString());
        Files.createDirectories(work);
        leave(); // what a killed run left
        Path log = dir.resolveSibling("build-image.log");
        if (run(log, "bash", image.resolve("build-image.sh").toString(), "--stage", dir.toString()) != 0)
            throw new IllegalStateException("build-image.sh --stage failed:\n" + Files.readString(log));
        entrypoint = Files.readAllLines(Path.of(dir + ".entrypoint"));
        if (entrypoint.stream().noneMatch(a -> a.startsWith("-XX:AOTCache=")))
            throw new IllegalStateException("the image was staged as root without its AOT cache: " + entrypoint + "\n" + Files.readString(log));
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                leave();
            } catch (Exception e) {
                System.err.println("conformance: leaving the image root: " + e);
            }
        }));
        check(run(log, "bash", chrootImage.toString(), "enter", dir.toString()), "chroot-image.sh enter");
        Files.createDirectories(mount);
        check(run(log, "mount", "--bind", work.toString(), mount.toString()), "mount --bind");
    }

    /** The command that starts the entrypoint under chroot as nobody with only these variables (chroot-image.sh's chroot_run). */
    List<String> command(Map<String, String> env, List<String> jvmOptions) {
        List<String> cmd = new ArrayList<>(List.of("bash", "-c", ". \"$1\"; shift; chroot_run \"$@\"", "bash", chrootImage.toString(), dir.toString()));
        env.forEach((k, v) -> cmd.add(k + "=" + v));
        cmd.add("--");
        List<String> entry = new ArrayList<>(entrypoint);
        entry.addAll(entry.indexOf("-jar"), jvmOptions);
        cmd.addAll(entry);
        return cmd;
    }

    private void leave() throws Exception {
        Path log = dir.resolveSibling("leave.log");
        Files.createDirectories(dir.getParent());
        if (Files.isDirectory(mount) && run(log, "mountpoint", "-q", mount.toString()) == 0)
            check(run(log, "umount", mount.toString()), "umount " + mount);
        if (Files.isDirectory(dir)) check(run(log, "bash", chrootImage.toString(), "leave", dir.toString()), "chroot-image.sh leave");
    }

    private static void check(int code, String what) {
        if (code != 0) throw new IllegalStateException(what + " failed (" + code + ")");
    }

    private static int run(Path log, String... cmd) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile())).start();
        if (!p.waitFor(30, TimeUnit.MINUTES)) {
            p.destroyForcibly();
            throw new IllegalStateException(String.join(" ", cmd) + " did not finish within 30 minutes; its log: " + log);
        }
        return p.exitValue();
    }

    private static String prop(String k) {
        String v = System.getProperty(k);
        if (v == null) throw new IllegalStateException("system property " + k + " is not set (run through Maven)");
        return v;
    }
}
