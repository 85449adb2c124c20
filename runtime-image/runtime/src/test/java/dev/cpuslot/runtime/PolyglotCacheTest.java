package dev.cpuslot.runtime;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import dev.cpuslot.runtime.lang.PolyglotCache;

/** Where GraalVM's languages find their files: the read-only cache the image ships beside the jar. */
class PolyglotCacheTest {
    @TempDir Path jarDir;

    @Test
    void theCacheBesideTheJarIsTakenWhenTheImageShipsIt() throws Exception {
        Files.createDirectory(jarDir.resolve("polyglot"));
        assertEquals(Optional.of(jarDir.resolve("polyglot")), PolyglotCache.chosen(null, jarDir));
    }

    @Test
    void withoutItTruffleKeepsItsOwnCacheInTheUsersHome() {
        assertEquals(Optional.empty(), PolyglotCache.chosen(null, jarDir));
        assertEquals(Optional.empty(), PolyglotCache.chosen(null, null), "not started from a jar (tests, an IDE)");
    }

    @Test
    void aCacheNamedOnTheCommandLineWins() throws Exception {
        Files.createDirectory(jarDir.resolve("polyglot"));
        assertEquals(Optional.empty(), PolyglotCache.chosen("/elsewhere", jarDir));
    }

    @Test
    void aFileNamedPolyglotIsNoCache() throws Exception {
        Files.writeString(jarDir.resolve("polyglot"), "");
        assertEquals(Optional.empty(), PolyglotCache.chosen(null, jarDir));
    }
}
