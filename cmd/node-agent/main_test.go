package main

import (
	"bytes"
	"encoding/json"
	"errors"
	flag "github.com/spf13/pflag"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/cpuslot/cpuslot/internal/agent"
)

// jsonLines parses every line of out as a JSON object, failing on one that
// is not.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line that is not JSON: %q (%v)", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// TestKlogIsJSON: what client-go logs through klog comes out as JSON lines
// of the agent's log, not as klog's text.
func TestKlogIsJSON(t *testing.T) {
	old := slog.Default()
	t.Cleanup(func() { klog.ClearLogger(); slog.SetDefault(old) })
	var buf bytes.Buffer
	newLogger(&buf, slog.LevelInfo)
	klog.InfoS("watch started", "resource", "pods")
	klog.Info("unstructured ", "line")
	klog.ErrorS(errors.New("connection refused"), "list failed")
	klog.Flush()
	lines := jsonLines(t, buf.String())
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	if lines[0]["msg"] != "watch started" || lines[0]["resource"] != "pods" || lines[0]["level"] != "INFO" {
		t.Errorf("InfoS: %v", lines[0])
	}
	if lines[2]["level"] != "ERROR" || lines[2]["err"] != "connection refused" {
		t.Errorf("ErrorS: %v", lines[2])
	}
}

// TestFatalIsJSON: the error that ends the agent is a JSON line too.
func TestFatalIsJSON(t *testing.T) {
	var buf bytes.Buffer
	_, _, err := parseRun([]string{"-no-such-flag"})
	if err == nil {
		t.Fatal("an unknown flag was accepted")
	}
	fatal(&buf, err)
	lines := jsonLines(t, buf.String())
	if len(lines) != 1 || lines[0]["level"] != "ERROR" || !strings.Contains(lines[0]["err"].(string), "no-such-flag") {
		t.Fatalf("fatal wrote %q", buf.String())
	}
}

// TestHelp: help prints the commands, and each command's flags.
func TestHelp(t *testing.T) {
	var buf bytes.Buffer
	old := stdout
	stdout = &buf
	t.Cleanup(func() { stdout = old })
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "node-agent cleanup [flags]"},
		{[]string{"run"}, "-config"},
		{[]string{"cleanup"}, "-tree"},
		{[]string{"version"}, "node-agent version"},
	} {
		buf.Reset()
		if err := help(c.args); err != nil {
			t.Errorf("help %v: %v", c.args, err)
		}
		if !strings.Contains(buf.String(), c.want) {
			t.Errorf("help %v printed %q, want %q in it", c.args, buf.String(), c.want)
		}
	}
	if err := help([]string{"frob"}); err == nil {
		t.Error("help of an unknown command: no error")
	}
	buf.Reset()
	if _, _, err := parseRun([]string{"-h"}); !errors.Is(err, flag.ErrHelp) || !strings.Contains(buf.String(), "-socket") {
		t.Errorf("run -h: %v, printed %q", err, buf.String())
	}
}

// TestFlagForms: the double-dash form is the flags' own; the single-dash
// long form of the stdlib flag package still works for one release, with
// one deprecation line naming the flags to rewrite, and no line for the new
// form. A value that starts with a dash stays a value.
func TestFlagForms(t *testing.T) {
	var warn bytes.Buffer
	old := stderr
	stderr = &warn
	t.Cleanup(func() { stderr = old })
	for _, c := range []struct {
		args       []string
		deprecated string // the names the warning lists; "" for no warning
	}{
		{[]string{"--socket=/s", "--max-containers", "7", "--cleanup-on-exit", "--kubernetes", "--container", "/a", "--container=/b", "--log-level", "debug"}, ""},
		{[]string{"-socket=/s", "-max-containers", "7", "-cleanup-on-exit", "-kubernetes", "-container", "/a", "--container=/b", "-log-level", "debug"},
			"cleanup-on-exit,container,kubernetes,log-level,max-containers,socket"},
	} {
		warn.Reset()
		cfg, rf, err := parseRun(c.args)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if cfg.Socket != "/s" || cfg.MaxContainers != 7 || !rf.cleanupOnExit || !rf.k8s || cfg.LogLevel != "debug" ||
			strings.Join(cfg.Standalone.Containers, ",") != "/a,/b" {
			t.Errorf("%v: %+v %+v", c.args, cfg, rf)
		}
		if c.deprecated == "" {
			if warn.Len() != 0 {
				t.Errorf("%v: warned %q", c.args, warn.String())
			}
			continue
		}
		lines := jsonLines(t, warn.String())
		if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["flags"] != c.deprecated || !strings.Contains(lines[0]["msg"].(string), "--") {
			t.Errorf("%v: warned %q, want one line naming %s", c.args, warn.String(), c.deprecated)
		}
	}
	// A value that begins with a dash is the flag's value, not a flag.
	warn.Reset()
	if cfg, _, err := parseRun([]string{"--container", "-kubernetes", "-container", "-socket"}); err != nil ||
		strings.Join(cfg.Standalone.Containers, ",") != "-kubernetes,-socket" {
		t.Errorf("dash values: %v %v", cfg.Standalone.Containers, err)
	}
	// Help in every form; an unknown flag in either form is an error naming it.
	for _, h := range []string{"-h", "--help", "-help"} {
		if _, _, err := parseRun([]string{h}); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: %v, want ErrHelp", h, err)
		}
	}
	for _, a := range []string{"-no-such-flag", "--no-such-flag"} {
		if _, _, err := parseRun([]string{a}); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
			t.Errorf("%s: %v", a, err)
		}
	}
	if err := cleanup([]string{"-tree", "--under", "/"}); err == nil || !strings.Contains(err.Error(), "below the root") {
		t.Errorf("cleanup -tree --under /: %v", err)
	}
}

// TestSharedSocketOnlyStandalone: in Kubernetes mode (the chart's
// DaemonSet, with or without NRI) the agent listens on no shared socket by
// default, and each served pod has its own; standalone it keeps the shared
// one, for it cannot put a socket in a container of its own accord
// (docs/security.md, "Reconnect churn: a socket per container").
func TestSharedSocketOnlyStandalone(t *testing.T) {
	cfg, _, err := parseRun([]string{"--kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Socket != "" {
		t.Errorf("Kubernetes mode listens on the shared socket %q by default", cfg.Socket)
	}
	if cfg, _, err = parseRun(nil); err != nil {
		t.Fatal(err)
	}
	if cfg.Socket != agent.DefaultConfig().Socket || cfg.Standalone.SocketDir != "" {
		t.Errorf("standalone: socket %q, socketDir %q; want the shared socket and no socketDir", cfg.Socket, cfg.Standalone.SocketDir)
	}
}
