#!/usr/bin/env bash
# The main job: the local demo mesh (run as root). Builds every binary in
# release mode, then runs ztunnel-demo: two nodes with the real CNI chain
# (bridge + host-local, then ztunnel-cni), a node agent and a shared-mode
# ztunnel on each, the control plane on its own (the CA, which feeds the
# ztunnels over xDS); a scripted scenario and a report.
# Installs the system tools it needs first when they are missing.
#
# --kubernetes: the same scenario with the control plane reading only a real
# Kubernetes API server (etcd + kube-apiserver started for the demo, built
# once per machine by scripts/k8s-test-env.sh, which needs Go).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
  echo "demo: needs root (network namespaces, iptables, setns); run: sudo $0" >&2
  exit 2
fi
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v iptables >/dev/null || need+=(iptables)
command -v ipset >/dev/null || need+=(ipset)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
for arg in "$@"; do
  if [ "$arg" = --kubernetes ]; then
    scripts/k8s-test-env.sh >/dev/null
  fi
done
cargo build --release -q --workspace --bins
exec target/release/ztunnel-demo "$@"
