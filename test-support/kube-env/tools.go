//go:build tools

// Package tools names the commands this module pins, so that `go mod tidy`
// keeps their dependencies: the API server and kubectl, and the parts of a
// real node and control plane (kubelet, kube-proxy, controller-manager,
// scheduler) that test-support's cluster runs.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
