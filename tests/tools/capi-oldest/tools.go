//go:build tools

// Package tools pins the manager of the oldest Cluster API release bootplate supports: scenarios
// a and b of tests/tests/capi.rs run against it too, with its own CRDs and manifests. Before
// v1.14 the core manager's main package is the module's root.
package tools

import (
	_ "sigs.k8s.io/cluster-api"
)
