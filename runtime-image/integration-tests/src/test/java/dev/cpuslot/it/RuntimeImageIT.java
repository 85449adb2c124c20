package dev.cpuslot.it;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.*;

/**
 * The JVM image tarball (runtime-image/image/build-image.sh): its OCI image-layout structure,
 * then the image's own filesystem and entrypoint started as a container would start them
 * (runtime-image/image/chroot-image.sh, as the image's build and its benchmark do: under chroot as
 * user 65534, a container's clean environment), served by the real agent through a socket inside
 * that filesystem (as a pod would see it).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class RuntimeImageIT {
    static final String NAME = "docker.io/cpuslot/runtime-jvm:it";
    Path repo, work, tarball, unpacked, rootfs, agentBin, chrootImage;
    Cgroups cg;
    String parent;
    Agent agent;
    RuntimeProc rt;
    boolean entered;

    static String run(Path dir, String... cmd) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(cmd).directory(dir == null ? null : dir.toFile()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        assertTrue(p.waitFor(10, TimeUnit.MINUTES), String.join(" ", cmd));
        assertEquals(0, p.exitValue(), String.join(" ", cmd) + ":\n" + out);
        return out;
    }

    @BeforeAll
    void build() throws Exception {
        repo = Path.of(System.getProperty("cpuslot.repo")).toAbsolutePath().normalize();
        work = Path.of(System.getProperty("cpuslot.work")).toAbsolutePath().resolve("image");
        Files.createDirectories(work);
        tarball = work.resolve("cpuslot-runtime.tar");
        Files.deleteIfExists(tarball);
        run(repo, "bash", "runtime-image/image/build-image.sh", tarball.toString(), NAME);
        unpacked = work.resolve("layout");
        run(null, "rm", "-rf", unpacked.toString());
        Files.createDirectories(unpacked);
        run(null, "tar", "-xf", tarball.toString(), "-C", unpacked.toString());
    }

    JsonObject json(Path p) throws IOException { return JsonParser.parseString(Files.readString(p)).getAsJsonObject(); }

    Path blob(JsonObject descriptor) {
        return unpacked.resolve("blobs/sha256").resolve(descriptor.get("digest").getAsString().substring("sha256:".length()));
    }

    /** The image's index (index.json names it, under the image's name): one manifest per architecture. */
    JsonObject imageIndex() throws IOException {
        return json(blob(json(unpacked.resolve("index.json")).getAsJsonArray("manifests").get(0).getAsJsonObject()));
    }

    /** The descriptor of this machine's architecture's manifest (the runtime image is built for it alone). */
    JsonObject manifestDescriptor() throws IOException {
        JsonArray ms = imageIndex().getAsJsonArray("manifests");
        assertEquals(1, ms.size(), "the runtime image is built for the building machine's architecture: " + ms);
        return ms.get(0).getAsJsonObject();
    }

    JsonObject manifest() throws IOException { return json(blob(manifestDescriptor())); }

    JsonObject config() throws IOException { return json(blob(manifest().getAsJsonObject("config"))); }

    Path layer() throws IOException { return blob(manifest().getAsJsonArray("layers").get(0).getAsJsonObject()); }

    @Test
    void theTarballIsAnOciImageLayoutContainerdCanImport() throws Exception {
        List<String> top = List.of(run(null, "tar", "-tf", tarball.toString()).split("\n"));
        assertTrue(top.contains("oci-layout") && top.contains("index.json"), top.toString());
        assertEquals("1.0.0", json(unpacked.resolve("oci-layout")).get("imageLayoutVersion").getAsString());
        JsonObject index = json(unpacked.resolve("index.json"));
        JsonArray manifests = index.getAsJsonArray("manifests");
        assertEquals(1, manifests.size());
        JsonObject m = manifests.get(0).getAsJsonObject();
        assertEquals("application/vnd.oci.image.index.v1+json", m.get("mediaType").getAsString());
        assertEquals(NAME, m.getAsJsonObject("annotations").get("io.containerd.image.name").getAsString());
        JsonObject md = manifestDescriptor();
        assertEquals("application/vnd.oci.image.manifest.v1+json", md.get("mediaType").getAsString());
        assertEquals("linux", md.getAsJsonObject("platform").get("os").getAsString(), md.toString());
        // every blob is named by its content's sha256, and its size is right
        List<JsonObject> descriptors = new ArrayList<>(List.of(m, md, manifest().getAsJsonObject("config")));
        for (JsonElement l : manifest().getAsJsonArray("layers")) descriptors.add(l.getAsJsonObject());
        for (JsonObject d : descriptors) {
            Path b = blob(d);
            assertEquals(d.get("size").getAsLong(), Files.size(b), d.toString());
            assertEquals(b.getFileName().toString(), sha256(b), "digest of " + d.get("mediaType"));
        }
        JsonObject layer = manifest().getAsJsonArray("layers").get(0).getAsJsonObject();
        assertEquals("application/vnd.oci.image.layer.v1.tar+gzip", layer.get("mediaType").getAsString(), "a compressed layer");
        // the config names the layer by its uncompressed content
        assertEquals("sha256:" + sha256Gunzipped(blob(layer)),
                config().getAsJsonObject("rootfs").getAsJsonArray("diff_ids").get(0).getAsString());
    }

    @Test
    void theLayerHoldsAJreTheRuntimeAndWhatTheEntrypointNeeds() throws Exception {
        JsonObject c = config().getAsJsonObject("config");
        assertEquals("65534:65534", c.get("User").getAsString());
        List<String> entry = new ArrayList<>();
        for (JsonElement e : c.getAsJsonArray("Entrypoint")) entry.add(e.getAsString());
        assertEquals("/opt/java/bin/java", entry.get(0));
        assertTrue(entry.contains("/opt/cpuslot/runtime.jar"), entry.toString());
        String listing = run(null, "tar", "-tvf", layer().toString());
        List<String> names = new ArrayList<>();
        for (String line : listing.split("\n")) names.add(line.substring(line.lastIndexOf(' ') + 1));
        // guest code compiled: JVMCI on, Graal on the module path (image/jvm-options-jit; the JRE has no
        // placeholder jdk.graal.compiler to upgrade, so class-data sharing and the AOT cache stay on)
        assertTrue(entry.contains("-XX:+EnableJVMCI") && entry.contains("--module-path=/opt/cpuslot/compiler")
                && entry.contains("--add-modules=jdk.graal.compiler,org.graalvm.truffle.compiler")
                && entry.stream().noneMatch(e -> e.startsWith("--upgrade-module-path")), entry.toString());
        assertFalse(run(null, "tar", "-xOf", layer().toString(), "opt/java/release").contains("jdk.graal.compiler"),
                "the JRE links no jdk.graal.compiler of its own");
        if (Cgroups.isRoot()) { // built as root: the AOT cache of a training run (train-aot.sh)
            assertTrue(entry.indexOf("-XX:AOTCache=/opt/cpuslot/runtime.aot") >= 0
                    && entry.indexOf("-XX:AOTCache=/opt/cpuslot/runtime.aot") < entry.indexOf("-jar"), entry.toString());
            assertTrue(listing.lines().anyMatch(l -> l.matches("-r--r--r-- (root/root|0/0) .* opt/cpuslot/runtime\\.aot")),
                    "the AOT cache, root's and read-only: " + listing.lines().filter(l -> l.contains("runtime.aot")).toList());
        }
        for (String want : List.of("opt/java/bin/java", "opt/java/lib/server/libjvm.so", "opt/java/lib/modules", "opt/cpuslot/runtime.jar",
                "opt/cpuslot/lib/gson-2.11.0.jar", "opt/cpuslot/lib/slot-client-0.1.0-SNAPSHOT.jar", "etc/passwd",
                "opt/cpuslot/compiler/compiler.jar", "opt/cpuslot/compiler/truffle-compiler.jar"))
            assertTrue(names.contains(want), "layer lacks " + want);
        assertTrue(names.stream().anyMatch(n -> n.matches("lib.*/ld-linux.*\\.so\\.\\d")), "the dynamic loader");
        assertTrue(names.stream().anyMatch(n -> n.matches("lib.*/libc\\.so\\.6")), "libc");
        assertTrue(listing.lines().anyMatch(l -> l.startsWith("drwxrwxrwt") && l.endsWith(" tmp/")), "a world-writable /tmp:\n" + listing.lines().filter(l -> l.endsWith(" tmp/")).toList());
        // GraalPy's standard library unpacked with its bytecode (PolyglotCache), which no function
        // may change for another: root's, writable by no one else (the runtime runs as nobody)
        assertTrue(names.stream().anyMatch(n -> n.matches("opt/cpuslot/polyglot/python/python-home/[0-9a-f]+/lib/python3\\.12/json/__pycache__/__init__\\.graalpy\\d+-312\\.pyc")),
                "GraalPy's json compiled in the image");
        List<String> cache = listing.lines().filter(l -> l.contains(" opt/cpuslot/polyglot/")).toList();
        assertTrue(cache.size() > 1000, "the unpacked cache: " + cache.size() + " entries");
        for (String l : cache) {
            assertTrue(l.matches("[-d]rw[-x]r-[-x]r-[-x] (root/root|0/0) .*"), "root's and read-only to others: " + l);
        }
    }

    @Test
    void theImageRunsUnprivilegedUnderChrootAndTakesSlotsFromTheRealAgent() throws Exception {
        cg = Cgroups.orSkip("needs root (chroot, cgroups)");
        rootfs = work.resolve("rootfs");
        run(null, "rm", "-rf", rootfs.toString());
        Files.createDirectories(rootfs);
        run(null, "tar", "-xf", layer().toString(), "-C", rootfs.toString());
        chrootImage = repo.resolve("runtime-image/image/chroot-image.sh");
        run(null, "bash", chrootImage.toString(), "enter", rootfs.toString());
        entered = true;
        // the agent's socket inside the image's filesystem, where the runtime looks by default
        Files.createDirectories(rootfs.resolve("run/cpuslot"));
        agentBin = Agent.build(repo, work.resolve("node-agent"));
        parent = "/cpuslot-it-" + ProcessHandle.current().pid() + "-img";
        cg.create(parent + "/pod");
        agent = new Agent(agentBin, rootfs.resolve("run/cpuslot/agent.sock"), parent, "250m=1", RuntimeProc.freePort(),
                work.resolve("agent.log"));
        agent.start();
        // the harness becomes the entrypoint (the same process) and passes it PORT and CPUSLOT_* alone
        List<String> cmd = new ArrayList<>(List.of("bash", chrootImage.toString(), "run", rootfs.toString()));
        for (JsonElement e : config().getAsJsonObject("config").getAsJsonArray("Entrypoint")) cmd.add(e.getAsString());
        // a generous acquire budget: the first acquisition waits for the agent to prepare the pod's pool
        rt = new RuntimeProc(cmd, Map.of("CPUSLOT_ACQUIRE_BUDGET_MS", "2000"), cg.procsFiles(parent + "/pod"), work.resolve("runtime.log"));
        String jar = Base64.getEncoder().encodeToString(Files.readAllBytes(Path.of(System.getProperty("cpuslot.samples.jar"))));
        RuntimeProc.Reply init = rt.post("/init", "{\"value\":{\"name\":\"hello\",\"main\":\"dev.cpuslot.samples.HelloWorld\",\"binary\":true,"
                + "\"env\":{\"CPUSLOT_QUOTA\":\"250m\"},\"code\":\"" + jar + "\"}}");
        assertEquals(200, init.status(), init.body());
        RuntimeProc.Reply run = rt.post("/run", "{\"value\":{\"name\":\"image\"}}");
        assertEquals(200, run.status(), run.body());
        assertEquals("Hello image!", run.json().get("greeting").getAsString());
        assertNotNull(run.header("X-Cpuslot-Slot"), "a slot, placed by writing to fds the agent passed: " + run.headers()
                + "\n" + Files.readString(work.resolve("runtime.log")));
        assertEquals("65534", Files.readAllLines(Path.of("/proc/" + rt.pid() + "/status")).stream()
                .filter(l -> l.startsWith("Uid:")).findFirst().orElseThrow().split("\\s+")[1], "runs as nobody");
        // the JVM took the AOT cache (a refused one is unmapped, and the JVM says why), and compiles a
        // Python function's code with Graal from the module path
        String log = Files.readString(work.resolve("runtime.log"));
        assertTrue(Files.readString(Path.of("/proc/" + rt.pid() + "/maps")).contains("/opt/cpuslot/runtime.aot"), "the AOT cache mapped\n" + log);
        assertFalse(log.contains("[aot]"), "the JVM said something of the AOT cache:\n" + log);
        RuntimeProc.Reply reg = rt.post("/register?name=py&language=python&entryPoint=main",
                "def main(args):\n    return {'hello': args['name']}\n");
        assertEquals(200, reg.status(), reg.body());
        RuntimeProc.Reply py = rt.invoke("py", "{\"name\":\"image\"}");
        assertEquals(200, py.status(), py.body());
        assertTrue(py.body().contains("image"), py.body());
        assertTrue(Files.readString(work.resolve("runtime.log")).contains("polyglot engine python: GraalVM CE"),
                "Python compiled by Graal:\n" + Files.readString(work.resolve("runtime.log")));
        // a 1-CPU, 512 Mi pod: the JVM picks Serial GC and an 8 MB initial heap, too small for the
        // cache's archived heap objects unless the entrypoint sizes it (e2e: the JVM refused to start)
        List<String> small = new ArrayList<>(cmd);
        small.add(small.indexOf("-jar"), "-XX:MaxRAM=512m");
        small.add(small.indexOf("-jar"), "-XX:ActiveProcessorCount=1");
        try (RuntimeProc smallPod = new RuntimeProc(small, Map.of("CPUSLOT_SOCKET", "/nonexistent.sock"), List.of(), work.resolve("small.log"))) {
            assertTrue(Files.readString(Path.of("/proc/" + smallPod.pid() + "/maps")).contains("/opt/cpuslot/runtime.aot"),
                    "the AOT cache mapped in a small pod's JVM\n" + Files.readString(work.resolve("small.log")));
        }
    }

    @AfterAll
    void cleanUp() throws Exception {
        try {
            if (rt != null) rt.close();
            if (agent != null) agent.stop();
            if (parent != null) {
                Agent.cleanup(agentBin, parent);
            }
        } finally {
            if (entered) run(null, "bash", chrootImage.toString(), "leave", rootfs.toString());
            if (rootfs != null) run(null, "rm", "-rf", rootfs.toString());
            if (unpacked != null) run(null, "rm", "-rf", unpacked.toString());
            if (tarball != null) Files.deleteIfExists(tarball);
        }
    }

    static String sha256Gunzipped(Path p) throws Exception {
        MessageDigest d = MessageDigest.getInstance("SHA-256");
        try (var in = new java.util.zip.GZIPInputStream(Files.newInputStream(p))) {
            byte[] buf = new byte[1 << 16];
            for (int n; (n = in.read(buf)) > 0; ) d.update(buf, 0, n);
        }
        return HexFormat.of().formatHex(d.digest());
    }

    static String sha256(Path p) throws Exception {
        MessageDigest d = MessageDigest.getInstance("SHA-256");
        try (var in = Files.newInputStream(p)) {
            byte[] buf = new byte[1 << 16];
            for (int n; (n = in.read(buf)) > 0; ) d.update(buf, 0, n);
        }
        return HexFormat.of().formatHex(d.digest());
    }
}
