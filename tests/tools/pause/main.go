// Command pause is the sandbox process of the test cluster's Pods: it holds a Pod's namespaces
// and does nothing else. It sleeps until SIGTERM or SIGINT and then exits 0, as the kubelet's
// own pause image does. It is built static (CGO_ENABLED=0) so that it runs on an empty base
// image (tests/scripts/build-images.sh).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reapChildren()
			continue
		}
		return
	}
}

// reapChildren waits for every exited child: as PID 1 of a Pod's shared PID namespace the
// sandbox inherits orphans, which would otherwise stay zombies.
func reapChildren() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
