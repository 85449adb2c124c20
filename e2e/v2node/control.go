package v2node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

// hostControlPlane starts the controller manager and the scheduler on the
// host (n.control, written by writeConfig), each restarted 2 s after it
// exits, as the guest's units are (Restart=always): the controller manager
// exits while the API server cannot serve it yet. Their logs go to n.dir.
// The returned func stops them and waits for them.
func (n *Node) hostControlPlane() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for name, argv := range n.control {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.supervise(ctx, name, argv)
		}()
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

func (n *Node) supervise(ctx context.Context, name string, argv []string) {
	log, err := os.OpenFile(filepath.Join(n.dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.opts.Logf("v2node: %s: %v", name, err)
		return
	}
	defer log.Close()
	for starts := 1; ; starts++ {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = log, log
		// Never left running when the test process dies without Down.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err := cmd.Run()
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintf(log, "v2node: %s exited (%v), start %d follows in 2 s\n", name, err, starts+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
}

// controlLogs is the last lines of each host control-plane log, each cut
// at width characters (0: uncut).
func (n *Node) controlLogs(lines, width int) string {
	names := make([]string, 0, len(n.control))
	for name := range n.control {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		l := strings.Split(cluster.TailFile(filepath.Join(n.dir, name+".log"), lines), "\n")
		for i := range l {
			if width > 0 && len(l[i]) > width {
				l[i] = l[i][:width]
			}
		}
		fmt.Fprintf(&b, "%s (host): %s\n", name, strings.Join(l, "\n"))
	}
	return b.String()
}
