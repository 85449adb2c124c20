// Command pause is the pod sandbox's process for the e2e cluster (the image
// named as containerd's sandbox_image): it holds the pod's namespaces, reaps
// the zombies re-parented to it (it is PID 1 of a pod that shares its PID
// namespace) and exits on SIGTERM or SIGINT. Static (CGO_ENABLED=0).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		switch s {
		case syscall.SIGCHLD:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		default:
			os.Exit(0)
		}
	}
}
