package dev.cpuslot.runtime;

import com.google.gson.JsonObject;
import org.junit.jupiter.api.Test;

import java.util.Map;

import static dev.cpuslot.runtime.Harness.*;
import static org.junit.jupiter.api.Assertions.*;
import dev.cpuslot.runtime.exec.Function;
import dev.cpuslot.runtime.lang.PolyglotFunction;

class PolyglotTest {
    static final String JS = """
            let calls = 0;
            function main(args) {
              calls++;
              console.log('js says hi');
              return { greeting: 'Hello ' + (args.name || 'stranger'), calls: calls,
                       activation: process.env.__OW_ACTIVATION_ID };
            }
            function answer(args) { return 42; }
            async function later(args) { return { later: args.n * 2 }; }
            function spin(args) { while (true) {} }
            function sneaky(args) { return { java: typeof Java, polyglotEval: typeof Polyglot }; }
            """;

    static final String PY = """
            import os
            state = {"calls": 0}
            def main(args):
                state["calls"] += 1
                print("py says hi")
                return {"greeting": "Hello " + args.get("name", "stranger"), "calls": state["calls"],
                        "activation": os.environ.get("__OW_ACTIVATION_ID")}
            def bad(args):
                raise ValueError("py boom")
            """;

    @Test
    void javascriptActionRunsWithEnvAndPerWorkerState() throws Exception {
        try (Harness h = new Harness(Map.of("CPUSLOT_SANDBOXES_PER_FUNCTION", "1"), null)) {
            assertEquals(200, h.post("/init", initCode(JS, "main", Map.of())).status());
            Resp r = h.post("/run", run(json("{\"name\":\"Jo\"}"), Map.of("activation_id", "js-1")));
            assertEquals(200, r.status(), r.raw());
            assertEquals("Hello Jo", r.obj().get("greeting").getAsString());
            assertEquals("js-1", r.obj().get("activation").getAsString());
            Resp r2 = h.post("/run", run(new JsonObject()));
            assertEquals(2, r2.obj().get("calls").getAsInt(), "the worker's context is reused");
            assertTrue(h.stdout().contains("js says hi"));
        }
    }

