package metrics

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{
		"guest/fib":       "guest/fib",
		"gäst/ƒib☃":       "gäst/ƒib☃",
		"bad\xffname":     "bad\uFFFDname",
		"a\nb\x00c\u0085": "a?b?c?",
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
		m.Released(a, "ok", time.Millisecond, 0)
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

// TestReasonsListed: every literal reason or admission result the agent
// counts is in the one list that pre-registers them.
func TestReasonsListed(t *testing.T) {
	listed := map[string]bool{}
	for _, r := range append(append([]string{}, ErrorReasons...), AdmissionResults...) {
		if listed[r] {
			t.Errorf("%q listed twice", r)
		}
		listed[r] = true
	}
	call := regexp.MustCompile(`\.(Error|Admission)\("([^"]*)"\)`)
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
		for _, m := range call.FindAllStringSubmatch(string(b), -1) {
			n++
			if !listed[m[2]] {
				t.Errorf("%s counts %s %q, which is not in ErrorReasons or AdmissionResults", p, m[1], m[2])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < len(listed) {
		t.Fatalf("found only %d counting calls for %d listed reasons", n, len(listed))
	}
}
