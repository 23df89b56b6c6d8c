//go:build tools

// Package tools pins the Cluster API commands the tests build: the core manager, clusterctl and
// the kubeadm bootstrap provider's manager.
package tools

import (
	_ "sigs.k8s.io/cluster-api/core"
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
)
