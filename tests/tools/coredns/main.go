// Command coredns is CoreDNS's own server (its coredns.go: every plugin of core/plugin, then
// coremain), built from its module for the control-plane images of the tests.
package main

import (
	_ "github.com/coredns/coredns/core/plugin"
	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
