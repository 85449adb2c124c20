package dev.cpuslot.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * The cases of apache/openwhisk {@code tests/src/test/scala/actionContainers/BasicActionRunnerTests.scala},
 * re-written from their expectations; each language's subclass gives the actions (its runtime
 * suite's {@code TestConfig}s) and adds that suite's own cases.
 */
abstract class BasicActionRunnerCases {
    /** An action for one case (upstream {@code TestConfig}). */
    record TestConfig(String code, String main, boolean binary, boolean enforceEmptyOutputStream,
                      boolean enforceEmptyErrorStream, boolean hasCodeStub, boolean skipTest) {
        static TestConfig of(String code) { return new TestConfig(code, "main", false, true, true, false, false); }
        static TestConfig of(String code, String main) { return new TestConfig(code, main, false, true, true, false, false); }
        TestConfig asBinary() { return new TestConfig(code, main, true, enforceEmptyOutputStream, enforceEmptyErrorStream, hasCodeStub, skipTest); }
        TestConfig allowStderr() { return new TestConfig(code, main, binary, enforceEmptyOutputStream, false, hasCodeStub, skipTest); }
        TestConfig skip() { return new TestConfig(code, main, binary, enforceEmptyOutputStream, enforceEmptyErrorStream, hasCodeStub, true); }
        JsonObject init() { return initPayload(code, main, binary, null); }
    }

    /** The kind: the language the image is built for (CPUSLOT_LANGUAGE). */
    abstract String kind();

    abstract TestConfig testNoSourceOrExec();
    TestConfig testNoSource() { return testNoSourceOrExec(); }
    abstract TestConfig testNotReturningJson();
    abstract TestConfig testInitCannotBeCalledMoreThanOnce();
    abstract TestConfig testEntryPointOtherThanMain();
    abstract TestConfig testEcho();
    abstract TestConfig testUnicode();
    abstract TestConfig testEnv();
    abstract TestConfig testEnvParameters();
    abstract TestConfig testLargeInput();

    String[] withActionContainer(ContainerCode code) throws Exception { return ActionContainer.with(kind(), code); }

    String[] withActionContainer(Map<String, String> env, ContainerCode code) throws Exception {
        return ActionContainer.with(kind(), env, code);
    }

