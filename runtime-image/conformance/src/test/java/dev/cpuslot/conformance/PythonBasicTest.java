package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * apache/openwhisk-runtime-python {@code PythonBasicTests.scala} (with BasicActionRunnerTests),
 * against the {@code python} kind (GraalPy).
 */
@DisplayName("Python action (PythonBasicTests)")
class PythonBasicTest extends BasicActionRunnerCases {
    @Override String kind() { return "python"; }

    @Override TestConfig testNoSourceOrExec() { return TestConfig.of(""); }

    /**
     * Upstream's Python runtime (actionloop) accepts empty code with a stub. DIVERGENCE: this
     * runtime refuses empty code for every kind ("Missing main/no code to execute.").
     */
    @Override TestConfig testNoSource() { return TestConfig.of(""); }

    @Override TestConfig testNotReturningJson() { return TestConfig.of("def main(args):\n    return \"not a json object\"\n"); }
    @Override TestConfig testInitCannotBeCalledMoreThanOnce() { return TestConfig.of("def main(args):\n    return args\n"); }
    @Override TestConfig testEntryPointOtherThanMain() { return TestConfig.of("def niam(args):\n  return args\n", "niam"); }

    @Override TestConfig testEcho() {
        return TestConfig.of("""
                from __future__ import print_function
                import sys
                def main(args):
                    print('hello stdout')
                    print('hello stderr', file=sys.stderr)
                    return args
                """);
    }

    @Override TestConfig testUnicode() {
        return TestConfig.of("""
                # encoding: utf-8
                def main(args):
                    sep = args['delimiter']
                    str = sep + u" ☃ " + sep
                    print(str)
                    return {"winter" : str }""");
    }

    @Override TestConfig testEnv() {
        return TestConfig.of("""
                import os
                def main(dict):
                    return {
                       "api_host": os.environ['__OW_API_HOST'],
                       "api_key": os.environ['__OW_API_KEY'],
                       "namespace": os.environ['__OW_NAMESPACE'],
                       "action_name": os.environ['__OW_ACTION_NAME'],
                       "action_version": os.environ['__OW_ACTION_VERSION'],
                       "activation_id": os.environ['__OW_ACTIVATION_ID'],
                       "deadline": os.environ['__OW_DEADLINE']
                    }""");
    }

    @Override TestConfig testEnvParameters() {
        return TestConfig.of("""
                import os
                somevar = os.environ['SOME_VAR']
                another = os.environ['ANOTHER_VAR']

                def main(dict):
                    global somevar
                    global another
                    return {
                       "SOME_VAR": somevar,
                       "ANOTHER_VAR": another
                    }
                """);
    }

    @Override TestConfig testLargeInput() { return TestConfig.of("def main(args):\n    return args\n"); }

    @Test
    @DisplayName("PythonBasicTests: support zip-encoded action using non-default entry points")
    void zipNonDefaultEntryPoint() throws Exception {
        String code = Archives.zip(Map.of(
                "__main__.py", "from echo import echo\ndef niam(args):\n    return echo(args)\n",
                "echo.py", "def echo(args):\n  return { \"echo\": args }\n"));
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "niam", true, null)).code());
            JsonObject args = json("{\"msg\":\"it works\"}");
            Reply r = c.run(runPayload(args));
            assertEquals(200, r.code());
            assertEquals(args, r.body().get("echo"));
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertEquals("", e);
        });
    }

    @Test
    @DisplayName("PythonBasicTests: support zip-encoded action which can read from relative paths -- DIVERGENCE: no file system, open() fails")
    void zipRelativePaths() throws Exception {
        String code = Archives.zip(Map.of(
                "__main__.py", "def main(args):\n    with open('workfile', 'r') as f:\n      return { 'file': f.read() }\n",
                "workfile", "this is a test string"));
        withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main", true, null)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(502, r.code());
            assertNotNull(r.body().get("error"));
        });
    }

    @Test
    @DisplayName("PythonBasicTests: report error if zip-encoded action does not include required file")
    void zipWithoutMain() throws Exception {
        String code = Archives.zip(Map.of("echo.py", "def echo(args):\n  return { \"echo\": args }\n"));
        String[] logs = withActionContainer(c -> assertEquals(502, c.init(initPayload(code, "echo", true, null)).code()));
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertTrue(e.contains("Zip file does not include"), e);
        });
    }

    @Test
    @DisplayName("PythonBasicTests: return on action error when action fails")
    void actionFails() throws Exception {
        String code = "def div(x, y):\n    return x/y\n\ndef main(dict):\n    return {\"divBy0\": div(5,0)}\n";
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(502, r.code());
            assertNotNull(r.body().get("error"));
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertTrue(e.contains("Traceback"), e);
        });
    }

    @Test
    @DisplayName("PythonBasicTests: log compilation errors")
    void compilationErrors() throws Exception {
        String[] logs = withActionContainer(c -> assertEquals(502, c.init(initPayload(" 10 PRINT \"Hello!\"\n 20 GOTO 10\n", "main")).code()));
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertTrue(e.contains("Traceback"), e);
        });
    }

    @Test
    @DisplayName("PythonBasicTests: support application errors")
    void applicationErrors() throws Exception {
        String[] logs = withActionContainer(c -> {
            assertEquals(200, c.init(initPayload("def main(args):\n    return { \"error\": \"sorry\" }\n", "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(json("{\"error\":\"sorry\"}"), r.body());
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertEquals("", e);
        });
    }

    @Test
    @DisplayName("PythonBasicTests: error when importing a not-supported package")
    void unsupportedImport() throws Exception {
        String code = "import iamnotsupported\ndef main(args):\n    return { \"error\": \"not reaching here\" }\n";
        String[] logs = withActionContainer(c -> assertEquals(502, c.init(initPayload(code, "main")).code()));
        checkStreams(logs, (o, e) -> {
            assertEquals("", o);
            assertTrue(e.matches("(?s).*(Traceback|cannot start).*"), e);
        });
    }

    @Test
    @DisplayName("PythonBasicTests: have a valid sys.executable")
    void sysExecutable() throws Exception {
        withActionContainer(c -> {
            assertEquals(200, c.init(initPayload("import sys\ndef main(args):\n    return { \"sys\": sys.executable }\n", "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertTrue(r.body().get("sys").toString().contains("python"), String.valueOf(r.body()));
        });
    }

    @Test
    @DisplayName("Issue: a Python action whose comment says 'function ' is Python in the python kind")
    void pythonKindIsNotGuessed() throws Exception {
        withActionContainer(c -> {
            assertEquals(200, c.init(initPayload("# this function is Python\ndef main(args):\n    return {'ok': True}\n", "main")).code());
            assertEquals(new JsonPrimitive(true), c.run(runPayload(new JsonObject())).body().get("ok"));
        });
    }
}
