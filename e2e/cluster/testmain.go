package cluster

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// Enabled reports whether the e2e tests are to run (CPUSLOT_E2E=1). When
// they are, a missing dependency is a failure, not a skip.
func Enabled() bool { return os.Getenv("CPUSLOT_E2E") == "1" }

// Main is a TestMain body for a package whose tests share one cluster:
//
//	var c *cluster.Cluster
//	func TestMain(m *testing.M) { os.Exit(cluster.Main(m, cluster.Options{}, &c)) }
//
// Without CPUSLOT_E2E=1 it runs the tests with *c nil (they skip, see
// Need). Otherwise it waits out a quiet period ($CPUSLOT_QUIET, default
// /tmp/cpuslot-quiet, while that file exists), brings the cluster up, runs the tests and takes the
// cluster down, also when a test fails, on SIGINT/SIGTERM/SIGHUP, and a
// minute before go test's -timeout would kill the test binary (which runs
// no deferred code). A teardown that leaves the machine changed fails the
// run.
func Main(m *testing.M, opts Options, c **Cluster) int {
	flag.Parse()
	if !Enabled() {
		return m.Run()
	}
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	if opts.Logf == nil {
		opts.Logf = logger.Printf
	}
	if err := opts.Defaults(); err != nil {
		logger.Printf("e2e: %v", err)
		return 1
	}
	if err := opts.CheckDeps(); err != nil {
		logger.Printf("e2e: %v", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var cl *Cluster
	exit := func(code int, why string) {
		logger.Printf("e2e: %s: tearing the cluster down", why)
		if cl != nil {
			if err := cl.Down(); err != nil {
				logger.Printf("e2e: teardown: %v", err)
			}
		}
		os.Exit(code)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	upDone := make(chan struct{})
	go func() {
		s := <-sigs
		cancel() // stops a pending Up, which then tears down itself
		<-upDone
		exit(130, fmt.Sprintf("got %v", s))
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if g, ok := f.Value.(flag.Getter); ok {
			if d, ok := g.Get().(time.Duration); ok && d > 2*time.Minute {
				t := time.AfterFunc(d-time.Minute, func() {
					<-upDone
					exit(1, fmt.Sprintf("go test -timeout %v is a minute away", d))
				})
				defer t.Stop()
			}
		}
	}

	// A quiet period (another session benchmarking on this machine): wait
	// before the CPU-heavy start.
	quiet := os.Getenv("CPUSLOT_QUIET")
	if quiet == "" {
		quiet = "/tmp/cpuslot-quiet"
	}
	for logged := false; ; logged = true {
		if _, err := os.Stat(quiet); err != nil {
			break
		}
		if !logged {
			logger.Printf("e2e: quiet period (%s exists): waiting before bringing the cluster up", quiet)
		}
		select {
		case <-ctx.Done():
			close(upDone)
			return 1
		case <-time.After(10 * time.Second):
		}
	}

	t0 := time.Now()
	var err error
	cl, err = Up(ctx, opts)
	close(upDone)
	if err != nil {
		logger.Printf("e2e: cluster up: %v", err)
		return 1
	}
	logger.Printf("e2e: cluster up in %v (node %s at %s; kubeconfig %s)", time.Since(t0).Round(time.Millisecond), cl.NodeName(), cl.NodeIP(), cl.Kubeconfig())
	*c = cl
	code := m.Run()
	t1 := time.Now()
	if err := cl.Down(); err != nil {
		logger.Printf("e2e: teardown: %v", err)
		code = 1
	} else {
		logger.Printf("e2e: cluster down in %v; machine state as before Up", time.Since(t1).Round(time.Millisecond))
	}
	return code
}

// Need skips the test unless the e2e tests are enabled, and fails it if
// they are but there is no cluster.
func Need(t testing.TB, c *Cluster) *Cluster {
	t.Helper()
	if !Enabled() {
		t.Skip("e2e: set CPUSLOT_E2E=1 (root, after hack/e2e-deps.sh and make images)")
	}
	if c == nil {
		t.Fatal("e2e: no cluster")
	}
	return c
}
