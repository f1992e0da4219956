//go:build tools

// Package tools names the command this module pins, so that `go mod tidy`
// keeps its dependencies. Helm has a module of its own because it requires
// the k8s.io staging modules at v0.36, while the API server's module
// replaces them with its own v0.37 copies.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
