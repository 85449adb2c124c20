// Command probe is the e2e tests' general-purpose container: a static binary
// (no shell, no libc in the image) that logs what it sees and serves HTTP, so
// tests can check scheduling, readiness, logs, host PID namespace and the
// in-cluster path to the API server without pulling any image.
//
//	probe serve [-addr :8080]    log a start line, serve /healthz and /info
//	probe apiserver              GET /version from the API server with the
//	                             pod's service account, log the answer, then serve
//	probe info                   print /info's JSON and exit (for kubectl exec)
//	probe slots [-quota 250m -threads 2 -burn 2ms -pause 10ms -n 0]
//	                             invoke through the cpuslot agent's socket
//	                             ($CPUSLOT_SOCKET) in a loop with the Go
//	                             client; /stats counts successes and failures
//	probe invoke [-quota 250m -burn 0s -addr :8080]
//	                             serve /invoke: one invocation per request
//	                             on one thread, in a slot when the agent
//	                             serves the pod, else without one (as a
//	                             runtime fails open); the answer names the
//	                             slot (X-Cpuslot-Slot, "none" without)
//	probe firstslot [-quota 250m]
//	                             from its start, connect to the agent and
//	                             acquire a slot every millisecond until one
//	                             is granted; log how long after the start
//	                             (first-slot-us=) and the connection
//	                             attempts (tries=, 1: the socket was there
//	                             before its first instruction), then serve
//	probe quota [-quota 250m -for 2s]
//	                             spin in one slot, print its usage, exit
//	                             (for kubectl exec)
//	probe lend                   lend a sleeping lease's quota and take it
//	                             back (a pod with a 1-CPU limit and lend
//	                             ratio 0.5), print what was admitted, exit
//
// /info returns JSON: hostname, pid, whether PID 1 is the pod's own sandbox
// or the host's init (host PID namespace), and /proc/self/cgroup.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	log.SetFlags(log.LstdFlags | log.LUTC)
	mode := "serve"
	args := os.Args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		mode, args = args[0], args[1:]
	}
	mux := http.NewServeMux()
	addr := ":8080"
	switch mode {
	case "serve", "apiserver":
		fs := newFlags(mode)
		a := fs.String("addr", addr, "listen address")
		fs.Parse(args)
		addr = *a
		if mode == "apiserver" {
			if err := checkAPIServer(); err != nil {
				log.Printf("probe: apiserver check failed: %v", err)
			}
		}
	case "info":
		json.NewEncoder(os.Stdout).Encode(info())
		return
	case "slots":
		runSlots(args, mux)
	case "invoke":
		addr = runInvoke(args, mux)
	case "firstslot":
		runFirstSlot(args)
	case "quota":
		runQuota(args)
		return
	case "lend":
		runLend(args)
		return
	default:
		log.Fatalf("probe: unknown mode %q", mode)
	}
	serve(addr, mux)
}

func newFlags(mode string) *flag.FlagSet {
	return flag.NewFlagSet(mode, flag.ExitOnError)
}

func info() map[string]any {
	host, _ := os.Hostname()
	init, _ := os.ReadFile("/proc/1/cmdline")
	cg, _ := os.ReadFile("/proc/self/cgroup")
	return map[string]any{
		"hostname": host,
		"pid":      os.Getpid(),
		"pid1":     strings.ReplaceAll(strings.TrimRight(string(init), "\x00"), "\x00", " "),
		"cgroup":   string(cg),
		"node":     os.Getenv("NODE_NAME"),
		"podIP":    os.Getenv("POD_IP"),
	}
}

func serve(addr string, mux *http.ServeMux) {
	b, _ := json.Marshal(info())
	log.Printf("probe: started %s", b)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/info", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(info())
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("probe: %v", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	s := <-sigs
	log.Printf("probe: %v, exiting", s)
}

// checkAPIServer does what an in-cluster client does: service host and port
// from the environment, the service account's token and CA.
func checkAPIServer() error {
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	token, err := os.ReadFile(sa + "token")
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(sa + "ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in %sca.crt", sa)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + net.JoinHostPort(host, port) + "/version"
	var last error
	for i := 0; i < 20; i++ {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := c.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				log.Printf("probe: apiserver %s answered %s", url, strings.Join(strings.Fields(string(body)), " "))
				return nil
			}
			err = fmt.Errorf("%s: %s: %s", url, resp.Status, body)
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	return last
}