    @Test
    void javascriptNonObjectPromiseAndSandboxing() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initCode(JS, "answer", Map.of()));
            assertEquals("The action did not return a dictionary.", h.post("/run", run(new JsonObject())).obj().get("error").getAsString());
        }
        try (Harness h = new Harness()) {
            h.post("/init", initCode(JS, "later", Map.of()));
            Resp r = h.post("/run", run(json("{\"n\":21}")));
            assertEquals(200, r.status(), r.raw());
            assertEquals(42, r.obj().get("later").getAsInt());
        }
        try (Harness h = new Harness()) {
            h.post("/init", initCode(JS, "sneaky", Map.of()));
            Resp r = h.post("/run", run(new JsonObject()));
            assertEquals("undefined", r.obj().get("java").getAsString(), "no host access");
        }
    }

    @Test
    void javascriptThatNeverReturnsIsCancelledAtTheDeadline() throws Exception {
        try (Harness h = new Harness()) {
            h.post("/init", initCode(JS, "spin", Map.of()));
            long t0 = System.nanoTime();
            Resp r = h.post("/run", run(new JsonObject(), Map.of("deadline", Long.toString(System.currentTimeMillis() + 500))));
            assertEquals(502, r.status());
            assertTrue((System.nanoTime() - t0) / 1_000_000 < 3000);
            long until = System.nanoTime() + 5_000_000_000L;
            while (h.rt.metrics().scrape().contains("state=\"busy\"} 1") && System.nanoTime() < until) Thread.sleep(20);
            assertFalse(h.rt.metrics().scrape().contains("state=\"busy\"} 1"), "the spinning context was cancelled");
        }
    }

    /** localeCompare as node answers it (node 20: the same object), with the runtime's shared default collator. */
    @Test
    void javascriptLocaleCompareAnswersAsNodes() throws Exception {
        String code = """
                function main(args) {
                  function err(f) { try { f(); return 'no error'; } catch (e) { return e.constructor.name; } }
                  Intl.Collator = function () { throw new Error('not the built-in'); }; // what the built-in never calls
                  return { order: ['b', 'a', 'B', 'A', '\u00e4', 'z'].sort(function (x, y) { return x.localeCompare(y); }).join(),
                    base: 'a'.localeCompare('A', undefined, { sensitivity: 'base' }), sv: '\u00e4'.localeCompare('z', 'sv'),
                    root: '\u00e4'.localeCompare('z'), undef: 'a'.localeCompare(), num: 'item-10'.localeCompare('item-9'),
                    numeric: 'item-10'.localeCompare('item-9', undefined, { numeric: true }), objThis: String.prototype.localeCompare.call(12, '9'),
                    length: String.prototype.localeCompare.length, name: String.prototype.localeCompare.name,
                    nullThis: err(function () { String.prototype.localeCompare.call(null, 'a'); }),
                    symbol: err(function () { 'a'.localeCompare(Symbol()); }),
                    ctor: err(function () { new ''.localeCompare('a'); }),
                    desc: JSON.stringify(Object.getOwnPropertyDescriptor(String.prototype, 'localeCompare')) };
                }
                """;
        try (Harness h = new Harness()) {
            assertEquals(200, h.post("/init", initCode(code, "main", Map.of())).status());
            Resp r = h.post("/run", run(new JsonObject()));
            assertEquals(200, r.status(), r.raw());
            assertEquals(json("""
                    {"order":"a,A,\u00e4,b,B,z","base":0,"sv":1,"root":-1,"undef":-1,"num":-1,"numeric":1,"objThis":-1,"length":1,
                     "name":"localeCompare","nullThis":"TypeError","symbol":"TypeError","ctor":"TypeError",
                     "desc":"{\\"writable\\":true,\\"enumerable\\":false,\\"configurable\\":true}"}"""), r.obj());
        }
    }

    /**
     * Array.prototype.sort with a comparator (the runtime's, in JavaScript) answers as node 20 and as
     * GraalJS's built-in did: holes and undefined, stability, the comparator's result as ToNumber
     * (NaN as 0), an error from it leaving the array as it was, what is refused, an array-like, a
     * proxy's traps in the language's order, an index accessor on Array.prototype, the method's shape.
     */
    @Test
    void javascriptSortWithAComparatorAnswersAsNodes() throws Exception {
        String code = """
                function main(args) {
                  function err(f) { try { f(); return 'no error'; } catch (e) { return e.constructor.name + (e.message === 'boom' ? ': boom' : ''); } }
                  var holes = [5, undefined, 3, , 1, 3, 2];
                  holes.sort(function (x, y) { return x - y; });
                  var recs = [];
                  for (var i = 0; i < 500; i++) recs.push({ k: (i * 7) % 5, i: i });
                  recs.sort(function (x, y) { return x.k - y.k; });
                  var stable = recs.every(function (r, j) { return j === 0 || recs[j - 1].k < r.k || (recs[j - 1].k === r.k && recs[j - 1].i < r.i); });
                  var big = [];
                  for (var i = 0; i < 2000; i++) big.push((i * 7919) % 2003);
                  var desc = big.slice().sort(function (x, y) { return y - x; }).join() === big.slice().sort(function (x, y) { return x - y; }).reverse().join();
                  var thrown = [3, 1, 2];
                  var boom = err(function () { thrown.sort(function () { throw new Error('boom'); }); });
                  var log = [];
                  var p = new Proxy([2, , 1], { has(t, k) { log.push('has ' + String(k)); return Reflect.has(t, k); },
                    get(t, k, r) { log.push('get ' + String(k)); return Reflect.get(t, k, r); },
                    set(t, k, v, r) { log.push('set ' + String(k)); return Reflect.set(t, k, v, r); },
                    deleteProperty(t, k) { log.push('delete ' + String(k)); return Reflect.deleteProperty(t, k); } });
                  Array.prototype.sort.call(p, function (x, y) { return x - y; });
                  var protoHits = 0;
                  Object.defineProperty(Array.prototype, '0', { get() { protoHits++; return 9; }, set(v) { protoHits += 100; }, configurable: true });
                  var sparse = [, 4, 2];
                  sparse.sort(function (x, y) { return x - y; });
                  var other = [3, 1, 2].sort(function (x, y) { return x - y; });
                  delete Array.prototype[0];
                  var thisIn = null;
                  [2, 1].sort(function (x, y) { 'use strict'; thisIn = typeof this; return x - y; });
                  var valueOfCalls = 0;
                  var viaValueOf = [3, 1, 2].sort(function (x, y) { return { valueOf: function () { valueOfCalls++; return x - y; } }; });
                  return {
                    holes: JSON.stringify(holes), holesKeys: Object.keys(holes).join(), holesLength: holes.length,
                    stable: stable, desc: desc, boom: boom, thrown: thrown.join(),
                    nan: [3, 1, 2].sort(function () { return NaN; }).join(), strings: [3, 1, 2].sort(function (x, y) { return x > y ? '1' : '-1'; }).join(),
                    viaValueOf: viaValueOf.join(), valueOfCalled: valueOfCalls > 0,
                    notCallable: err(function () { [1, 2].sort(null); }), objectCmp: err(function () { [1, 2].sort({}); }),
                    defaultOrder: [10, 9, 1, undefined].sort(undefined).join(),
                    arrayLike: JSON.stringify(Array.prototype.sort.call({ length: 3, 0: 'c', 1: 'a', 2: 'b' }, function (x, y) { return x < y ? -1 : x > y ? 1 : 0; })),
                    frozen: err(function () { Object.freeze([2, 1]).sort(function (x, y) { return x - y; }); }),
                    nullThis: err(function () { Array.prototype.sort.call(null, function () { return 0; }); }),
                    bigint: err(function () { [2, 1].sort(function () { return 1n; }); }),
                    proxy: log.join(), sparse: JSON.stringify(sparse), other: other.join(), protoHits: protoHits, thisIn: thisIn,
                    returnsSelf: (function () { var a = [2, 1]; return a.sort(function (x, y) { return x - y; }) === a; })(),
                    length: Array.prototype.sort.length, name: Array.prototype.sort.name,
                    ctor: err(function () { new [].sort(function () { return 0; }); }),
                    desc2: JSON.stringify(Object.getOwnPropertyDescriptor(Array.prototype, 'sort'))
                  };
                }
                """;
        try (Harness h = new Harness()) {
            assertEquals(200, h.post("/init", initCode(code, "main", Map.of())).status());
            Resp r = h.post("/run", run(new JsonObject()));
            assertEquals(200, r.status(), r.raw());
            assertEquals(json("""
                    {"holes":"[1,2,3,3,5,null,null]","holesKeys":"0,1,2,3,4,5","holesLength":7,"stable":true,"desc":true,"boom":"Error: boom","thrown":"3,1,2","nan":"3,1,2","strings":"1,2,3","viaValueOf":"1,2,3","valueOfCalled":true,"notCallable":"TypeError","objectCmp":"TypeError","defaultOrder":"1,10,9,","arrayLike":"{\\"0\\":\\"a\\",\\"1\\":\\"b\\",\\"2\\":\\"c\\",\\"length\\":3}","frozen":"TypeError","nullThis":"TypeError","bigint":"TypeError","proxy":"get length,has 0,get 0,has 1,has 2,get 2,set 0,set 1,delete 2","sparse":"[null,4,9]","other":"1,2,3","protoHits":101,"thisIn":"undefined","returnsSelf":true,"length":1,"name":"sort","ctor":"TypeError","desc2":"{\\"writable\\":true,\\"enumerable\\":false,\\"configurable\\":true}"}"""), r.obj());
        }
    }

    @Test
    void badJavascriptFailsInit() throws Exception {
        try (Harness h = new Harness()) {
            Resp r = h.post("/init", initCode("function main( {", "main", Map.of()));
            assertNotEquals(200, r.status());
            Resp n = h.post("/init", initCode("function other(){}", "main", Map.of()));
            assertNotEquals(200, n.status());
            assertTrue(n.obj().get("error").getAsString().contains("main"));
        }
    }

    @Test
    void pythonActionRunsWithEnvAndErrors() throws Exception {
        try (Harness h = new Harness(Map.of("CPUSLOT_SANDBOXES_PER_FUNCTION", "1"), null)) {
            Resp init = h.post("/init", initCode(PY, "main", Map.of()));
            assertEquals(200, init.status(), init.raw());
            Resp r = h.post("/run", run(json("{\"name\":\"Py\"}"), Map.of("activation_id", "py-1")));
            assertEquals(200, r.status(), r.raw());
            assertEquals("Hello Py", r.obj().get("greeting").getAsString());
            assertEquals("py-1", r.obj().get("activation").getAsString());
            assertEquals(2, h.post("/run", run(new JsonObject())).obj().get("calls").getAsInt());
        }
        try (Harness h = new Harness()) {
            h.post("/init", initCode(PY, "bad", Map.of("CPUSLOT_LANGUAGE", "python")));
            Resp r = h.post("/run", run(new JsonObject()));
            assertEquals(502, r.status());
            assertTrue(r.obj().get("error").getAsString().contains("py boom"), r.raw());
        }
    }

    /**
     * A Python function's context loads no standard module for the runtime's own use: arguments,
     * results and the environment cross through GraalPy's built-in {@code _json} and
     * {@code posix.environ}, so a cold context does not pay {@code import json} (which compiles
     * {@code re}'s patterns) nor {@code import os}. What the function sees is as before: its
     * values, {@code os.environ} with the /init env and the activation's {@code __OW_*} only,
     * CPython's error for a result that is not JSON.
     */
    @Test
    void pythonContextLoadsNoStandardModuleTheFunctionDidNotImport() throws Exception {
        String code = """
                import sys
                def main(args):
                    loaded = sorted(m for m in ('json', 're', 'os') if m in sys.modules)
                    import os
                    return {'loaded': loaded, 'echo': args, 'who': os.environ.get('WHO'),
                            'activation': os.environ.get('__OW_ACTIVATION_ID'), 'nan': float('nan'), 7: None}
                def notjson(args):
                    return {'s': {1, 2}}
                def loop(args):
                    l = []
                    l.append(l)
                    return {'l': l}
                """;
        try (PolyglotFunction f = new PolyglotFunction("lean", "python", code, "main", Map.of("WHO", "init"));
             PolyglotFunction bad = new PolyglotFunction("notjson", "python", code, "notjson", Map.of());
             PolyglotFunction circ = new PolyglotFunction("loop", "python", code, "loop", Map.of())) {
            Function.Sandbox s = f.newSandbox();
            try {
                String args = "{\"s\":\"q\\\"b\\\\s\\u0001\u00e9\u2603\",\"n\":-1.5,\"i\":42,\"l\":[null,true,false,{}],\"o\":{\"k\":[]}}";
                JsonObject r = s.invoke(json(args), Map.of("__OW_ACTIVATION_ID", "a-1", "__OW_DEADLINE", "1")).getAsJsonObject();
                assertEquals(0, r.getAsJsonArray("loaded").size(), "the runtime loaded modules for itself: " + r);
                assertEquals(json(args), r.get("echo"));
                assertEquals("init", r.get("who").getAsString());
                assertEquals("a-1", r.get("activation").getAsString());
                assertTrue(Double.isNaN(r.get("nan").getAsDouble()), r.toString());
                assertTrue(r.get("7").isJsonNull(), r.toString());
                JsonObject r2 = s.invoke(json("{}"), Map.of()).getAsJsonObject();
                assertTrue(r2.get("activation").isJsonNull(), "the last activation's __OW_ env stays: " + r2);
                assertEquals("init", r2.get("who").getAsString());
            } finally {
                s.close();
            }
            Function.Sandbox b = bad.newSandbox(), c = circ.newSandbox();
            try {
                var e = assertThrows(Function.FunctionError.class, () -> b.invoke(json("{}"), Map.of()));
                assertTrue(e.getMessage().contains("Object of type set is not JSON serializable"), e.getMessage());
                var e2 = assertThrows(Function.FunctionError.class, () -> c.invoke(json("{}"), Map.of()));
                assertTrue(e2.getMessage().contains("Circular reference detected"), e2.getMessage());
            } finally {
                b.close();
                c.close();
            }
        }
    }

    /**
     * {@code json.loads} in a function parses numbers as CPython's does, natively: GraalPy's
     * {@code _json} scanner took its native number parsing only when {@code parse_float} /
     * {@code parse_int} were float / int instances, so json's defaults (the float and int types)
     * called {@code float(s)} / {@code int(s)} through Python for every number (most of the json
     * workload's time, docs/benchmarks.md). The runtime's {@code make_scanner} takes the native path
     * where CPython takes its own (the hooks are float and int); hooks a function passes are called
     * as before, values and errors are CPython's (the expected values are CPython 3.11's), and a
     * function that replaces its {@code _json.make_scanner} changes no other function's.
     */
    @Test
    void pythonJsonLoadsParsesNumbersNativelyAsCPythonDoes() throws Exception {
        String code = """
                import json, math
                def main(args):
                    r = {}
                    v = json.loads('[1.5, -7, 1e400, -1e400, -0.0, 12345678901234567890123, 2E-3, 0, -0, 1E+2, 0.1]')
                    r['values'] = repr(v)
                    r['types'] = [type(x).__name__ for x in v]
                    r['nan'] = math.isnan(json.loads('NaN'))
                    r['hooks'] = repr(json.loads('[1.1, 2, {"a": 3}]', parse_float=lambda s: ('f', s), parse_int=lambda s: ('i', s),
                                                 object_pairs_hook=lambda p: ('o', p)))
                    r['object_hook'] = repr(json.loads('{"a": 1.25}', object_hook=lambda d: sorted(d.items())))
                    r['constant'] = repr(json.loads('[Infinity, -Infinity]', parse_constant=lambda s: s))
                    r['explicit'] = repr(json.JSONDecoder(parse_float=float, parse_int=int).decode('[1.0, 2]'))
                    r['decoder'] = repr(json.JSONDecoder().raw_decode('{"x": [3.25]} tail'))
                    r['strict'] = repr(json.loads('"a\\\\tb\\tc"', strict=False))
                    errors = []
                    for bad in ['[1,]', '{"a" 1}', '[1.5e]', '[1 2]', '-', '"a\\tb"', '{"a": 1}x', '[-]', '[1.]', '[01]']:
                        try:
                            json.loads(bad)
                            errors.append(None)
                        except json.JSONDecodeError as e:
                            errors.append([e.msg, e.pos])
                    r['errors'] = errors
                    try:
                        json.loads('1' * 5000)
                        r['digits'] = 'parsed'
                    except ValueError as e:
                        r['digits'] = type(e).__name__
                    return r
                def tamper(args):
                    import _json
                    _json.make_scanner = None  # its own context's module only
                    return {'tampered': True}
                def scanner(args):
                    import _json
                    # the scanner json's decoders are made with: the runtime's (a function), not GraalPy's type
                    return {'runtime': type(json.scanner.make_scanner).__name__ == 'function', 'own': _json.make_scanner is json.scanner.make_scanner}
                """;
        try (PolyglotFunction f = new PolyglotFunction("loads", "python", code, "main", Map.of());
             PolyglotFunction tamper = new PolyglotFunction("tamper", "python", code, "tamper", Map.of());
             PolyglotFunction scanner = new PolyglotFunction("scanner", "python", code, "scanner", Map.of())) {
            Function.Sandbox s = f.newSandbox();
            try {
                JsonObject r = s.invoke(json("{}"), Map.of()).getAsJsonObject();
                assertEquals("[1.5, -7, inf, -inf, -0.0, 12345678901234567890123, 0.002, 0, 0, 100.0, 0.1]", r.get("values").getAsString());
                assertEquals(com.google.gson.JsonParser.parseString("[\"float\",\"int\",\"float\",\"float\",\"float\",\"int\",\"float\",\"int\",\"int\",\"float\",\"float\"]"), r.get("types"));
                assertTrue(r.get("nan").getAsBoolean(), r.toString());
                assertEquals("[('f', '1.1'), ('i', '2'), ('o', [('a', ('i', '3'))])]", r.get("hooks").getAsString(), "the function's hooks are called");
                assertEquals("[('a', 1.25)]", r.get("object_hook").getAsString());
                assertEquals("['Infinity', '-Infinity']", r.get("constant").getAsString());
                assertEquals("[1.0, 2]", r.get("explicit").getAsString());
                assertEquals("({'x': [3.25]}, 13)", r.get("decoder").getAsString());
                assertEquals("'a\\tb\\tc'", r.get("strict").getAsString());
                assertEquals("ValueError", r.get("digits").getAsString(), "CPython's limit of 4,300 digits");
                assertEquals(com.google.gson.JsonParser.parseString("""
                        [["Expecting value", 3], ["Expecting ':' delimiter", 5], ["Expecting ',' delimiter", 4], ["Expecting ',' delimiter", 3],
                         ["Expecting value", 0], ["Invalid control character at", 2], ["Extra data", 8], ["Expecting value", 1],
                         ["Expecting ',' delimiter", 2], ["Expecting ',' delimiter", 2]]
                        """), r.get("errors"));
            } finally {
                s.close();
            }
            Function.Sandbox t = tamper.newSandbox();
            try {
                assertTrue(t.invoke(json("{}"), Map.of()).getAsJsonObject().get("tampered").getAsBoolean());
            } finally {
                t.close();
            }
            Function.Sandbox sc = scanner.newSandbox();
            try {
                JsonObject r = sc.invoke(json("{}"), Map.of()).getAsJsonObject();
                assertTrue(r.get("runtime").getAsBoolean(), "json's decoders use GraalPy's scanner with its Python number hooks: " + r);
                assertTrue(r.get("own").getAsBoolean(), "another function's _json reached this one: " + r);
            } finally {
                sc.close();
            }
        }
    }

    /**
     * The prewarm's context (made before /init, the image's language) is the first function's:
     * /init does not make a second one. It carries that function's /init env, and only that
     * function gets it. Each context taken is replaced in the background, so that the next
     * function of the language (a Hydra /register, a second worker) starts in a context made
     * before it asked, not during its /register; each prewarmed context goes to one function
     * once, and none sees another function's state.
     */
    @Test
    void everyFunctionStartsInAPrewarmedContextOfItsOwn() throws Exception {
        PolyglotFunction.prewarm("python", 0);
        // the compiler's warm-up (CPUSLOT_COMPILER_WARMUP) ends at its budget, which making its context
        // alone takes, and runs in a context of its own: its names are no function's
        assertEquals(0, PolyglotFunction.warmCompiler("python", 1), "the compiler's warm-up called past its budget");
        PolyglotFunction.warmCompiler("python", 3_000);
        int before = PolyglotFunction.prewarmedContextsTaken();
        String code = """
                import os, builtins
                def main(args):
                    seen = getattr(builtins, 'marker', None)
                    builtins.marker = args.get('mark')
                    return {'seen': seen, 'env': os.environ.get('WHO'), 'leaked': sorted(n for n in ('json', 'sys', '_json', '_fib', '_warm') if n in globals())}
                """;
        try (PolyglotFunction a = new PolyglotFunction("first", "python", code, "main", Map.of("WHO", "first"));
             PolyglotFunction b = new PolyglotFunction("second", "python", code, "main", Map.of("WHO", "second"))) {
            assertEquals(before + 2, PolyglotFunction.prewarmedContextsTaken(), "each function starts in a prewarmed context");
            Function.Sandbox sa = a.newSandbox(), sb = b.newSandbox(), sa2 = a.newSandbox();
            try {
                assertEquals(before + 3, PolyglotFunction.prewarmedContextsTaken(), "a second worker's context is prewarmed too");
                JsonObject ra = sa.invoke(json("{\"mark\":\"a\"}"), Map.of()).getAsJsonObject();
                assertEquals("first", ra.get("env").getAsString());
                assertTrue(ra.get("seen").isJsonNull(), ra.toString());
                // the prewarm's imports and the warm-up's names are not the function's globals
                assertEquals(0, ra.getAsJsonArray("leaked").size(), "the prewarm's names leak into the function: " + ra);
                JsonObject rb = sb.invoke(json("{\"mark\":\"b\"}"), Map.of()).getAsJsonObject();
                assertEquals("second", rb.get("env").getAsString());
                assertTrue(rb.get("seen").isJsonNull(), "the second function sees the first's state: " + rb);
                JsonObject ra2 = sa2.invoke(json("{\"mark\":\"c\"}"), Map.of()).getAsJsonObject();
                assertEquals("first", ra2.get("env").getAsString());
                assertTrue(ra2.get("seen").isJsonNull(), "a worker's context sees another worker's or function's state: " + ra2);
                assertEquals(0, ra2.getAsJsonArray("leaked").size(), "the prewarm's names leak into the function: " + ra2);
            } finally {
                sa.close();
                sb.close();
                sa2.close();
            }
        }
    }
    /**
     * The context a function takes is replaced after that function's first call, not during it:
     * making a context allocates about a young generation's worth, and the collection it brings
     * pauses the call too (a new Python function's first call, 1 s apart, p50 6.3 against 3.2 ms).
     * A function that asks for a context while the spare waits gets it made at once.
     */
    @Test
    void theNextSpareIsMadeAfterTheTakersFirstCallNotDuringIt() throws Exception {
        PolyglotFunction.prewarm("javascript", 0);
        // a wait no run reaches: the spare is made by the first call or by a function asking
        long was = PolyglotFunction.spareWaitMs(3_600_000);
        String code = "function main(args) { return { ok: true }; }";
        int made = PolyglotFunction.sparesMade("javascript");
        try (PolyglotFunction a = new PolyglotFunction("a", "javascript", code, "main", Map.of())) {
            Thread.sleep(500);
            assertEquals(made, PolyglotFunction.sparesMade("javascript"), "a spare was made before the function's first call");
            Function.Sandbox s = a.newSandbox();
            try {
                assertTrue(s.invoke(json("{}"), Map.of()).getAsJsonObject().get("ok").getAsBoolean());
                awaitSpares(made + 1, "after the function's first call");
                s.invoke(json("{}"), Map.of());
                Thread.sleep(200);
                assertEquals(made + 1, PolyglotFunction.sparesMade("javascript"), "a later call made another spare");
            } finally {
                s.close();
            }
            int taken = PolyglotFunction.prewarmedContextsTaken();
            try (PolyglotFunction b = new PolyglotFunction("b", "javascript", code, "main", Map.of());
                 PolyglotFunction c = new PolyglotFunction("c", "javascript", code, "main", Map.of())) {
                // b took the spare; c asked while the next one waited for b's first call
                assertEquals(taken + 2, PolyglotFunction.prewarmedContextsTaken(), "a function waited for no spare");
            }
        } finally {
            PolyglotFunction.spareWaitMs(was);
        }
    }

    private static void awaitSpares(int n, String when) throws InterruptedException {
        long until = System.nanoTime() + 120_000_000_000L;
        while (PolyglotFunction.sparesMade("javascript") < n) {
            if (System.nanoTime() - until > 0) fail("no spare made " + when + " in 120 s: " + PolyglotFunction.sparesMade("javascript") + " of " + n);
            Thread.sleep(20);
        }
    }

    /**
     * A Python context starts no threads of its own: GraalPy's async actions (weak reference
     * callbacks, signals, its native finalizer) each wait on a platform thread of the context's,
     * four per context, and run their work on the thread that initialised it, which for a context
     * made ahead (a spare) is a runtime thread long gone: never on the function's worker.
     */
    @Test
    void aPythonFunctionsContextStartsNoThreadsOfItsOwn() throws Exception {
        PolyglotFunction.prewarm("python", 0);
        String code = """
                import weakref, gc
                class Box: pass
                def main(args):
                    b = Box()
                    r = weakref.ref(b)
                    gc.collect()
                    return {'alive': r() is b}
                """;
        try (PolyglotFunction a = new PolyglotFunction("threads-a", "python", code, "main", Map.of());
             PolyglotFunction b = new PolyglotFunction("threads-b", "python", code, "main", Map.of())) {
            for (PolyglotFunction f : new PolyglotFunction[]{a, b}) {
                Function.Sandbox s = f.newSandbox();
                try {
                    assertTrue(s.invoke(json("{}"), Map.of()).getAsJsonObject().get("alive").getAsBoolean(), "weak references work");
                } finally {
                    s.close();
                }
            }
            var threads = Thread.getAllStackTraces().keySet().stream().map(Thread::getName).filter(n -> n.startsWith("python-actions")).toList();
            assertEquals(java.util.List.of(), threads, "Python contexts hold threads of their own");
        }
    }
}
