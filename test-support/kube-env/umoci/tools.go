//go:build tools

// Package tools names the command this module pins, so that `go mod tidy`
// keeps its dependencies. umoci assembles and unpacks OCI image layouts
// without a container daemon (scripts/build-images.sh).
package tools

import (
	_ "github.com/opencontainers/umoci/cmd/umoci"
)
