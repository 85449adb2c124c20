package dev.cpuslot.conformance;

import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

import static dev.cpuslot.conformance.ActionContainer.*;
import static org.junit.jupiter.api.Assertions.*;

/**
 * apache/openwhisk-runtime-nodejs {@code NodeJsActionContainerTests.scala} (with
 * BasicActionRunnerTests), against the {@code javascript} kind: GraalJS with the Node.js surface
 * OpenWhisk actions use. Cases that need Node.js modules (require, fs, npm packages) are kept as
 * documented divergences: they check the clear error this runtime gives instead. Run twice, as
 * upstream: without and with {@code __OW_ALLOW_CONCURRENT}.
 */
abstract class NodeJsActionContainerTest extends BasicActionRunnerCases {
    @Override String kind() { return "javascript"; }

    @Override TestConfig testNoSourceOrExec() { return TestConfig.of(""); }

    @Override TestConfig testNotReturningJson() {
        return TestConfig.of("""
                function main(args) {
                    return "not a json object"
                }
                """).allowStderr();
    }

    @Override TestConfig testEcho() {
        return TestConfig.of("""
                function main(args) {
                    console.log('hello stdout')
                    console.error('hello stderr')
                    return args
                }
                """);
    }

    @Override TestConfig testUnicode() {
        return TestConfig.of("""
                function main(args) {
                    var str = args.delimiter + " ☃ " + args.delimiter;
                    console.log(str);
                    return { "winter": str };
                }
                """);
    }

    @Override TestConfig testEnv() {
        return TestConfig.of("""
                function main(args) {
                    return {
                       "api_host": process.env['__OW_API_HOST'],
                       "api_key": process.env['__OW_API_KEY'],
                       "namespace": process.env['__OW_NAMESPACE'],
                       "action_name": process.env['__OW_ACTION_NAME'],
                       "action_version": process.env['__OW_ACTION_VERSION'],
                       "activation_id": process.env['__OW_ACTIVATION_ID'],
                       "deadline": process.env['__OW_DEADLINE']
                    }
                }
                """);
    }

    @Override TestConfig testEnvParameters() {
        return TestConfig.of("""
                const envargs = {
                    "SOME_VAR": process.env.SOME_VAR,
                    "ANOTHER_VAR": process.env.ANOTHER_VAR
                }
                function main(args) {
                    return envargs
                }
                """);
    }

    static final String ECHO = """
            function main(args) {
                return args
            }
            """;

    @Override TestConfig testInitCannotBeCalledMoreThanOnce() { return TestConfig.of(ECHO); }
    @Override TestConfig testEntryPointOtherThanMain() { return TestConfig.of(" function niam(args) {\n     return args;\n }\n", "niam"); }
    @Override TestConfig testLargeInput() { return TestConfig.of(ECHO); }

    /** Upstream's {@code withNodeJsContainer}: the concurrent suite overrides the container env. */
    Map<String, String> nodeEnv() { return Map.of(); }

    String[] withNodeJsContainer(ContainerCode code) throws Exception { return withActionContainer(nodeEnv(), code); }

