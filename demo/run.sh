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
#
# --cluster: the same scenario on a real two-node cluster (kubelet,
# containerd, runc, kube-proxy, CoreDNS; built once per machine by
# scripts/k8s-test-env.sh) with the mesh installed by helm from the images
# of scripts/build-images.sh --test-images, built here into target/images.
#
# --cluster --istio: the same, with Istio's own istiod, istio-cni and
# charts around our ztunnel (scripts/k8s-test-env.sh --istio builds them
# from the pinned istio/istio module, 13 more minutes the first time;
# scripts/build-images.sh --istio-images packs their images).
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
cluster=0
istio=()
istio_images=()
for arg in "$@"; do
  case "$arg" in
    --kubernetes) scripts/k8s-test-env.sh >/dev/null ;;
    --cluster) cluster=1 ;;
    --istio) istio=(--istio); istio_images=(--istio-images) ;;
  esac
done
if [ "$cluster" = 1 ]; then
  # The cluster runs every binary from the images; the demo only drives it.
  echo "demo: building the cluster's parts (scripts/k8s-test-env.sh ${istio[*]}: about 14 minutes on 2 cores the first time, 27 with --istio, then cached)" >&2
  scripts/k8s-test-env.sh "${istio[@]}" >/dev/null
  echo "demo: building the images (scripts/build-images.sh --test-images ${istio_images[*]}: about 12 minutes the first time)" >&2
  scripts/build-images.sh --test-images "${istio_images[@]}" --out target/images >/dev/null
  export ZTUNNEL_IMAGES="$PWD/target/images"
  cargo build --release -q -p ztunnel-demo
else
  cargo build --release -q --workspace --bins
fi
exec "${CARGO_TARGET_DIR:-target}/release/ztunnel-demo" "$@"
