package counters

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       Usage
	}{
		{"v2", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 7\nnr_throttled 3\nthrottled_usec 250\n",
			Usage{CPUNanos: 1500000, ThrottledNanos: 250000, Periods: 7, ThrottledPeriods: 3}},
		{"v1", "nr_periods 9\nnr_throttled 2\nthrottled_time 123456\n",
			Usage{ThrottledNanos: 123456, Periods: 9, ThrottledPeriods: 2}},
		{"garbage", "usage_usec\nnr_periods x\n\n", Usage{}},
	} {
		if got := Parse([]byte(tc.stat)); got != tc.want {
			t.Errorf("%s: Parse = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestReadV1TakesCPUFromAcct(t *testing.T) {
	dir := t.TempDir()
	open := func(name, text string) int {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return int(f.Fd())
	}
	stat := open("cpu.stat", "nr_periods 4\nnr_throttled 1\nthrottled_time 10\n")
	acct := open("cpuacct.usage", "987654\n")
	u, err := Read(stat, acct)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Usage{CPUNanos: 987654, ThrottledNanos: 10, Periods: 4, ThrottledPeriods: 1}); u != want {
		t.Errorf("Read = %+v, want %+v", u, want)
	}
	if u, err = Read(stat, -1); err != nil || u.CPUNanos != 0 || u.Periods != 4 {
		t.Errorf("Read without acct = %+v, %v", u, err)
	}
}

func TestSubClamps(t *testing.T) {
	a := Usage{CPUNanos: 10, Periods: 2}
	b := Usage{CPUNanos: 15, Periods: 1}
	if got := a.Sub(b); got != (Usage{Periods: 1}) {
		t.Errorf("Sub = %+v", got)
	}
}
