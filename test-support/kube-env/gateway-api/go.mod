// Pins the Gateway API whose CRDs (config/crd/experimental/) the tests'
// API server and the chart's crds/ get: scripts/k8s-test-env.sh extracts
// them from this module's download. No code is built from it.
module ztunnel.test/kube-env/gateway-api

go 1.26.0

require sigs.k8s.io/gateway-api v1.6.3
