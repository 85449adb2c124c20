package dev.cpuslot.it;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.stream.Stream;

import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

/**
 * The host's cpu cgroup hierarchy, found in /proc/self/mountinfo: cgroup v1 (cpu, and cpuacct
 * when mounted apart) or cgroup v2 with the cpu controller. Creates test cgroups; node-agent
 * cleanup -tree removes them (Agent.cleanup).
 */
final class Cgroups {
    final int version;
    /** Where a test cgroup must exist: the cpu root, and the cpuacct root when separate (v1). */
    final List<Path> roots;

    private Cgroups(int version, List<Path> roots) {
        this.version = version;
        this.roots = roots;
    }

    /**
     * The hierarchy for a test that needs root and cgroups: without them the test is skipped, or
     * fails when CPUSLOT_REQUIRE_IT=1 (CI must not skip it silently). notRoot: why root is needed.
     */
    static Cgroups orSkip(String notRoot) throws IOException {
        boolean root = isRoot();
        String[] why = {notRoot};
        Cgroups cg = root ? detect(why) : null;
        if (cg == null) {
            if ("1".equals(System.getenv("CPUSLOT_REQUIRE_IT"))) fail("CPUSLOT_REQUIRE_IT=1 but " + why[0]);
            assumeTrue(false, why[0]);
        }
        return cg;
    }

    /** Whether this JVM runs as root (effective uid 0). */
    static boolean isRoot() throws IOException {
        return Files.readAllLines(Path.of("/proc/self/status")).stream()
                .anyMatch(l -> l.startsWith("Uid:") && l.split("\\s+")[2].equals("0"));
    }

    /** The hierarchy, or null with the reason in why[0]. */
    static Cgroups detect(String[] why) throws IOException {
        Path cpu = null, acct = null, unified = null;
        for (String line : Files.readAllLines(Path.of("/proc/self/mountinfo"))) {
            String[] halves = line.split(" - ", 2);
            if (halves.length < 2) continue;
            String[] pre = halves[0].split(" "), post = halves[1].split(" ");
            if (pre.length < 5 || post.length < 3) continue;
            Path mount = Path.of(pre[4].replace("\\040", " "));
            if (post[0].equals("cgroup")) {
                List<String> opts = Arrays.asList(post[2].split(","));
                if (opts.contains("cpu") && cpu == null) cpu = mount;
                if (opts.contains("cpuacct") && acct == null) acct = mount;
            } else if (post[0].equals("cgroup2") && unified == null) {
                unified = mount;
            }
        }
        if (cpu != null) {
            List<Path> roots = new ArrayList<>(List.of(cpu));
            if (acct != null && !acct.equals(cpu)) roots.add(acct);
            return new Cgroups(1, roots);
        }
        if (unified != null) {
            String ctl = Files.readString(unified.resolve("cgroup.controllers"));
            if (Arrays.asList(ctl.trim().split(" ")).contains("cpu")) return new Cgroups(2, List.of(unified));
            why[0] = "cgroup v2 at " + unified + " without the cpu controller";
            return null;
        }
        why[0] = "no cgroup hierarchy with the cpu controller";
        return null;
    }

    Path dir(Path root, String rel) { return root.resolve(rel.startsWith("/") ? rel.substring(1) : rel); }

    /** Creates rel (e.g. /cpuslot-it-123/rt) in every root; on v2 enables cpu for its children. */
    void create(String rel) throws IOException {
        for (Path r : roots) Files.createDirectories(dir(r, rel));
        if (version == 2) {
            Path p = dir(roots.get(0), rel).getParent();
            Files.writeString(p.resolve("cgroup.subtree_control"), "+cpu");
        }
    }

    /**
     * Gives a top-level test cgroup the largest CPU weight (v1 cpu.shares 262144, v2 cpu.weight
     * 10000), so that on a shared, busy machine the processes inside still get the CPU they ask
     * for (up to their slots' quotas) before other work does, as on a dedicated machine. Quotas
     * (the caps under test) are not affected.
     */
    void favour(String rel) throws IOException {
        Path d = dir(roots.get(0), rel);
        if (version == 1) Files.writeString(d.resolve("cpu.shares"), "262144");
        else Files.writeString(d.resolve("cpu.weight"), "10000");
    }

    /** The cgroup.procs files a process must be written to, to live in rel. */
    List<Path> procsFiles(String rel) {
        List<Path> l = new ArrayList<>();
        for (Path r : roots) l.add(dir(r, rel).resolve("cgroup.procs"));
        return l;
    }

    /** The cgroup (relative to the cpu root) a thread of a process is in. */
    String cgroupOf(long pid, long tid) throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/" + pid + "/task/" + tid + "/cgroup"))) {
            String[] f = line.split(":", 3);
            if (f.length < 3) continue;
            if (version == 2 ? f[0].equals("0") : Arrays.asList(f[1].split(",")).contains("cpu")) return f[2];
        }
        throw new IOException("no cpu cgroup for " + pid + "/" + tid);
    }

    /** Sets a cgroup's CPU limit in millicores (v1 cpu.cfs_quota_us, v2 cpu.max; period 100 ms). */
    void limit(String rel, long milli) throws IOException {
        Path d = dir(roots.get(0), rel);
        if (version == 1) Files.writeString(d.resolve("cpu.cfs_quota_us"), Long.toString(milli * 100));
        else Files.writeString(d.resolve("cpu.max"), milli * 100 + " 100000");
    }

    /** A cpu interface file of a cgroup, as text. */
    String read(String rel, String file) throws IOException { return Files.readString(dir(roots.get(0), rel).resolve(file)).trim(); }

    /** Test cgroups left by earlier runs whose process is gone: /cpuslot-it-<pid>. */
    List<String> stale() throws IOException {
        List<String> l = new ArrayList<>();
        try (Stream<Path> s = Files.list(roots.get(0))) {
            for (Path p : (Iterable<Path>) s::iterator) {
                String n = p.getFileName().toString();
                if (!n.startsWith("cpuslot-it-") || !Files.isDirectory(p)) continue;
                try {
                    String digits = n.substring("cpuslot-it-".length()).split("-")[0];
                    long pid = Long.parseLong(digits);
                    if (ProcessHandle.of(pid).isEmpty()) l.add("/" + n);
                } catch (NumberFormatException ignored) {
                }
            }
        }
        return l;
    }
}
