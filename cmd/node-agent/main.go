// Command node-agent is cpuslot's node agent: it pre-warms CPU slots
// (threaded cgroups) inside the containers it serves and leases them to
// runtimes over a Unix socket.
//
//	node-agent [run] [flags]   serve (standalone mode)
//	node-agent cleanup [flags] remove every cpuslot slot (uninstall); with
//	                           --tree, also the whole cgroup tree at --under
//	node-agent version
//	node-agent help [command]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cpuslot/cpuslot/internal/agent"
	"github.com/cpuslot/cpuslot/internal/cgroup"
	"github.com/cpuslot/cpuslot/internal/discover"
	k8sdiscover "github.com/cpuslot/cpuslot/internal/discover/kubernetes"
	"github.com/cpuslot/cpuslot/internal/discover/nri"
	"github.com/cpuslot/cpuslot/internal/safetext"
	"github.com/cpuslot/cpuslot/internal/settings"
	flag "github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

func main() {
	args := os.Args[1:]
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = run(args)
	case "cleanup":
		err = cleanup(args)
	case "version":
		fmt.Println(agent.Version)
	case "help":
		err = help(args)
	default:
		err = fmt.Errorf("unknown command %q (want run, cleanup, version or help)", cmd)
	}
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the usage is printed
	}
	if err != nil {
		fatal(os.Stderr, err)
		os.Exit(1)
	}
}

// stdout is where help goes, stderr where the flags' deprecation line goes
// (variables for tests).
var (
	stdout io.Writer = os.Stdout
	stderr io.Writer = os.Stderr
)

const overview = `node-agent pre-warms CPU slots inside the containers it serves and leases
them to runtimes over a Unix socket.

usage:
  node-agent [run] [flags]    serve (standalone, or --kubernetes)
  node-agent cleanup [flags]  remove every cpuslot slot (uninstall)
  node-agent version          print the version
  node-agent help [command]   this text, or a command's flags
`

// help prints the overview, or a command's usage and flags.
func help(args []string) error {
	if len(args) == 0 {
		_, err := io.WriteString(stdout, overview)
		return err
	}
	var err error
	switch args[0] {
	case "run":
		_, _, err = parseRun([]string{"-h"})
	case "cleanup":
		err = cleanup([]string{"-h"})
	case "version":
		_, err = io.WriteString(stdout, "usage: node-agent version\n\nprints the agent's version\n")
	case "help":
		_, err = io.WriteString(stdout, overview)
	default:
		return fmt.Errorf("help: unknown command %q (want run, cleanup, version or help)", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// parseFlags parses a command's flags (pflag: --name, --name=value). The
// flag package's own text is dropped: a bad flag is returned, to be logged
// as JSON like every other line; -h prints the usage to stdout and returns
// flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(singleDash(fs, args))
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "usage: node-agent %s [flags]\n\nflags:\n", fs.Name())
		fs.SetOutput(stdout)
		fs.PrintDefaults()
	}
	return err
}

// singleDash rewrites the single-dash long flags of earlier releases (the
// stdlib flag package's -name, -name=value) to --name, with one JSON
// warning line naming them: they keep working for one release. Only names
// of fs's flags are rewritten, and never the argument a flag takes as its
// value.
func singleDash(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	var old []string
	takesValue := false
	for i, a := range args {
		if takesValue {
			out, takesValue = append(out, a), false
			continue
		}
		if a == "--" {
			out = append(out, args[i:]...)
			break
		}
		long := strings.TrimPrefix(a, "-")
		if strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && len(long) > 1 {
			name, _, _ := strings.Cut(long, "=")
			if name == "help" {
				a = "--help"
			} else if fs.Lookup(name) != nil {
				old = append(old, name)
				a = "-" + a
			}
		}
		if name, ok := strings.CutPrefix(a, "--"); ok && !strings.Contains(name, "=") {
			if f := fs.Lookup(name); f != nil && f.NoOptDefVal == "" {
				takesValue = true
			}
		}
		out = append(out, a)
	}
	if len(old) > 0 {
		slices.Sort(old)
		old = slices.Compact(old)
		slog.New(slog.NewJSONHandler(stderr, nil)).Warn(
			"single-dash long flags are deprecated and stop working in the next release: write --"+old[0]+" and so on",
			"flags", strings.Join(old, ","))
	}
	return out
}

