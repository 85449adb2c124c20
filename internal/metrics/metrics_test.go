package metrics

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cpuslot/cpuslot/internal/cgroup"
)

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{
		"guest/fib":       "guest/fib",
		"gäst/ƒib☃":       "gäst/ƒib☃",
		"bad\xffname":     "bad\uFFFDname",
		"a\nb\x00c\u0085": "a?b?c?",
		// A dashboard must not show a spoofed name: bidi overrides,
		// invisible and line/paragraph separator characters.
		"guest/\u202Eemag": "guest/?emag",
		"gu\u200Best":      "gu?est",
		"a\u2028b\u2029c":  "a?b?c",
		"\uFEFFx\u2066y":   "?x?y",
	} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
	long := Label(strings.Repeat("é", MaxLabelLen))
	if len(long) > MaxLabelLen || !utf8.ValidString(long) {
		t.Errorf("long label: %d bytes, valid %v", len(long), utf8.ValidString(long))
	}
}

// TestReleasedWithHostileNames: no action name a pod sends can make the
// Prometheus client panic or break the exposition.
func TestReleasedWithHostileNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	for _, a := range []string{"g/\xff", "a\nb", "\xed\xa0\x80", strings.Repeat("x", 5000)} {
		m.Released(a, a, "ok", time.Millisecond, 0)
	}
	d := prometheus.NewDesc("test_gauge", "", []string{"container"}, nil)
	reg.MustRegister(collectorFunc(func(ch chan<- prometheus.Metric) {
		ch <- ConstGauge(d, 1, "/pods/bad\xff\x01")
	}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "test_gauge" {
			found = mf.GetMetric()[0].GetLabel()[0].GetValue() == "/pods/bad\uFFFD?"
		}
	}
	if !found {
		t.Fatal("sanitised gauge not exported")
	}
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(f, ch) }
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

// TestReasonsListed: every reason or admission result the agent counts is
// one of the typed constants, never a literal a call site made up.
func TestReasonsListed(t *testing.T) {
	listed := map[string]bool{}
	for _, r := range ErrorReasons {
		if listed[string(r)] {
			t.Errorf("%q listed twice", r)
		}
		listed[string(r)] = true
	}
	for _, r := range AdmissionResults {
		if listed[string(r)] {
			t.Errorf("%q listed twice", r)
		}
		listed[string(r)] = true
	}
	call := regexp.MustCompile(`metrics\.(Error|Admission|Acquired|Released)\(([^()\n]*"[^"\n]*"[^()\n]*)\)`)
	n := 0
	err := filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "e2e" || d.Name() == "runtime-image" || strings.HasPrefix(d.Name(), ".") && p != "../..") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		n++
		for _, m := range call.FindAllStringSubmatch(string(b), -1) {
			t.Errorf("%s counts %s(%s) with a literal; use the typed constant of internal/metrics", p, m[1], m[2])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("no source read")
	}
}

// TestEveryLabelPreRegistered: every label constant declared in reasons.go
// and in the pool's outcome words is exported from the start, so rates and
// alerts see a zero. Endings are the exception: their series carry a
// container and appear with its first count (and end with its pool), as
// does the HOLD leases' action.
func TestEveryLabelPreRegistered(t *testing.T) {
	var decls []ast.Decl
	for _, name := range []string{"reasons.go", "../outcome/outcome.go"} {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, f.Decls...)
	}
	metricOf := map[string]string{
		"Reason":          "cpuslot_errors_total",
		"AdmissionResult": "cpuslot_admission_total",
		"Acquisition":     "cpuslot_acquisitions_total",
		"Ending":          "",
	}
	type series struct{ metric, value string }
	want := map[series]bool{}
	for _, d := range decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			v := sp.(*ast.ValueSpec)
			if v.Names[0].Name == "HoldAction" {
				continue // an action, per container
			}
			typ, ok := v.Type.(*ast.Ident)
			if !ok {
				t.Fatalf("constant %s has no label type", v.Names[0])
			}
			metric, known := metricOf[typ.Name]
			if !known {
				t.Fatalf("constant %s has a label type of no metric", v.Names[0])
			}
			if metric == "" {
				continue // per container
			}
			lit := v.Values[0].(*ast.BasicLit)
			want[series{metricOf[typ.Name], strings.Trim(lit.Value, `"`)}] = true
		}
	}
	for _, op := range cgroup.Ops {
		want[series{"cpuslot_errors_total", "cgroup_" + op}] = true
	}
	if len(want) < 40 {
		t.Fatalf("found only %d label constants", len(want))
	}
	reg := prometheus.NewRegistry()
	New(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				delete(want, series{mf.GetName(), l.GetValue()})
			}
		}
	}
	for s := range want {
		t.Errorf("%s{%q} is not pre-registered by New", s.metric, s.value)
	}
}

// TestBuildInfo: the build is cpuslot_build_info{version, goversion}, as
// Prometheus's own exporters name it; cpuslot_agent_info stays for the
// node's cgroup setup.
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg).Info("v2", true, "1.2.3")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]map[string]string{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			found[mf.GetName()] = ls
		}
	}
	if b := found["cpuslot_build_info"]; b["version"] != "1.2.3" || b["goversion"] != runtime.Version() {
		t.Errorf("cpuslot_build_info %v, want version 1.2.3 and goversion %s", b, runtime.Version())
	}
	if a := found["cpuslot_agent_info"]; a["hierarchy"] != "v2" || a["favordynmods"] != "true" {
		t.Errorf("cpuslot_agent_info %v", a)
	}
}
