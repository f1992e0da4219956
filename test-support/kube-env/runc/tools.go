//go:build tools

// Package tools names the command this module pins, so that `go mod tidy`
// keeps its dependencies: runc, the OCI runtime containerd's shim starts
// each test container with.
package tools

import (
	_ "github.com/opencontainers/runc"
)