    @Test
    @DisplayName("BasicActionRunnerTests: handle initialization with no code")
    void initializationWithNoCode() throws Exception {
        TestConfig config = testNoSource();
        withActionContainer(c -> {
            Reply r = c.init(initPayload("", ""));
            if (config.hasCodeStub()) assertEquals(200, r.code());
            else assertNotEquals(200, r.code());
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: handle initialization with no content")
    void initializationWithNoContent() throws Exception {
        TestConfig config = testNoSourceOrExec();
        withActionContainer(c -> {
            Reply r = c.init(new JsonObject());
            if (!config.hasCodeStub()) {
                assertNotEquals(200, r.code());
                String e = r.body().get("error").getAsString();
                assertTrue(e.equals("Missing main/no code to execute.")
                        || e.equals("The action failed to generate or locate a binary. See logs for details."), e);
            } else {
                assertEquals(200, r.code());
            }
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: run and report an error for function not returning a json object")
    void notReturningJson() throws Exception {
        TestConfig config = testNotReturningJson();
        Assumptions.assumeFalse(config.skipTest(), "not possible in this language (upstream skips it too)");
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(config.init()).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertNotEquals(200, r.code());
            assertEquals(json("{\"error\":\"The action did not return a dictionary.\"}"), r.body());
        });
        checkStreams(logs, (o, e) -> {
            if (config.enforceEmptyOutputStream()) assertEquals("", o);
            if (config.enforceEmptyErrorStream()) assertEquals("", e);
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: fail to initialize a second time")
    void initTwice() throws Exception {
        TestConfig config = testInitCannotBeCalledMoreThanOnce();
        String msg = "Cannot initialize the action more than once.";
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(config.init()).code());
            Reply r = c.init(config.init());
            assertNotEquals(200, r.code());
            assertEquals(json("{\"error\":\"" + msg + "\"}"), r.body());
        });
        checkStreams(logs, (o, e) -> assertTrue((o + e).contains(msg)), 0);
    }

    @Test
    @DisplayName("BasicActionRunnerTests: invoke non-standard entry point")
    void nonStandardEntryPoint() throws Exception {
        TestConfig config = testEntryPointOtherThanMain();
        assertNotEquals("main", config.main());
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(config.init()).code());
            JsonObject arg = json("{\"string\":\"hello\"}");
            Reply r = c.run(runPayload(arg));
            assertEquals(200, r.code());
            assertEquals(arg, r.body());
        });
        checkStreams(logs, (o, e) -> {
            if (config.enforceEmptyOutputStream()) assertEquals("", o);
            assertEquals("", e);
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: echo arguments and print message to stdout/stderr")
    void echo() throws Exception {
        TestConfig config = testEcho();
        List<JsonObject> argss = List.of(json("{\"string\":\"hello\"}"), json("{\"string\":\"❄ ☃ ❄\"}"),
                json("{\"numbers\":[42,1]}"), json("{\"object\":{\"a\":\"A\"}}"));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(config.init()).code());
            for (JsonObject args : argss) {
                Reply r = c.run(runPayload(args));
                assertEquals(200, r.code());
                assertEquals(args, r.body());
            }
        });
        checkStreams(logs, (o, e) -> {
            assertTrue(o.contains("hello stdout"), o);
            if (!config.skipTest()) assertTrue(e.contains("hello stderr"), e);
        }, argss.size());
    }

    @Test
    @DisplayName("BasicActionRunnerTests: handle unicode in source, input params, logs, and result")
    void unicode() throws Exception {
        TestConfig config = testUnicode();
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(config.init()).code());
            Reply r = c.run(runPayload(json("{\"delimiter\":\"❄\"}")));
            assertEquals(new JsonPrimitive("❄ ☃ ❄"), r.body().get("winter"));
        });
        checkStreams(logs, (o, e) -> assertTrue(o.toLowerCase().contains("❄ ☃ ❄"), o));
    }

    @Test
    @DisplayName("BasicActionRunnerTests: export environment variables before initialization")
    void envParameters() throws Exception {
        TestConfig config = testEnvParameters();
        Map<String, JsonElement> env = Map.of("SOME_VAR", new JsonPrimitive("xyz"), "ANOTHER_VAR", new JsonPrimitive(""));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(config.code(), config.main(), config.binary(), env)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(new JsonPrimitive("xyz"), r.body().get("SOME_VAR"));
            assertEquals(new JsonPrimitive(""), r.body().get("ANOTHER_VAR"));
        });
        checkStreams(logs, (o, e) -> {
            if (config.enforceEmptyOutputStream()) assertEquals("", o);
            if (config.enforceEmptyErrorStream()) assertEquals("", e);
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: export environment variables before initialization (arrays, objects, numbers, booleans, null)")
    void envPartition() throws Exception {
        TestConfig config = testEnvParameters();
        // upstream's testEnvPartition: each JSON value exported as a string
        Map<String, JsonElement> env = Map.of("SOME_VAR", JsonParser.parseString("[\"a\",\"b\"]"),
                "ANOTHER_VAR", JsonParser.parseString("{\"a\":\"A\"}"));
        withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(config.code(), config.main(), config.binary(), env)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(JsonParser.parseString("[\"a\",\"b\"]"), JsonParser.parseString(r.body().get("SOME_VAR").getAsString()));
            assertEquals(JsonParser.parseString("{\"a\":\"A\"}"), JsonParser.parseString(r.body().get("ANOTHER_VAR").getAsString()));
        });
        Map<String, JsonElement> scalars = Map.of("SOME_VAR", new JsonPrimitive(3), "ANOTHER_VAR", JsonNull.INSTANCE);
        withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(config.code(), config.main(), config.binary(), scalars)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(new JsonPrimitive("3"), r.body().get("SOME_VAR"));
            assertEquals(new JsonPrimitive(""), r.body().get("ANOTHER_VAR"));
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: confirm expected environment variables")
    void expectedEnvironment() throws Exception {
        TestConfig config = testEnv();
        Map<String, String> props = Map.of("api_host", "xyz", "api_key", "abc", "namespace", "zzz", "action_name", "xxx",
                "action_version", "0.0.1", "activation_id", "iii", "deadline", "123");
        // the container gets __OW_API_HOST in its environment; /run carries all of them
        String[] logs = withActionContainer(env("__OW_API_HOST", "xyz"), c -> {
            assertEquals(200, c.init(config.init()).code());
            Reply r = c.run(runPayload(new JsonObject(), props));
            assertEquals(200, r.code(), String.valueOf(r.body()));
            props.forEach((k, v) -> assertEquals(new JsonPrimitive(v), r.body().get(k), k));
        });
        checkStreams(logs, (o, e) -> {
            if (config.enforceEmptyOutputStream()) assertEquals("", o);
            if (config.enforceEmptyErrorStream()) assertEquals("", e);
        });
    }

    @Test
    @DisplayName("BasicActionRunnerTests: echo a large input")
    void largeInput() throws Exception {
        TestConfig config = testLargeInput();
        withActionContainer(c -> {
            assertEquals(200, c.init(config.init()).code());
            JsonObject arg = new JsonObject();
            arg.addProperty("arg", "a".repeat(1048561));
            Reply r = c.run(runPayload(arg));
            assertEquals(arg, r.body());
        });
    }
}
