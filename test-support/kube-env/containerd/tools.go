//go:build tools

// Package tools names the commands this module pins, so that `go mod tidy`
// keeps their dependencies: containerd (the container runtime behind each
// test node's kubelet, through its CRI plugin), its runc shim and ctr (which
// loads the test images into a node's image store).
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
