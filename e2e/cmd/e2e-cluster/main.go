// Command e2e-cluster brings up the e2e cluster (e2e/cluster) and keeps it
// up until SIGINT or SIGTERM, then takes it down and checks the machine is
// as before. For poking at the cluster by hand:
//
//	go -C e2e run ./cmd/e2e-cluster       # as root, after make e2e-deps images
//	export KUBECONFIG=/var/lib/cpuslot-e2e/admin.kubeconfig   # printed
//
// -for 10m stops it after a while on its own.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cpuslot/cpuslot/e2e/cluster"
)

func main() {
	dur := flag.Duration("for", 0, "take the cluster down after this long (0: on SIGINT/SIGTERM only)")
	noProxy := flag.Bool("no-kube-proxy", false, "run without kube-proxy")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	c, err := cluster.Up(ctx, cluster.Options{Logf: logger.Printf, NoKubeProxy: *noProxy})
	if err != nil {
		logger.Fatal(err)
	}
	fmt.Printf("export KUBECONFIG=%s\n# containerd: %s   node: %s %s   logs: %s\n",
		c.Kubeconfig(), c.ContainerdSocket(), c.NodeName(), c.NodeIP(), c.LogDir())
	if *dur > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(*dur):
		}
	} else {
		<-ctx.Done()
	}
	if err := c.Down(); err != nil {
		logger.Fatal(err)
	}
	logger.Print("down; machine as before")
}
