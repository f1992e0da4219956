//go:build tools

// Package tools names the command this module pins, so that `go mod tidy`
// keeps its dependencies: crictl, to look at a test node's pods and
// containers through the CRI, as an operator would.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
)