// fatal logs the error that ends the command as a JSON line, as the
// agent's log is.
func fatal(w io.Writer, err error) {
	slog.New(slog.NewJSONHandler(w, nil)).Error("node-agent failed", "err", err)
}

// newLogger is the agent's one log stream: JSON lines on w whose strings,
// many a pod's, show no hidden characters (safetext). client-go logs
// through klog, which is routed to it too, so its lines are JSON as well.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	log := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: safetext.ReplaceAttr}))
	slog.SetDefault(log)
	klog.SetSlogLogger(log)
	return log
}

// runFlags are run's flags that are not settings of the file.
type runFlags struct {
	k8s, cleanupOnExit bool
}

// parseRun reads run's flags over the configuration file (-config) and the
// defaults. The flags of settings (settings.FileKeys with a Flag) are
// checked by the same parser as the file and pod annotations.
func parseRun(args []string) (agent.Config, runFlags, error) {
	var rf runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	configPath := fs.String("config", "", "YAML configuration file (flags override it)")
	type setting struct{ key, value string }
	var settingFlags []setting
	var badSetting error // the flag package keeps only the message
	for _, k := range settings.FileKeys() {
		if k.Flag == "" {
			continue
		}
		fs.Func(k.Flag, k.Doc+" (file: "+k.Name+")", func(v string) error {
			if err := settings.Check(k.Name, v); err != nil {
				if se, ok := err.(*settings.Error); ok {
					se.Source = "--" + k.Flag
				}
				badSetting = err
				return err
			}
			settingFlags = append(settingFlags, setting{k.Name, v})
			return nil
		})
		if k.Kind == settings.KindBool {
			fs.Lookup(k.Flag).NoOptDefVal = "true" // --flag alone sets it
		}
	}
	fs.BoolVar(&rf.cleanupOnExit, "cleanup-on-exit", false, "remove all slots on exit instead of leaving them for the next agent")
	fs.BoolVar(&rf.k8s, "kubernetes", false, "serve the runtime pods of this node (see docs/kubernetes-contract.md)")
	containers := fs.StringArray("container", nil, "serve this cgroup (path in the cpu hierarchy); repeatable")
	pids := fs.StringArray("pid", nil, "serve the cgroup of this process; repeatable")
	serveUnder := fs.StringArray("serve-under", nil, "serve any process connecting from a cgroup below this one, in its own cgroup; repeatable")
	socketDir := fs.String("socket-dir", "", "give each served container a socket of its own, in its directory here (root's, mode 0700; see docs/operating.md)")
	if err := parseFlags(fs, args); err != nil {
		if badSetting != nil {
			return agent.Config{}, rf, badSetting
		}
		return agent.Config{}, rf, err
	}
	cfg := agent.DefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = agent.LoadConfig(*configPath); err != nil {
			return cfg, rf, err
		}
	}
	for _, s := range settingFlags {
		if err := cfg.Set(s.key, s.value); err != nil {
			return cfg, rf, err
		}
	}
	if cfg.Kubernetes.NodeName == "" {
		cfg.Kubernetes.NodeName = os.Getenv("NODE_NAME")
	}
	socketFlag := slices.ContainsFunc(settingFlags, func(s setting) bool { return s.key == "socket" })
	if rf.k8s && !socketFlag && cfg.Socket == agent.DefaultConfig().Socket {
		cfg.Socket = "" // each pod gets a socket of its own
	}
	cfg.Standalone.Containers = append(cfg.Standalone.Containers, *containers...)
	cfg.Standalone.ServeUnder = append(cfg.Standalone.ServeUnder, *serveUnder...)
	if *socketDir != "" {
		cfg.Standalone.SocketDir = *socketDir
	}
	for _, p := range *pids {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 {
			return cfg, rf, fmt.Errorf("--pid %q: want a process id", p)
		}
		cfg.Standalone.PIDs = append(cfg.Standalone.PIDs, n)
	}
	return cfg, rf, nil
}

