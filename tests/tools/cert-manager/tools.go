//go:build tools

// Package tools pins the cert-manager commands the tests build and run as images: the
// controller, the webhook and the CA injector. v1.11 is the newest release whose commands are
// packages of the main module; from v1.12 on each is a module of its own, which the module
// proxy does not serve (tests/scripts/build-tools.sh). And helm, at the version cert-manager
// itself requires, which renders cert-manager's static install manifest from its chart.
package tools

import (
	_ "github.com/cert-manager/cert-manager/cmd/cainjector"
	_ "github.com/cert-manager/cert-manager/cmd/controller"
	_ "github.com/cert-manager/cert-manager/cmd/webhook"
	_ "helm.sh/helm/v3/cmd/helm"
)
