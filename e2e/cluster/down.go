package cluster

// Taking a cluster down: its components stopped, its containers removed,
// the machine restored; and the undoing of a run that ended without Down.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// cleanStale undoes a previous run that ended without Down (killed test,
// crash): stops its processes by pidfile and restores the machine to that
// run's snapshot.
func (c *Cluster) cleanStale() error {
	if _, err := os.Stat(c.runDir); err != nil {
		return nil
	}
	c.logf("cluster: %s exists: cleaning up after a previous run", c.runDir)
	stopStale(c.runDir, c.logf)
	snap, err := loadSnapshot(filepath.Join(c.runDir, "state.json"))
	if err != nil {
		// Died before its snapshot was written: nothing it changed
		// outside the run dir can be known; take the machine as it is.
		c.logf("cluster: previous run left no snapshot (%v); undoing mounts under the run dir only", err)
		snap = TakeSnapshot()
	}
	if snap.RunDir == "" {
		snap.RunDir = c.runDir
	}
	errs := c.restore(snap)
	if err := safeRemoveAll(c.runDir); err != nil {
		errs = append(errs, err)
	}
	if left := snap.Diff(TakeSnapshot()); len(left) > 0 {
		c.logf("cluster: after cleaning up the previous run, still different: %s", strings.Join(left, "; "))
	}
	if len(errs) > 0 {
		return fmt.Errorf("cleaning up a previous run: %w", errors.Join(errs...))
	}
	return nil
}

// Down tears the cluster down and restores the machine; it is safe to
// call more than once (later calls return the first result). The error
// lists what could not be undone and what still differs from the state
// before Up.
func (c *Cluster) Down() error {
	c.downOnce.Do(func() {
		c.downErr = c.down()
		track(c, false)
	})
	return c.downErr
}

func (c *Cluster) down() error {
	t0 := time.Now()
	var errs []error
	// 1. No controller recreates what is deleted next.
	for _, n := range []string{"kube-controller-manager", "kube-scheduler"} {
		if p := c.proc(n); p != nil {
			p.stop(5 * time.Second)
		}
	}
	// 2. Pods deleted through the API while the kubelet runs: it kills
	//    their containers, tears down their network, unmounts their
	//    volumes and removes their cgroups.
	if api, kl := c.proc("kube-apiserver"), c.proc("kubelet"); c.api != nil && api != nil && !api.exited() && kl != nil && !kl.exited() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := c.deleteAllPods(ctx); err != nil {
			c.logf("cluster: deleting pods: %v (going on)", err)
		}
		cancel()
	}
	tPods := time.Since(t0)
	// 3. Processes tests started with Start, then the rest of the
	//    components, the node's first.
	c.mu.Lock()
	procs := append([]*proc(nil), c.procs...)
	c.mu.Unlock()
	for _, p := range procs {
		if !componentNames[p.name] {
			p.stop(5 * time.Second)
		}
	}
	for _, n := range []string{"kube-proxy", "kubelet", "kube-apiserver", "etcd"} {
		if p := c.proc(n); p != nil {
			p.stop(10 * time.Second)
		}
	}
	// 4. Containers left in containerd (kubelet gone before it collected
	//    them), then containerd, then shims that outlived it.
	if p := c.proc("containerd"); p != nil && !p.exited() {
		c.removeContainers()
		p.stop(10 * time.Second)
	}
	killAll(pidsMentioning(c.runDir+"/"), 5*time.Second)
	// 5. The machine.
	if c.snap != nil {
		errs = append(errs, c.restore(c.snap)...)
	}
	if left := pidsMentioning(c.runDir + "/"); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still running from the run dir: %v", left))
	}
	if err := safeRemoveAll(c.runDir); err != nil {
		errs = append(errs, err)
	}
	if c.snap != nil {
		now := TakeSnapshot()
		now.RunDir = c.runDir
		if diff := c.snap.Diff(now); len(diff) > 0 {
			errs = append(errs, fmt.Errorf("machine differs from before Up:\n  %s", strings.Join(diff, "\n  ")))
		}
	}
	c.releaseLock()
	c.logf("cluster: down in %v (pods deleted in %v)", time.Since(t0).Round(time.Millisecond), tPods.Round(time.Millisecond))
	return errors.Join(errs...)
}

var componentNames = map[string]bool{
	"containerd": true, "etcd": true, "kube-apiserver": true, "kube-controller-manager": true,
	"kube-scheduler": true, "kube-proxy": true, "kubelet": true,
}

// removeContainers force-deletes every task and container in containerd's
// k8s.io namespace.
func (c *Cluster) removeContainers() {
	ctr := c.containerdBin("ctr")
	sock := c.containerdSockPath()
	out, err := run(ctr, "-a", sock, "-n", "k8s.io", "containers", "list", "-q")
	if err != nil {
		c.logf("cluster: listing containers: %v", err)
		return
	}
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return
	}
	c.logf("cluster: removing %d containers left in containerd", len(ids))
	for _, id := range ids {
		run(ctr, "-a", sock, "-n", "k8s.io", "tasks", "delete", "--force", id)
	}
	run(ctr, append([]string{"-a", sock, "-n", "k8s.io", "containers", "delete"}, ids...)...)
}
