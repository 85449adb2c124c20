package dev.cpuslot.it;

import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/** The real node agent (cmd/node-agent), built from this repository and run standalone. */
final class Agent {
    static final HttpClient HTTP = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();

    final Path bin, socket, log;
    final String serveUnder, prewarm;
    final int httpPort;
    private Process process;
    private int starts;
    /** More flags for node-agent run (settings, e.g. --lend-ratio 0.5). */
    final List<String> extraArgs = new ArrayList<>();

    Agent(Path bin, Path socket, String serveUnder, String prewarm, int httpPort, Path log) {
        this.bin = bin;
        this.socket = socket;
        this.serveUnder = serveUnder;
        this.prewarm = prewarm;
        this.httpPort = httpPort;
        this.log = log;
    }

    /** The go command: $GO, else go on PATH, else the official tarball's place. */
    static String goCommand() {
        String env = System.getenv("GO");
        if (env != null && !env.isBlank()) return env;
        for (String d : System.getenv().getOrDefault("PATH", "").split(File.pathSeparator)) {
            if (!d.isEmpty() && Files.isExecutable(Path.of(d, "go"))) return Path.of(d, "go").toString();
        }
        if (Files.isExecutable(Path.of("/usr/local/go/bin/go"))) return "/usr/local/go/bin/go";
        throw new IllegalStateException("the integration tests build the agent with Go: put go on PATH or set GO");
    }

    /** go build ./cmd/node-agent into out. */
    static Path build(Path repo, Path out) throws IOException, InterruptedException {
        Files.createDirectories(out.getParent());
        Path buildLog = out.resolveSibling("go-build.log");
        Process p = new ProcessBuilder(goCommand(), "build", "-o", out.toString(), "./cmd/node-agent")
                .directory(repo.toFile()).redirectErrorStream(true).redirectOutput(buildLog.toFile()).start();
        if (!p.waitFor(10, TimeUnit.MINUTES) || p.exitValue() != 0)
            throw new IllegalStateException("go build ./cmd/node-agent failed:\n" + Files.readString(buildLog));
        return out;
    }

    /** Starts the agent and waits until /readyz answers 200. */
    void start() throws Exception {
        List<String> cmd = new ArrayList<>(List.of(bin.toString(), "run", "--socket", socket.toString(),
                "--serve-under", serveUnder, "--http", "127.0.0.1:" + httpPort, "--prewarm", prewarm, "--log-level", "info",
                // The runtimes here run in the host's PID namespace; a pod runs in its own, and the agent passes
                // placement fds to it by default. This makes the agent treat these runtimes as it treats pods.
                "--host-namespace-fds"));
        cmd.addAll(extraArgs);
        starts++;
        Files.writeString(log, "---- start " + starts + ": " + String.join(" ", cmd) + "\n",
                java.nio.file.StandardOpenOption.CREATE, java.nio.file.StandardOpenOption.APPEND);
        process = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile())).start();
        long until = System.nanoTime() + 30_000_000_000L;
        while (System.nanoTime() < until) {
            if (!process.isAlive()) throw new IllegalStateException("agent exited " + process.exitValue() + ":\n" + Files.readString(log));
            try {
                if (get("/readyz").statusCode() == 200 && Files.exists(socket)) return;
            } catch (IOException notYet) {
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("agent not ready within 30 s:\n" + Files.readString(log));
    }

    boolean alive() { return process != null && process.isAlive(); }

    /** SIGKILL: no cleanup, slots stay (a crash). */
    void kill() throws InterruptedException {
        if (process == null) return;
        process.destroyForcibly();
        process.waitFor(10, TimeUnit.SECONDS);
    }

    /** SIGTERM, then SIGKILL after 10 s. */
    void stop() throws InterruptedException {
        if (process == null || !process.isAlive()) return;
        process.destroy();
        if (!process.waitFor(10, TimeUnit.SECONDS)) kill();
    }

    /**
     * node-agent cleanup -under -tree: removes every slot below a cgroup, then the cgroup and every
     * cgroup below it (bottom up, in every root of the cpu hierarchy, retrying while busy).
     */
    static String cleanup(Path bin, String under) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(bin.toString(), "cleanup", "--under", under, "--tree", "--wait", "10s").redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        p.waitFor(30, TimeUnit.SECONDS);
        if (p.exitValue() != 0) throw new IOException("node-agent cleanup --under " + under + " --tree: " + out);
        return out.trim();
    }

    HttpResponse<String> get(String path) throws IOException, InterruptedException {
        return HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + httpPort + path)).timeout(Duration.ofSeconds(5)).build(),
                HttpResponse.BodyHandlers.ofString());
    }

    Map<String, Double> metrics() throws IOException, InterruptedException { return Prom.parse(get("/metrics").body()); }
}
