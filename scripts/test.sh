#!/usr/bin/env bash
# The test command (README): installs the system tools the end-to-end tests
# use when they are missing and we are root, builds the Kubernetes parts
# once per machine (scripts/k8s-test-env.sh: the API server, and kubelet,
# containerd, runc and the rest of a real cluster; a no-op after the first
# time; with the Gateway API CRDs written into the chart's crds/) and, as root, the container images the real cluster runs
# (scripts/build-images.sh --test-images), then runs every test in the
# workspace (arguments go to `cargo test --workspace`). Tests that need
# root, these tools or the API server skip with a printed reason where they
# cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v dig >/dev/null || need+=(bind9-dnsutils)
command -v iptables >/dev/null || need+=(iptables)
command -v ipset >/dev/null || need+=(ipset)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
if command -v go >/dev/null; then
  # --chart-crds: the Gateway API CRDs go into the chart's crds/, so the
  # real cluster's helm install serves Gateways (its waypoint phase).
  scripts/k8s-test-env.sh --chart-crds >/dev/null
  # The real cluster's tests (root only) run the images as a cluster
  # would: the project's three and the test pause and application images.
  if [ "$(id -u)" = 0 ]; then
    scripts/build-images.sh --test-images >/dev/null
  fi
else
  echo "test.sh: no Go toolchain: tests against the Kubernetes API server will skip" >&2
fi
if [ $# -gt 0 ]; then
  exec cargo test --workspace "$@"
fi
# The real cluster's test prints its figures (cluster start, helm install to
# Ready, pod creation to meshed, what each rollout dropped): it runs on its
# own, uncaptured, after the rest.
real_cluster=the_chart_installs_on_a_real_cluster_and_meshes_its_pods
cargo test --workspace -- --skip "$real_cluster"
exec cargo test -p ztunnel-proxy --test real_cluster -- --nocapture --exact "$real_cluster"
