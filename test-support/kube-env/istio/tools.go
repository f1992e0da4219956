//go:build tools

// Package tools names the commands this module pins, so that `go mod tidy`
// keeps their dependencies: istiod, the istio-cni node agent and its CNI
// plugin, and istioctl.
package tools

import (
	_ "istio.io/istio/cni/cmd/install-cni"
	_ "istio.io/istio/cni/cmd/istio-cni"
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
