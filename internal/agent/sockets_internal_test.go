package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSocketDirName: a container's directory name and its cgroup path map
// one to one; a name that is not the one the agent gives a path (another
// spelling of it) names no container.
func TestSocketDirName(t *testing.T) {
	for _, cg := range []string{"/cpuslot/rt", "/a_b/c", "/a/b_c", "/a%2Fb", "/sp ace/ü"} {
		name := socketDirName(cg)
		if back, ok := cgroupOfSocketDir(name); !ok || back != cg {
			t.Errorf("%s -> %q -> %q %v", cg, name, back, ok)
		}
	}
	if socketDirName("/cpuslot/rt") != "cpuslot%2Frt" {
		t.Errorf("/cpuslot/rt -> %q", socketDirName("/cpuslot/rt"))
	}
	for _, name := range []string{"cpuslot%2frt", "%", "", "a%zz", "cpuslot/rt"} {
		if cg, ok := cgroupOfSocketDir(name); ok {
			t.Errorf("%q names %s", name, cg)
		}
	}
}

// TestSocketDirClosedToOthers: a socketDir that others could search (or
// that is not the agent's) is refused; a missing one is made root's, 0700.
func TestSocketDirClosedToOthers(t *testing.T) {
	d := t.TempDir()
	open := filepath.Join(d, "open")
	if err := os.Mkdir(open, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := openSocketDir(open); err == nil {
		t.Error("a socketDir others can search was taken")
	}
	if err := openSocketDir("relative"); err == nil {
		t.Error("a relative socketDir was taken")
	}
	made := filepath.Join(d, "made")
	if err := openSocketDir(made); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(made); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("made %v %v, want mode 0700", st.Mode(), err)
	}
}
