(function(path, loop) {
  var parts = path.split('.');
  function walk(o) { for (var i = 0; i < parts.length; i++) { if (o === undefined || o === null) return undefined; o = o[parts[i]]; } return o; }
  var fn = walk(globalThis);
  if (typeof fn !== 'function') fn = walk(module.exports);
  if (typeof fn !== 'function' && path === 'main' && typeof module.exports === 'function') fn = module.exports;
  if (typeof fn !== 'function') return null;
  var st = null;
  function out(v) { var s = JSON.stringify(v === undefined ? {} : v); return s === undefined ? 'null' : s; }
  function errorOf(e) {
    if (e === undefined || e === null) return {};
    if (e instanceof Error) return e.message ? e.message : String(e);
    return e;
  }
  return {
    call: function(a, e) {
      process.env = JSON.parse(e);
      loop.reset();
      st = { done: false };
      var r = fn(JSON.parse(a));
      if (r !== null && typeof r === 'object' && typeof r.then === 'function') {
        r.then(function(v) { st.done = true; st.v = v; }, function(err) { st.done = true; st.rejected = true; st.err = err; });
        return '\u0000async';
      }
      return out(r);
    },
    poll: function() {
      if (!st.done) return '\u0000pending';
      return st.rejected ? out({ error: errorOf(st.err) }) : out(st.v);
    }
  };
})