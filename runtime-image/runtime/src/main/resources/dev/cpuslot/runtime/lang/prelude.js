(function(initEnv, bus) {
  globalThis.global = globalThis;
  function chain(mode, name, args) {
    var r = JSON.parse(bus(mode, String(name), JSON.stringify(args === undefined || args === null ? {} : args)));
    if (r.error !== undefined) {
      var e = new Error(r.error);
      e.name = 'ChainError';
      e.kind = r.kind;
      e.callee = String(name);
      throw e;
    }
    return r.result;
  }
  globalThis.cpuslot = Object.freeze({
    call: function(name, args) { return chain('sync', name, args); },
    callAsync: function(name, args) { chain('async', name, args); }
  });
  globalThis.process = { env: JSON.parse(initEnv), argv: [], platform: 'linux', version: 'graaljs',
                         cwd: function() { return '/'; }, exit: function() { throw new Error('process.exit is not allowed'); } };
  globalThis.module = { exports: {} };
  globalThis.exports = globalThis.module.exports;
  globalThis.require = function(name) {
    var e = new Error("Cannot find module '" + name + "': this JavaScript runtime has no Node.js modules");
    e.code = 'MODULE_NOT_FOUND';
    throw e;
  };
  // GraalJS makes a new Intl.Collator at every localeCompare call (a sort's comparator makes
  // thousands); without locales and options the spec's answer is that of one default collator
  (function() {
    'use strict';
    if (typeof Intl !== 'object' || typeof Intl.Collator !== 'function') return;
    // the built-ins as they are now: a function's own globals do not change what this does
    var own = String.prototype.localeCompare, apply = Reflect.apply, toString = String, Collator = Intl.Collator;
    var compareOf = Object.getOwnPropertyDescriptor(Collator.prototype, 'compare').get, compare = null;
    var localeCompare = {
      localeCompare(that) { // a method: a name, length 1, no constructor, as the built-in
        if (this === undefined || this === null || typeof this === 'symbol' || typeof that === 'symbol'
            || arguments[1] !== undefined || arguments[2] !== undefined) return apply(own, this, arguments);
        if (compare === null) compare = apply(compareOf, new Collator(), []);
        return compare(toString(this), toString(that));
      }
    }.localeCompare;
    Object.defineProperty(String.prototype, 'localeCompare', { value: localeCompare, writable: true, enumerable: false, configurable: true });
  })();
  // GraalJS's Array.prototype.sort calls a comparator from Java (TimSort), each call through a
  // call boundary Graal cannot inline; the same steps in JavaScript (ECMA-262's Array.prototype.sort,
  // SortIndexedProperties: every index read with HasProperty then Get, undefined last without a
  // call, a stable sort, written back with Set, the holes deleted) compile with the comparator
  // inlined. Arrays only, up to a million elements (a sparse one's indices are all visited; above
  // that the built-in reads `length` again, which only a proxy's trap would see).
  (function() {
    'use strict';
    var own = Array.prototype.sort, apply = Reflect.apply, isArray = Array.isArray, setProto = Object.setPrototypeOf, MAX = 0x100000;
    // the algorithm's own lists: arrays without a prototype, so that no index setter or getter a
    // function defines on Array.prototype sees them (the language's lists are not objects)
    function sorted(a, cmp) { // stable: insertion sort in runs of 8, then bottom-up merges
      var n = a.length, lo, hi, i, j, k, x, mid, w, t, b;
      for (lo = 0; lo < n; lo += 8) {
        hi = lo + 8 < n ? lo + 8 : n;
        for (i = lo + 1; i < hi; i++) {
          x = a[i];
          for (j = i - 1; j >= lo && +cmp(a[j], x) > 0; j--) a[j + 1] = a[j];
          a[j + 1] = x;
        }
      }
      b = setProto([], null);
      for (w = 8; w < n; w *= 2) {
        for (lo = 0; lo < n; lo += 2 * w) {
          mid = lo + w < n ? lo + w : n;
          hi = lo + 2 * w < n ? lo + 2 * w : n;
          i = lo; j = mid; k = lo;
          while (i < mid && j < hi) b[k++] = +cmp(a[j], a[i]) < 0 ? a[j++] : a[i++];
          while (i < mid) b[k++] = a[i++];
          while (j < hi) b[k++] = a[j++];
        }
        t = a; a = b; b = t;
      }
      return a;
    }
    var sort = {
      sort(comparefn) { // a method: a name, length 1, no constructor, as the built-in
        if (typeof comparefn !== 'function' || !isArray(this)) return apply(own, this, arguments);
        var obj = this, len = obj.length, items = setProto([], null), m = 0, undef = 0, k, v;
        if (len > MAX) return apply(own, this, arguments);
        for (k = 0; k < len; k++) {
          if (!(k in obj)) continue;
          v = obj[k];
          if (v === undefined) undef++; else items[m++] = v;
        }
        items = sorted(items, comparefn);
        for (k = 0; k < m; k++) obj[k] = items[k];
        for (v = 0; v < undef; v++) obj[k++] = undefined;
        for (; k < len; k++) delete obj[k];
        return obj;
      }
    }.sort;
    Object.defineProperty(Array.prototype, 'sort', { value: sort, writable: true, enumerable: false, configurable: true });
  })();
  var timers = [], seq = 0;
  function add(cb, ms, args, every) {
    if (typeof cb !== 'function') throw new TypeError('the callback must be a function');
    var d = Math.max(0, Number(ms) || 0), id = ++seq;
    timers.push({ id: id, at: Date.now() + d, cb: cb, args: args, every: every ? Math.max(1, d) : 0 });
    return id;
  }
  globalThis.setTimeout = function(cb, ms) { return add(cb, ms, Array.prototype.slice.call(arguments, 2), false); };
  globalThis.setInterval = function(cb, ms) { return add(cb, ms, Array.prototype.slice.call(arguments, 2), true); };
  globalThis.setImmediate = function(cb) { return add(cb, 0, Array.prototype.slice.call(arguments, 1), false); };
  globalThis.clearTimeout = globalThis.clearInterval = globalThis.clearImmediate = function(id) {
    timers = timers.filter(function(t) { return t.id !== id; });
  };
  return {
    reset: function() { timers = []; },
    next: function() {
      if (timers.length === 0) return -1;
      var at = Infinity;
      for (var i = 0; i < timers.length; i++) at = Math.min(at, timers[i].at);
      return Math.max(0, at - Date.now());
    },
    tick: function() {
      var now = Date.now();
      var due = timers.filter(function(t) { return t.at <= now; }).sort(function(x, y) { return x.at - y.at || x.id - y.id; });
      for (var i = 0; i < due.length; i++) {
        var t = due[i];
        if (timers.indexOf(t) < 0) continue;
        if (t.every) t.at = now + t.every; else timers.splice(timers.indexOf(t), 1);
        t.cb.apply(null, t.args);
      }
    }
  };
})