func run(args []string) error {
	cfg, rf, err := parseRun(args)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("log level %q: %w", cfg.LogLevel, err)
	}
	log := newLogger(os.Stderr, level)

	a, err := agent.New(cfg, log)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	sources := []discover.Source{discover.Static{Hierarchy: a.Hierarchy(), Cgroups: cfg.Standalone.Containers, PIDs: cfg.Standalone.PIDs}}
	if rf.k8s {
		r, err := readRules(cfg)
		if err != nil {
			return err
		}
		var known func(string) (string, bool)
		if cfg.Kubernetes.NRI.Enabled {
			// Before the pod watch: it connects in the background.
			p := nriPlugin(cfg, r, a, log)
			sources, known = append(sources, p), p.CgroupOf
		}
		src, err := kubernetesSource(cfg, r, a, log, known)
		if err != nil {
			return err
		}
		// Events of the last moments (the stop itself may record some)
		// are sent before the process exits.
		defer src.Shutdown(5 * time.Second)
		sources = append(sources, src)
	} else if len(cfg.Standalone.Containers)+len(cfg.Standalone.PIDs)+len(cfg.Standalone.ServeUnder) == 0 {
		log.Warn("nothing to serve: give --container, --pid or --serve-under (or standalone: in the config file), or --kubernetes")
	}
	return a.Run(ctx, sources, rf.cleanupOnExit)
}

// rules are what both serving paths (the pod watch and the NRI plugin)
// decide a pod by: which pods, their pools' defaults, the annotations'
// ceilings. Read once, so the two cannot disagree.
type rules struct {
	sel  k8sdiscover.Selector
	pool settings.Pool
	ceil settings.Ceilings
}

func readRules(cfg agent.Config) (r rules, err error) {
	if r.sel, err = k8sdiscover.ParseSelector(cfg.Kubernetes.Select); err != nil {
		return r, err
	}
	if r.pool, err = cfg.Settings(); err != nil {
		return r, err
	}
	r.ceil, err = cfg.Ceilings()
	return r, err
}

func kubernetesSource(cfg agent.Config, r rules, a *agent.Agent, log *slog.Logger, known func(string) (string, bool)) (*k8sdiscover.Source, error) {
	kc := cfg.Kubernetes
	var rc *rest.Config
	var err error
	if kc.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kc.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	rc.UserAgent = "cpuslot-node-agent/" + agent.Version
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return k8sdiscover.New(k8sdiscover.Config{
		NodeName: kc.NodeName, ContainerdSocket: kc.ContainerdSocket, ContainerdNamespace: kc.ContainerdNamespace,
		PodsDir: kc.PodsDir, SocketVolume: kc.SocketVolume, Selector: r.sel, Pool: r.pool, Ceilings: r.ceil, Known: known,
	}, client, a.Hierarchy(), log), nil
}

func nriPlugin(cfg agent.Config, r rules, a *agent.Agent, log *slog.Logger) *nri.Plugin {
	kc := cfg.Kubernetes
	return nri.New(nri.Config{Socket: kc.NRI.Socket, StartTimeout: kc.NRI.StartTimeout.Duration,
		PodsDir: kc.PodsDir, SocketVolume: kc.SocketVolume, Selector: r.sel, Pool: r.pool, Ceilings: r.ceil,
	}, a.Hierarchy(), log, a.CountError)
}

func cleanup(args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	under := fs.String("under", "/", "remove slots below this cgroup path")
	wait := fs.Duration("wait", 0, "keep retrying busy slots (and, with --tree, busy cgroups) for this long")
	tree := fs.Bool("tree", false, "then remove the cgroup at --under and every cgroup below it, moving what still runs there to the root")
	kill := fs.Bool("kill", false, "with --tree: kill the processes still in the tree instead of moving them")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *tree && path.Clean("/"+*under) == "/" {
		return errors.New("cleanup --tree: --under must name a cgroup below the root")
	}
	h, err := cgroup.Detect()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(*wait)
	for {
		n, err := h.RemoveAllSlots(*under)
		fmt.Printf("removed %d slots under %s (%s)\n", n, *under, h)
		if err == nil || time.Now().After(deadline) || !errors.Is(err, cgroup.ErrBusy) {
			if err != nil || !*tree {
				return err
			}
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := h.RemoveTree(*under, cgroup.TreeOptions{Kill: *kill, Wait: time.Until(deadline)}); err != nil {
		return err
	}
	fmt.Printf("removed the cgroup tree %s\n", *under)
	return nil
}
