package cluster

// Starting the cluster's components: its certificates, the control plane,
// the kubelet, and the waits until each answers.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"
)

// containerdBin is the path of one of the cluster's containerd binaries.
func (c *Cluster) containerdBin(name string) string {
	return filepath.Join(c.opts.ContainerdBinDir, name)
}

func mustLook(name string) string {
	p, err := lookPath(name)
	if err != nil {
		return name
	}
	return p
}

func (c *Cluster) writePKI() error {
	p, err := newPKI(filepath.Join(c.runDir, "pki"))
	if err != nil {
		return err
	}
	c.pki = p
	ip := net.ParseIP(c.nodeIP)
	lo := net.ParseIP("127.0.0.1")
	specs := []certSpec{
		{name: "apiserver", cn: "kube-apiserver", server: true,
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", c.nodeName},
			ips: []net.IP{ip, lo, net.ParseIP(kubernetesSvc)}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}, client: true},
		{name: "admin", cn: "cpuslot-e2e-admin", orgs: []string{"system:masters"}, client: true},
		{name: "controller-manager", cn: "system:kube-controller-manager", client: true},
		{name: "scheduler", cn: "system:kube-scheduler", client: true},
		{name: "kube-proxy", cn: "system:kube-proxy", client: true},
		{name: "kubelet-client", cn: "system:node:" + c.nodeName, orgs: []string{"system:nodes"}, client: true},
		// The API server checks this against the node IP for logs/exec.
		{name: "kubelet", cn: c.nodeName, server: true, dns: []string{c.nodeName, "localhost"}, ips: []net.IP{ip, lo}},
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	for _, n := range []string{"admin", "controller-manager", "scheduler", "kube-proxy", "kubelet-client"} {
		path, err := c.writeKubeconfig(n, n)
		if err != nil {
			return err
		}
		if n == "admin" {
			c.kubeconfig = path
		}
	}
	return nil
}

func (c *Cluster) startControlPlane() error {
	kc := func(n string) string { return filepath.Join(c.runDir, n+".kubeconfig") }
	if _, err := c.start("kube-controller-manager", []string{filepath.Join(c.binDir, "kube-controller-manager"),
		"--kubeconfig", kc("controller-manager"),
		"--authentication-kubeconfig", kc("controller-manager"),
		"--authorization-kubeconfig", kc("controller-manager"),
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--service-account-private-key-file", c.pki.path("sa.key"),
		"--root-ca-file", c.pki.path("ca.crt"),
		"--cluster-signing-cert-file", c.pki.path("ca.crt"),
		"--cluster-signing-key-file", c.pki.path("ca.key"),
		"--service-cluster-ip-range", serviceCIDR,
		"--allocate-node-cidrs=false",
		"--profiling=false",
	}, nil); err != nil {
		return err
	}
	if _, err := c.start("kube-scheduler", []string{filepath.Join(c.binDir, "kube-scheduler"),
		"--kubeconfig", kc("scheduler"),
		"--authentication-kubeconfig", kc("scheduler"),
		"--authorization-kubeconfig", kc("scheduler"),
		"--bind-address", "127.0.0.1",
		"--leader-elect=false",
		"--profiling=false",
	}, nil); err != nil {
		return err
	}
	if !c.opts.NoKubeProxy {
		cfg, err := c.writeKubeProxyConfig(kc("kube-proxy"))
		if err != nil {
			return err
		}
		if _, err := c.start("kube-proxy", []string{filepath.Join(c.binDir, "kube-proxy"), "--config", cfg}, nil); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startKubelet() (*proc, error) {
	cfg, err := c.writeKubeletConfig()
	if err != nil {
		return nil, err
	}
	return c.start("kubelet", []string{filepath.Join(c.binDir, "kubelet"),
		"--config", cfg,
		"--kubeconfig", filepath.Join(c.runDir, "kubelet-client.kubeconfig"),
		"--node-ip", c.nodeIP,
		"--hostname-override", c.nodeName,
		"--v", "1",
	}, nil)
}

// waitFor polls check every 100 ms until it succeeds, p exits, ctx ends or
// timeout passes.
func (c *Cluster) waitFor(ctx context.Context, p *proc, timeout time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("waiting for %s: %s exited (%v); last lines of %s:\n%s", what, p.name, p.err, p.logPath, p.tail(30))
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("waiting for %s: not after %v: %v", what, timeout, last)
			if p != nil {
				msg += fmt.Sprintf("; last lines of %s:\n%s", p.logPath, p.tail(30))
			}
			return errors.New(msg)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
