//go:build tools

// Package tools pins crictl (sigs.k8s.io/cri-tools), the CRI client the mirror drill of
// tests/tests/network.rs pulls images with, through containerd's CRI plugin as the kubelet does.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