    static void emptyStreams(String o, String e) {
        assertEquals("", o);
        assertEquals("", e);
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: fail to initialize with bad code")
    void badCode() throws Exception {
        String[] logs = withNodeJsContainer(c -> assertNotEquals(200, c.init(initPayload(" 10 PRINT \"Hello world!\"\n 20 GOTO 10\n", "main")).code()));
        checkStreams(logs, (o, e) -> {
            assertTrue((o + e).toLowerCase().contains("error"), o + e);
            assertTrue((o + e).toLowerCase().contains("syntax"), o + e);
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: fail to initialize with no code")
    void noCode() throws Exception {
        withNodeJsContainer(c -> {
            Reply r = c.init(initPayload("", "main"));
            assertNotEquals(200, r.code());
            assertTrue(r.body().get("error").toString().contains("no code to execute"), String.valueOf(r.body()));
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: return some error on action error")
    void actionError() throws Exception {
        withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(" function main(args) {\n     throw \"nooooo\";\n }\n", "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertNotEquals(200, r.code());
            assertTrue(r.body().get("error").toString().toLowerCase().contains("nooooo"), String.valueOf(r.body()));
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support application errors")
    void applicationErrors() throws Exception {
        withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(" function main(args) {\n     return { \"error\" : \"sorry\" };\n }\n", "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertNotNull(r.body().get("error"));
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support the documentation examples (1)")
    void documentationExamples1() throws Exception {
        String code = """
                // an action in which each path results in a synchronous activation
                function main(params) {
                    if (params.payload == 0) {
                        return;
                    } else if (params.payload == 1) {
                        return {payload: 'Hello, World!'}         // indicates normal completion
                    } else if (params.payload == 2) {
                        return {error: 'payload must be 0 or 1'}  // indicates abnormal completion
                    }
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r1 = c.run(runPayload(json("{\"payload\":0}")));
            Reply r2 = c.run(runPayload(json("{\"payload\":1}")));
            Reply r3 = c.run(runPayload(json("{\"payload\":2}")));
            assertEquals(200, r1.code());
            assertEquals(new JsonObject(), r1.body());
            assertEquals(200, r2.code());
            assertEquals(json("{\"payload\":\"Hello, World!\"}"), r2.body());
            assertEquals(200, r3.code());
            assertEquals(new JsonPrimitive("payload must be 0 or 1"), r3.body().get("error"));
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams, 3);
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support the documentation examples (2)")
    void documentationExamples2() throws Exception {
        String code = """
                function main(params) {
                    if (params.payload) {
                        // asynchronous activation
                        return new Promise(function(resolve, reject) {
                               setTimeout(function() {
                                 resolve({ done: true });
                               }, 100);
                            })
                    } else {
                        // synchronous activation
                        return {done: true};
                    }
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r1 = c.run(runPayload(new JsonObject()));
            Reply r2 = c.run(runPayload(json("{\"payload\":true}")));
            assertEquals(200, r1.code());
            assertEquals(json("{\"done\":true}"), r1.body());
            assertEquals(200, r2.code());
            assertEquals(json("{\"done\":true}"), r2.body());
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams, 2);
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support variables with no var declaration")
    void noVarDeclaration() throws Exception {
        String code = """
                function main(params) {
                   greeting = 'hello, ' + params.payload + '!'
                   console.log(greeting);
                   return {payload: greeting}
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(json("{\"payload\":\"test\"}")));
            assertEquals(200, r.code());
            assertEquals(json("{\"payload\":\"hello, test!\"}"), r.body());
        });
        checkStreams(logs, (o, e) -> {
            assertEquals("hello, test!", o);
            assertEquals("", e);
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support webpacked function")
    void webpacked() throws Exception {
        String code = """
                function foo() {
                  return { bar: true }
                }
                global.main = foo
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(new JsonObject());
            assertEquals(200, r.code());
            assertEquals(json("{\"bar\":true}"), r.body());
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams);
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: error when requiring a non-existent package")
    void requireNonExistent() throws Exception {
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(" function main(args) {\n     require('.mildlyinvalidnameofanonexistentpackage');\n }\n", "main")).code());
            assertNotEquals(200, c.run(runPayload(new JsonObject())).code());
        });
        checkStreams(logs, (o, e) -> assertTrue((o + e).matches("(?s).*(Error|error).*"), o + e));
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: have openwhisk package available -- DIVERGENCE: no Node.js modules, require fails with a clear error")
    void openwhiskPackage() throws Exception {
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(" function main(args) {\n     require('openwhisk');\n     return { \"result\": true }\n }\n", "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(502, r.code());
            assertTrue(r.body().get("error").getAsString().contains("Cannot find module 'openwhisk'"), String.valueOf(r.body()));
        });
        checkStreams(logs, (o, e) -> assertTrue(e.contains("no Node.js modules"), e));
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support resolved promises")
    void resolvedPromises() throws Exception {
        String code = """
                function main(args) {
                    return new Promise(function(resolve, reject) {
                      setTimeout(function() {
                        resolve({ done: true });
                      }, 100);
                   })
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(json("{\"done\":true}"), r.body());
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams);
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support rejected promises")
    void rejectedPromises() throws Exception {
        String code = """
                function main(args) {
                    return new Promise(function(resolve, reject) {
                      setTimeout(function() {
                        reject({ done: true });
                      }, 100);
                   })
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertNotNull(r.body().get("error"));
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams);
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support rejected promises with no message")
    void rejectedPromisesNoMessage() throws Exception {
        withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(" function main(args) {\n     return new Promise(function (resolve, reject) {\n         reject();\n     });\n }", "main")).code());
            assertNotNull(c.run(runPayload(new JsonObject())).body().get("error"));
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests (async functions): an error thrown in an async main answers 200 with the error")
    void asyncError() throws Exception {
        withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload("async function main(args) { throw new Error('async boom'); }", "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(new JsonPrimitive("async boom"), r.body().get("error"));
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support large-ish actions")
    void largeAction() throws Exception {
        String assignment = "    x = \" I took the one less traveled by, and that has made all the difference.\";\n";
        String code = " function main(args) {\n     var x = \"hello\";\n" + assignment.repeat(7000)
                + "     x = \"world\";\n     return { \"message\" : x };\n }\n";
        assertTrue(code.length() >= 500000);
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(new JsonPrimitive("world"), r.body().get("message"));
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams);
    }

    static final String PACKAGE_JSON = """
            {
              "name": "wskaction",
              "version": "1.0.0",
              "description": "An OpenWhisk action as an npm package.",
              "main": "index.js",
              "author": "info@openwhisk.org",
              "license": "Apache-2.0"
            }
            """;

    void zipCase(Map<String, String> files, String main, String field, String expected) throws Exception {
        String code = Archives.zip(files);
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, main, true, null)).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(new JsonPrimitive(expected), r.body().get(field));
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams);
    }

    static final String GREETING = """
             exports.main = function (args) {
                 var name = typeof args["name"] === "string" ? args["name"] : "stranger";
                 return {
                     greeting: "Hello " + name + ", from %s."
                 };
             }
            """;

    @Test
    @DisplayName("NodeJsActionContainerTests: support zip-encoded npm package actions")
    void zipNpmPackage() throws Exception {
        zipCase(Map.of("package.json", PACKAGE_JSON, "index.js", GREETING.formatted("an npm package action")), "main",
                "greeting", "Hello stranger, from an npm package action.");
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support zip-encoded npm package actions without a package.json file")
    void zipWithoutPackageJson() throws Exception {
        zipCase(Map.of("index.js", GREETING.formatted("an npm package action without a package.json")), "main",
                "greeting", "Hello stranger, from an npm package action without a package.json.");
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support zip-encoded npm package with main from file other than index.js")
    void zipOtherFile() throws Exception {
        zipCase(Map.of("other.js", GREETING.replace("exports.main", "exports.niam").formatted("other.niam")), "other.niam",
                "greeting", "Hello stranger, from other.niam.");
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support nested main")
    void zipNestedMain() throws Exception {
        zipCase(Map.of("other.js", """
                 exports.niam = { xyz: function (args) {
                     var name = typeof args["name"] === "string" ? args["name"] : "stranger";
                     return { greeting: "Hello " + name + ", from nested main." };
                 } }
                """), "other.niam.xyz", "greeting", "Hello stranger, from nested main.");
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: allow zip-encoded npm package containing package.json and overriding entry point")
    void zipOverridingEntryPoint() throws Exception {
        zipCase(Map.of("package.json", PACKAGE_JSON,
                "index.js", " exports.main = function (args) {\n     return { result: \"it works\" };\n }\n",
                "other.js", "exports.niam = function (args) {\n     return { result: \"it should also work\" };\n }\n"),
                "other.niam", "result", "it should also work");
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: fail gracefully on invalid zip files")
    void invalidZip() throws Exception {
        String[] logs = withNodeJsContainer(c -> assertNotEquals(200, c.init(initPayload("Q2VjaSBuJ2VzdCBwYXMgdW4gemlwLgo=", "main", true, null)).code()));
        checkStreams(logs, (o, e) -> {
            assertTrue((o + e).toLowerCase().contains("error"), o + e);
            assertTrue((o + e).toLowerCase().matches("(?s).*(syntax|uncompressing).*"), o + e);
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: fail gracefully on valid zip files that are not actions")
    void zipNotAnAction() throws Exception {
        String code = Archives.zip(Map.of("hello", "\n Hello world!\n"));
        String[] logs = withNodeJsContainer(c -> assertNotEquals(200, c.init(initPayload(code, "main", true, null)).code()));
        checkStreams(logs, (o, e) -> {
            assertTrue((o + e).toLowerCase().matches("(?s).*(error|exited).*"), o + e);
            assertTrue((o + e).toLowerCase().contains("zipped actions must contain either package.json or index.js at the root."), o + e);
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support zipped actions using non-default entry point")
    void zipNonDefaultEntryPoint() throws Exception {
        String code = Archives.zip(Map.of("package.json", PACKAGE_JSON,
                "index.js", " exports.niam = function (args) {\n     return { result: \"it works\" };\n }\n"));
        withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "niam", true, null)).code());
            assertEquals(new JsonPrimitive("it works"), c.run(runPayload(new JsonObject())).body().get("result"));
        });
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: set correct cwd for zipped actions -- DIVERGENCE: no file system (fs), require fails with a clear error in the logs")
    void zipCwd() throws Exception {
        String code = Archives.zip(Map.of("package.json", PACKAGE_JSON, "test.txt", "test text", "index.js", """
                 const fs = require('fs');
                 exports.main = function (args) {
                     const fileData = fs.readFileSync('./test.txt').toString();
                     return { result1: fileData, result2: __dirname === process.cwd() };
                 }
                """));
        // /init's reply names why code does not load without quoting its text (the code may be
        // any file a /register named); the whole error is on the function's stderr.
        String[] logs = withNodeJsContainer(c -> {
            Reply r = c.init(initPayload(code, "main", true, null));
            assertEquals(502, r.code());
            String error = r.body().get("error").getAsString();
            assertTrue(error.contains("does not load"), String.valueOf(r.body()));
            assertFalse(error.contains("fs"), "the reply quotes the code: " + r.body());
        });
        checkStreams(logs, (o, e) -> assertTrue(e.contains("Cannot find module 'fs'"), e));
    }

    @Test
    @DisplayName("NodeJsActionContainerTests: support default function parameters")
    void defaultParameters() throws Exception {
        String code = """
                function main(args) {
                    let foo = 3;
                    return {isValid: (function (a, b = 2) {return a === 3 && b === 2;}(foo))};
                }
                """;
        String[] logs = withNodeJsContainer(c -> {
            assertEquals(200, c.init(initPayload(code, "main")).code());
            Reply r = c.run(runPayload(new JsonObject()));
            assertEquals(200, r.code());
            assertEquals(json("{\"isValid\":true}"), r.body());
        });
        checkStreams(logs, NodeJsActionContainerTest::emptyStreams);
    }

    // Not ported: "use user provided npm packages in a zip file" and "use user provided packages in
    // Docker Actions" need npm packages (node_modules, the openwhisk npm client): out of scope, see
    // runtime-image/README.md.

    static List<JsonObject> payloads(int n) {
        List<JsonObject> ps = new java.util.ArrayList<>();
        for (int i = 1; i <= n; i++) ps.add(runPayload(json("{\"arg" + i + "\":\"value" + i + "\"}")));
        return ps;
    }
}
