package dev.cpuslot.it;

import java.io.IOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * The project's convention for CPU-sensitive runs: while /tmp/cpuslot-quiet exists someone is
 * measuring, so wait (poll every 10 s) until it is gone, then hold it ourselves until done.
 * CPUSLOT_QUIET_FILE changes the path; an empty value turns the convention off.
 */
final class Quiet implements AutoCloseable {
    private final Path file;

    private Quiet(Path file) { this.file = file; }

    static Quiet hold() throws IOException, InterruptedException {
        String p = System.getenv().getOrDefault("CPUSLOT_QUIET_FILE", "/tmp/cpuslot-quiet");
        if (p.isEmpty()) return new Quiet(null);
        Path f = Path.of(p);
        long waited = 0;
        while (true) {
            try {
                Files.writeString(f, "dev.cpuslot.it pid " + ProcessHandle.current().pid() + "\n",
                        java.nio.file.StandardOpenOption.CREATE_NEW, java.nio.file.StandardOpenOption.WRITE);
                return new Quiet(f);
            } catch (FileAlreadyExistsException busy) {
                if (waited % 60 == 0) System.out.println("[it] " + f + " exists: someone is measuring; waiting");
                Thread.sleep(10_000);
                waited += 10;
            }
        }
    }

    @Override
    public void close() throws IOException {
        if (file != null) Files.deleteIfExists(file);
    }
}
