package settings

import "slices"

// AgentKeys are the agent-wide settings of the file (one value per agent,
// not per container, so no Pool holds them): the generated files list them
// with Keys, in sections of their own; the agent keeps their values in its
// Config. A key with a Flag is a flag of the agent's run, checked as the
// file's value is.
var AgentKeys = []Key{
	{Name: "limits.maxConnections", Flag: "max-connections", Kind: KindInt, Min: 1, Max: noMax, Default: "4096",
		Doc:     "open connections on the node of peers in no served container; more are closed at accept",
		Meaning: "open connections on the node of peers in no served container, until a HELLO names their container; when full, a newcomer displaces a waiting connection of the cgroup that holds the most ([`security.md`](security.md#limits))"},
	{Name: "limits.maxConnectionsPerContainer", Kind: KindInt, Min: 1, Max: noMax, Default: "1024",
		Doc:     "open connections of one served container's processes, its own share apart from maxConnections",
		Meaning: "open connections of one served container's processes: its own share, apart from `maxConnections`"},
	{Name: "limits.maxPendingHelloPerUID", Kind: KindInt, Min: 1, Max: noMax, Default: "256",
		Doc: "connections without a completed HELLO of one user's processes in no served container"},
	{Name: "limits.maxPendingHelloPerCgroup", Kind: KindInt, Min: 1, Max: noMax, Default: "256",
		Doc: "connections without a completed HELLO from one cgroup in no served container"},
	{Name: "limits.maxConnectionsPerProcess", Flag: "max-connections-per-process", Kind: KindInt, Min: 1, Max: noMax, Default: "64",
		Doc: "open connections of one client process"},
	{Name: "limits.acceptRate", Kind: KindInt, Min: 1, Max: noMax, Default: "100",
		Doc:     "new connections a second of one peer: on a container's own socket, and per user and per cgroup on the shared socket; past it the socket waits, or the connection is closed at accept",
		Meaning: "new connections a second of one peer: a container's own socket stops accepting for a while, the shared socket closes a connection at accept whose user (before its cgroup is read; root has none) or cgroup is past it ([`security.md`](security.md#limits))"},
	{Name: "limits.acceptBurst", Kind: KindInt, Min: 1, Max: noMax, Default: "1024",
		Doc: "burst of new connections of one peer beyond acceptRate (a container's reconnect after an agent restart)"},
	{Name: "limits.sharedAcceptRate", Kind: KindInt, Min: 1, Max: noMax, Default: "250",
		Doc: "new connections a second on the shared socket, in bursts of maxConnections; past it the socket stops accepting for a while"},
	{Name: "limits.helloTimeout", Kind: KindDuration, Min: minDuration, Max: noMax, Default: "10s",
		Doc: "a new connection must complete HELLO within this"},
	{Name: "limits.frameTimeout", Kind: KindDuration, Min: minDuration, Max: noMax, Default: "10s",
		Doc: "a frame, once begun, must arrive (and answers be read) within this"},
	{Name: "limits.hostNamespaceFDs", Flag: "host-namespace-fds", Kind: KindBool, Default: "false", NoChart: true,
		Doc:     "cgroup v1: also pass placement fds to runtimes in the agent's PID namespace (trusted standalone runtimes only: such a fd moves any process of the node)",
		Meaning: "cgroup v1: pass placement fds also to runtimes in the agent's PID namespace (trusted standalone runtimes only: such a fd moves any process of the node; [`security.md`](security.md))"},
}

// minDuration is the Min of a duration that must be positive (seconds).
const minDuration = 1e-9

// sectionDocs are the comments above an agent-wide section in the YAML
// files.
var sectionDocs = map[string]string{
	"limits": "What peers can make the agent hold (docs/security.md). The defaults hold 250 pods with the runtimes' default connection pools.",
}

// FileKeys are every setting of the agent's file: Keys, then AgentKeys.
func FileKeys() []Key { return append(slices.Clip(Keys), AgentKeys...) }

// FileKey finds a setting of the agent's file by its name.
func FileKey(name string) (Key, bool) {
	keys := FileKeys()
	i := slices.IndexFunc(keys, func(k Key) bool { return k.Name == name })
	if i < 0 {
		return Key{}, false
	}
	return keys[i], true
}

// DefaultText is the key's default in Set's syntax.
func (k Key) DefaultText() string {
	if k.get == nil {
		return k.Default
	}
	return k.get(Default())
}

// Check reports whether value is accepted for a setting of the file, as
// Set would (for a pool or admission key) or as its kind and range allow
// (an agent-wide key): an *Error naming the key, or nil.
func Check(key, value string) error {
	if _, ok := Lookup(key); ok {
		p := Default()
		return p.Set(key, value)
	}
	k, ok := FileKey(key)
	if !ok {
		return &Error{Key: key, Value: value, Err: ErrUnknownKey}
	}
	if err := k.check(value); err != nil {
		return &Error{Key: key, Value: value, Err: err}
	}
	return nil
}
