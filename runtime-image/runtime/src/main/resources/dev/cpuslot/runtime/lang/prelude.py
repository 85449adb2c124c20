import _json as __cpuslot__json, posix as __cpuslot_posix, sys as __cpuslot_sys
def __cpuslot_signals():
    import _signal
    def refused(*args, **kwargs):
        raise PermissionError("process signals are the runtime's: not allowed to a function in a shared runtime")
    for m in (_signal, __cpuslot_sys.modules.get('signal')):
        for n in ('signal', 'raise_signal', 'pthread_kill', 'alarm', 'setitimer', 'siginterrupt', 'set_wakeup_fd',
                  'pause', 'sigwait', 'sigwaitinfo', 'sigtimedwait', 'pthread_sigmask'):
            if m is not None and hasattr(m, n):
                setattr(m, n, refused)
    for m in (__cpuslot_posix, __cpuslot_sys.modules.get('os')):
        for n in ('kill', 'killpg'):
            if m is not None and hasattr(m, n):
                setattr(m, n, refused)
__cpuslot_signals()
def __cpuslot_scanner(make):
    # GraalPy's _json scanner parses numbers natively only when parse_float / parse_int are float /
    # int instances (it checks the hook's type, not that the hook is float or int), so with json's
    # defaults, the float and int types, it calls float(s) / int(s) through Python for every number,
    # most of json.loads's time in a number-heavy document. CPython's scanner parses
    # natively exactly when the hooks are float and int; this make_scanner does the same, with
    # instances that select GraalPy's native path, and falls back to GraalPy's own if that path ever
    # changes (probed once here). _json is this context's own module: no other function sees it.
    class Defaults:
        __slots__ = ('strict', 'object_hook', 'object_pairs_hook', 'parse_float', 'parse_int', 'parse_constant')
    def native(context):
        d = Defaults()
        d.strict = context.strict
        d.object_hook = context.object_hook
        d.object_pairs_hook = context.object_pairs_hook
        d.parse_float = 0.0
        d.parse_int = 0
        d.parse_constant = context.parse_constant
        return make(d)
    def make_scanner(context):
        if context.parse_float is float and context.parse_int is int:
            return native(context)
        return make(context)
    class Probe:
        strict = True
        object_hook = object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = float
    try:
        r = native(Probe())('[1.5,-7,12345678901234567890123,-0.0,2E-3,{"k":1}]', 0)
        if repr(r) == "([1.5, -7, 12345678901234567890123, -0.0, 0.002, {'k': 1}], 50)":
            return make_scanner
    except Exception:
        pass
    return make
__cpuslot__json.make_scanner = __cpuslot_scanner(__cpuslot__json.make_scanner)
def __cpuslot_codec():
    class Ctx:  # json.JSONDecoder's defaults
        strict = True
        object_hook = object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {'-Infinity': float('-inf'), 'Infinity': float('inf'), 'NaN': float('nan')}.__getitem__
        memo = {}
    scan = __cpuslot__json.make_scanner(Ctx())
    def loads(s):
        v, end = scan(s, 0)  # the runtime's JSON (Gson) has no whitespace around
        if end != len(s):
            raise ValueError('Extra data at %d' % end)
        return v
    def default(o):
        raise TypeError(f'Object of type {o.__class__.__name__} is not JSON serializable')
    def dumps(v):  # json.dumps's defaults; a fresh encoder: its circular-reference marks are per call
        return ''.join(__cpuslot__json.make_encoder({}, default, __cpuslot__json.encode_basestring_ascii,
                                                    None, ': ', ', ', False, False, True)(v, 0))
    fsenc = __cpuslot_sys.getfilesystemencoding()
    def env(m):  # as os.environ stores it
        return {k.encode(fsenc, 'surrogateescape'): v.encode(fsenc, 'surrogateescape') for k, v in m.items()}
    return loads, dumps, env
__cpuslot_loads, __cpuslot_dumps, __cpuslot_env = __cpuslot_codec()
__cpuslot_posix.environ.update(__cpuslot_env(__cpuslot_loads(__cpuslot_init_env)))
def __cpuslot_zip(srcs):
    import importlib.abc, importlib.util
    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name in srcs:
                return importlib.util.spec_from_loader(name, self, is_package=srcs[name][1])
            return None
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            src, pkg = srcs[module.__name__]
            if pkg:
                module.__path__ = []
            fname = module.__name__.replace('.', '/') + ('/__init__.py' if pkg else '.py')
            exec(compile(src, fname, 'exec'), module.__dict__)
    __cpuslot_sys.meta_path.insert(0, Finder())
if __cpuslot_zip_srcs:
    __cpuslot_zip(__cpuslot_loads(__cpuslot_zip_srcs))
def __cpuslot_chain(bus, loads, dumps):
    class ChainError(Exception):
        def __init__(self, message, kind, callee):
            Exception.__init__(self, message)
            self.kind = kind
            self.callee = callee
    def go(mode, name, args):
        r = loads(str(bus(mode, str(name), dumps({} if args is None else args))))
        if 'error' in r:
            raise ChainError(r['error'], r['kind'], str(name))
        return r.get('result')
    class Chain:
        pass
    c = Chain()
    c.ChainError = ChainError
    c.call = lambda name, args=None: go('sync', name, args)
    c.call_async = lambda name, args=None: go('async', name, args) and None
    c.callAsync = c.call_async
    return c
import builtins as __cpuslot_builtins
__cpuslot_builtins.cpuslot = __cpuslot_chain(__cpuslot_bus, __cpuslot_loads, __cpuslot_dumps)
