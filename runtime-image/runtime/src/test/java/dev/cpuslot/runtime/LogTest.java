package dev.cpuslot.runtime;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.*;
import dev.cpuslot.runtime.base.Config;
import dev.cpuslot.runtime.base.Log;

/** The runtime's own log lines: plain text by default, one JSON object per line with CPUSLOT_LOG_FORMAT=json. */
class LogTest {
    private final ByteArrayOutputStream out = new ByteArrayOutputStream();

    @AfterEach
    void textAgain() {
        Log.format("text");
        Log.to(null);
    }

    private List<String> lines() { return out.toString(StandardCharsets.UTF_8).lines().toList(); }

    @Test
    void jsonOneObjectPerLineWhateverTheMessageHolds() throws Exception {
        Log.to(new PrintStream(out, true, StandardCharsets.UTF_8));
        Log.format("json");
        // a message that would break a naive line: quotes, a newline, a backslash, a control character
        String hostile = "action \"x\"\nstatus=ok\\ \u0001 end";
        Log.info(hostile);
        Log.warn("careful");
        Log.activation("cpuslot: activation=a1 action=fib status=ok duration_ms=1.5");
        Log.stackTrace("request failed", new IllegalStateException("boom"));
        List<String> ls = lines();
        assertEquals(4, ls.size(), "one line per entry:\n" + out);
        JsonObject info = JsonParser.parseString(ls.get(0)).getAsJsonObject();
        assertEquals("INFO", info.get("level").getAsString());
        assertEquals("cpuslot-runtime", info.get("logger").getAsString());
        assertEquals(hostile, info.get("msg").getAsString(), "the message as given");
        assertNotNull(Instant.parse(info.get("time").getAsString()));
        assertEquals("WARN", JsonParser.parseString(ls.get(1)).getAsJsonObject().get("level").getAsString());
        JsonObject act = JsonParser.parseString(ls.get(2)).getAsJsonObject();
        assertEquals("activation", act.get("kind").getAsString());
        assertEquals("activation=a1 action=fib status=ok duration_ms=1.5", act.get("msg").getAsString());
        JsonObject st = JsonParser.parseString(ls.get(3)).getAsJsonObject();
        assertEquals("request failed", st.get("msg").getAsString());
        assertTrue(st.get("stack").getAsString().contains("IllegalStateException: boom"), ls.get(3));
    }

    @Test
    void textByDefault() {
        Log.to(new PrintStream(out, true, StandardCharsets.UTF_8));
        Log.info("hello");
        Log.activation("cpuslot: activation=a1 status=ok");
        List<String> ls = lines();
        assertTrue(ls.get(0).endsWith(" cpuslot-runtime INFO hello"), ls.get(0));
        assertEquals("cpuslot: activation=a1 status=ok", ls.get(1));
    }

    @Test
    void anUnknownFormatIsRefusedAtStart() {
        assertEquals("text", Config.from(Map.of()).logFormat());
        assertEquals("json", Config.from(Map.of("CPUSLOT_LOG_FORMAT", "JSON")).logFormat());
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Config.from(Map.of("CPUSLOT_LOG_FORMAT", "xml")));
        assertTrue(e.getMessage().contains("CPUSLOT_LOG_FORMAT"), e.getMessage());
    }
}
