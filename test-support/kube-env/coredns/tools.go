//go:build tools

// Package tools names the command this module pins, so that `go mod tidy`
// keeps its dependencies: CoreDNS, the test cluster's DNS (the kubernetes
// plugin answers Service names, as in any cluster).
package tools

import (
	_ "github.com/coredns/coredns"
)
