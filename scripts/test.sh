#!/usr/bin/env bash
# The test command (README): installs the system tools the end-to-end tests
# use when they are missing and we are root, builds the Kubernetes parts
# once per machine (scripts/k8s-test-env.sh: the API server, and kubelet,
# containerd, runc and the rest of a real cluster; a no-op after the first
# time; with the Gateway API CRDs written into the chart's crds/, and
# Istio's group) and, as root, the container images the real cluster runs
# (scripts/build-images.sh --test-images --istio-images), then runs every test in the
# workspace (arguments go to `cargo test --workspace`). Tests that need
# root, these tools or the API server skip with a printed reason where they
# cannot run, and fail with it instead where ZTUNNEL_NO_SKIPS is set (as
# .ci/run sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
# What the tests run that a Debian or Ubuntu base lacks (it has util-linux's
# unshare and nsenter, mount, tar, coreutils and getent): `ip` and `ss`,
# `dig`, iptables and ip6tables, ipset, the reference CNI plugins; `openssl
# s_server` and `s_client` for the TLS record layer's interop tests;
# procps's `sysctl` (the test cluster's forwarding) and `kill` (the
# shutdown tests' signals).
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v dig >/dev/null || need+=(bind9-dnsutils)
command -v iptables >/dev/null || need+=(iptables)
command -v ipset >/dev/null || need+=(ipset)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v openssl >/dev/null || need+=(openssl)
# The benchmark harness's --perf (system calls, context switches, profiles).
command -v perf >/dev/null || need+=(linux-perf)
# The operating system's roots, which CA_ROOT_CA=SYSTEM is tested against.
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
# `type -P`: the programs on PATH, not bash's builtin kill.
type -P sysctl kill >/dev/null || need+=(procps)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
if command -v go >/dev/null; then
  # --chart-crds: the Gateway API CRDs go into the chart's crds/, so the
  # real cluster's helm install serves Gateways (its waypoint phase).
  # --istio: Istio's istiod, istio-cni, istioctl and charts, built from
  # the pinned istio/istio module (13 minutes the first time), which the
  # real cluster's Istio test installs.
  scripts/k8s-test-env.sh --chart-crds --istio >/dev/null
  # The real cluster's tests (root only) run the images as a cluster
  # would: the project's three, the test pause and application images,
  # and Istio's istiod and istio-cni.
  if [ "$(id -u)" = 0 ]; then
    scripts/build-images.sh --test-images --istio-images >/dev/null
  fi
else
  echo "test.sh: no Go toolchain: tests against the Kubernetes API server will skip" >&2
fi
if [ $# -gt 0 ]; then
  exec cargo test --workspace "$@"
fi
# The real cluster's tests print their figures (cluster start, helm
# install to Ready, pod creation to meshed, what each rollout dropped):
# they run on their own, uncaptured, one after the other, after the rest.
real_cluster=(
  the_chart_installs_on_a_real_cluster_and_meshes_its_pods
  istios_istiod_istio_cni_and_charts_drive_our_ztunnel_on_a_real_cluster
)
skips=()
for test in "${real_cluster[@]}"; do skips+=(--skip "$test"); done
cargo test --workspace -- "${skips[@]}"
for test in "${real_cluster[@]}"; do
  cargo test -p ztunnel-proxy --test real_cluster -- --nocapture --exact "$test"
done
