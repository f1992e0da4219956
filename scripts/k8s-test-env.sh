#!/usr/bin/env bash
# Builds the real Kubernetes parts the tests run against, each group from a
# wrapper module under test-support/kube-env whose go.mod and go.sum pin
# every version:
#   kube        kube-apiserver, kubectl, kubelet, kube-controller-manager,
#               kube-scheduler, kube-proxy (k8s.io/kubernetes)
#   etcd        etcd (go.etcd.io/etcd/server)
#   helm        helm (helm.sh/helm/v4)
#   umoci       umoci, the daemonless OCI image tool of scripts/build-images.sh
#   containerd  containerd, containerd-shim-runc-v2, ctr
#   runc        runc (cgo, with seccomp: needs libseccomp-dev)
#   cri-tools   crictl
#   coredns     coredns, the test cluster's DNS
#   istio       pilot-discovery (istiod), install-cni, istio-cni, istioctl
#               (istio.io/istio), and Istio's charts (base,
#               istio-discovery, istio-cni, ztunnel) from the same module,
#               linked as `current/istio-charts`; built only with --istio
#               (13 minutes cold on 2 cores, beside a release build), then
#               linked on every call
#
# and the Gateway API CRDs (sigs.k8s.io/gateway-api, its
# config/crd/experimental/ bundle), not built but extracted from the
# module the wrapper test-support/kube-env/gateway-api pins, fetched
# through the Go module proxy into parts/gateway-api-HASH/crds and linked
# as `current/crds`. They are not kept in this repository.
#
# Each group is cached on its own, outside target/ (default
# ~/.cache/ztunnel-kube-env/parts/GROUP-HASH), keyed by its module files and
# its build recipe, so a change to one group rebuilds only that one. The
# directory `current/bin` (the one test-support looks in) links every
# group's binaries. A second call with the same pins builds nothing.
#
#   scripts/k8s-test-env.sh          build what is missing, print the bin directory
#   scripts/k8s-test-env.sh --chart-crds
#                                    also write the Gateway and GatewayClass
#                                    CRDs into deploy/charts/ztunnel-mesh/crds/
#                                    (git-ignored), for a helm install
#   scripts/k8s-test-env.sh --istio  also build Istio's group
#   ZTUNNEL_KUBE_ENV=DIR ...         another cache directory
#   GOCACHE=DIR ...                  build with (and keep) this Go build cache
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${ZTUNNEL_KUBE_ENV:-$HOME/.cache/ztunnel-kube-env}"
modules=test-support/kube-env
version=v1.37.2

if ! command -v go >/dev/null; then
  echo "k8s-test-env: no Go toolchain on PATH; the Kubernetes parts cannot be built" >&2
  exit 1
fi

# The version the Kubernetes binaries report (/version, kubectl version,
# the node's kubeletVersion) is stamped at link time, as Kubernetes' own
# build does.
kube_stamp="-X k8s.io/component-base/version.gitVersion=$version"
kube_stamp+=" -X k8s.io/component-base/version.gitMajor=1"
kube_stamp+=" -X k8s.io/component-base/version.gitMinor=37"
kube_stamp+=" -X k8s.io/component-base/version.gitTreeState=clean"
kube_stamp+=" -X k8s.io/client-go/pkg/version.gitVersion=$version"
kube_stamp+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
kube_stamp+=" -X k8s.io/client-go/pkg/version.gitMinor=37"

# One line per group: name, module directory, binaries, then the build
# command run in the module directory with $OUT the output directory. The
# line is part of the group's cache key.
recipes=(
  "kube|.|kube-apiserver kubectl kubelet kube-controller-manager kube-scheduler kube-proxy|CGO_ENABLED=0 go build -trimpath -ldflags \"-s -w $kube_stamp\" -o \$OUT/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy"
  "etcd|etcd|etcd|CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o \$OUT/etcd ."
  "helm|helm|helm|CGO_ENABLED=0 go build -trimpath -ldflags '-s -w -X helm.sh/helm/v4/internal/version.version=v4.3.2 -X helm.sh/helm/v4/internal/version.metadata=' -o \$OUT/helm helm.sh/helm/v4/cmd/helm"
  "umoci|umoci|umoci|CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o \$OUT/umoci github.com/opencontainers/umoci/cmd/umoci"
  "containerd|containerd|containerd containerd-shim-runc-v2 ctr|CGO_ENABLED=0 go build -trimpath -tags 'no_btrfs no_devmapper no_zfs' -ldflags '-s -w -X github.com/containerd/containerd/v2/version.Version=v2.4.2' -o \$OUT/ github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr"
  "runc|runc|runc|CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags '-s -w -X main.version=1.5.3' -o \$OUT/runc github.com/opencontainers/runc"
  "cri-tools|cri-tools|crictl|CGO_ENABLED=0 go build -trimpath -ldflags '-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v1.37.0' -o \$OUT/crictl sigs.k8s.io/cri-tools/cmd/crictl"
  "coredns|coredns|coredns|CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o \$OUT/coredns github.com/coredns/coredns"
)

# Istio's group, stamped with the version its VERSION file gives (with
# Istio's own -dev suffix for builds of its main branch) and the commit of
# the pinned pseudo-version. Building it first downloads the module, so
# that a proxy that no longer serves the pin fails with a message saying so.
istio_pin=v0.0.0-20260827124520-eed52ebb66ad
istio_stamp="-X istio.io/istio/pkg/version.buildVersion=1.31-dev"
istio_stamp+=" -X istio.io/istio/pkg/version.buildGitRevision=${istio_pin##*-}"
istio_stamp+=" -X istio.io/istio/pkg/version.buildStatus=Clean"
istio_stamp+=" -X istio.io/istio/pkg/version.buildTag=1.31-dev"
istio_charts="base istio-control/istio-discovery istio-cni ztunnel"
istio_recipe="istio|istio|pilot-discovery install-cni istio-cni istioctl|go mod download istio.io/istio || { echo 'k8s-test-env: the Go module proxy does not serve istio.io/istio@$istio_pin (pinned in test-support/kube-env/istio/go.mod): Istio'\''s components cannot be built' >&2; exit 1; }; CGO_ENABLED=0 go build -trimpath -ldflags '-s -w $istio_stamp' -o \$OUT/ istio.io/istio/pilot/cmd/pilot-discovery istio.io/istio/cni/cmd/install-cni istio.io/istio/cni/cmd/istio-cni istio.io/istio/istioctl/cmd/istioctl && src=\$(go list -m -f '{{.Dir}}' istio.io/istio) && mkdir -p \$OUT/../charts && for chart in $istio_charts; do cp -r \$src/manifests/charts/\$chart \$OUT/../charts/; done && chmod -R u+w \$OUT/../charts"

group_key() { # recipe -> hash of the recipe and its module's files
  local dir
  dir="$modules/$(cut -d'|' -f2 <<<"$1")"
  { printf '%s\n' "$1"; cat "$dir"/go.mod "$dir"/go.sum "$dir"/*.go; } | sha256sum | cut -c1-16
}
# The Gateway API CRDs: keyed by the wrapper module's pins.
crds_key() {
  cat "$modules/gateway-api/go.mod" "$modules/gateway-api/go.sum" | sha256sum | cut -c1-16
}
crds_dir() { echo "$cache/parts/gateway-api-$(crds_key)/crds"; }
# Downloads the pinned module (checked against the wrapper's go.sum) and
# copies out the CRDs of its experimental bundle, once per pin.
fetch_crds() {
  local out module file
  out="$(crds_dir)"
  [ -e "$out/gateway.networking.k8s.io_gateways.yaml" ] && return 0
  module="$(cd "$modules/gateway-api" && GOFLAGS="-mod=readonly" go mod download -json sigs.k8s.io/gateway-api |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  if [ -z "$module" ] || ! [ -d "$module/config/crd/experimental" ]; then
    echo "k8s-test-env: sigs.k8s.io/gateway-api could not be downloaded" >&2
    return 1
  fi
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  for file in "$module"/config/crd/experimental/*.yaml; do
    if grep -x 'kind: CustomResourceDefinition' "$file" >/dev/null; then
      cp "$file" "$out.tmp/"
    fi
  done
  chmod u+w "$out.tmp"/*
  mv "$out.tmp" "$out"
}
# Writes the two CRDs the control plane watches into the chart.
chart_crds() {
  local kind
  for kind in gateways gatewayclasses; do
    cp "$(crds_dir)/gateway.networking.k8s.io_$kind.yaml" deploy/charts/ztunnel-mesh/crds/
  done
  echo "k8s-test-env: Gateway API CRDs written to deploy/charts/ztunnel-mesh/crds/" >&2
}

group_built() { # directory binaries...
  local dir="$1" tool
  shift
  for tool in "$@"; do
    [ -x "$dir/bin/$tool" ] || return 1
  done
}

# Links every group's binaries into one bin directory named after all the
# keys, then points `current` at it.
assemble() {
  local keys="" recipe name bins key tool
  for recipe in "${recipes[@]}"; do
    keys+="$(group_key "$recipe")"
  done
  keys+="$(crds_key)"
  local combined
  combined="$(sha256sum <<<"$keys" | cut -c1-16)"
  rm -rf "$cache/$combined.tmp"
  mkdir -p "$cache/$combined.tmp/bin"
  ln -s "../parts/gateway-api-$(crds_key)/crds" "$cache/$combined.tmp/crds"
  for recipe in "${recipes[@]}"; do
    IFS='|' read -r name _ bins _ <<<"$recipe"
    key="$(group_key "$recipe")"
    for tool in $bins; do
      ln -s "../../parts/$name-$key/bin/$tool" "$cache/$combined.tmp/bin/$tool"
    done
    if [ "$name" = istio ]; then
      ln -s "../parts/istio-$key/charts" "$cache/$combined.tmp/istio-charts"
    fi
  done
  rm -rf "${cache:?}/$combined"
  mv "$cache/$combined.tmp" "$cache/$combined"
  ln -sfn "$combined" "$cache/current"
  # Bin directories of other pins (and of this script's older one-key
  # layout) are left from earlier builds: give their disk back.
  local dir
  for dir in "$cache"/*/; do
    dir="${dir%/}"
    case "${dir##*/}" in parts | current | "$combined") ;; *) rm -rf "$dir" ;; esac
  done
}

missing() {
  local recipe name bins
  for recipe in "${recipes[@]}"; do
    IFS='|' read -r name _ bins _ <<<"$recipe"
    # shellcheck disable=SC2086
    group_built "$cache/parts/$name-$(group_key "$recipe")" $bins || echo "$name"
  done
}

chart=""
istio=""
for arg in "$@"; do
  case "$arg" in
    --chart-crds) chart=1 ;;
    --istio) istio=1 ;;
    *) echo "k8s-test-env: unknown argument $arg" >&2; exit 2 ;;
  esac
done
# Istio's group joins the others when asked for, or once it is built.
istio_dir="$cache/parts/istio-$(group_key "$istio_recipe")"
if [ -n "$istio" ] || group_built "$istio_dir" pilot-discovery install-cni istio-cni istioctl; then
  recipes+=("$istio_recipe")
fi

if [ -z "$(missing)" ]; then
  fetch_crds
  assemble
  [ -z "$chart" ] || chart_crds
  echo "$cache/current/bin"
  exit 0
fi

# One build at a time: two concurrent runs would share (and delete) each
# other's build directory. The second waits, then finds the binaries built.
mkdir -p "$cache/parts"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "k8s-test-env: another build is running; waiting for it" >&2
  flock 9
fi

# runc links libseccomp: install its headers when we can.
# (Not `grep -q`: it stops reading at the first match, and under pipefail
# the SIGPIPE that `missing` then gets fails the test.)
to_build="$(missing)"
if grep -x runc >/dev/null <<<"$to_build" && ! [ -e /usr/include/seccomp.h ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libseccomp-dev >&2
  else
    echo "k8s-test-env: runc needs libseccomp-dev (seccomp.h); install it as root" >&2
    exit 1
  fi
fi

# A build cache of its own, removed after a good build: Kubernetes' takes
# ~4 GB and would only be used again when the pins change. A GOCACHE the
# caller exported is used instead, and kept.
build_cache=""
if [ -z "${GOCACHE:-}" ]; then
  build_cache="$cache/go-build"
  export GOCACHE="$build_cache"
fi
export GOFLAGS="-mod=readonly -buildvcs=false"

started=$(date +%s)
echo "k8s-test-env: building $(tr '\n' ' ' <<<"$to_build")into $cache/parts (cold, all groups: about 14 minutes on 2 cores)" >&2
for recipe in "${recipes[@]}"; do
  IFS='|' read -r name dir bins command <<<"$recipe"
  key="$(group_key "$recipe")"
  out="$cache/parts/$name-$key"
  # shellcheck disable=SC2086
  group_built "$out" $bins && continue
  group_started=$(date +%s)
  rm -rf "$out"
  mkdir -p "$out/bin.tmp"
  (cd "$modules/$dir" && OUT="$out/bin.tmp" bash -c "$command")
  mv "$out/bin.tmp" "$out/bin"
  echo "k8s-test-env: $name built in $(( $(date +%s) - group_started )) s" >&2
done
if [ -n "$build_cache" ]; then
  chmod -R u+w "$build_cache" 2>/dev/null || true
  rm -rf "$build_cache"
fi
# Groups of older pins are no longer linked from anywhere: give their disk back.
for dir in "$cache"/parts/*; do
  keep=""
  for recipe in "${recipes[@]}"; do
    [ "$dir" = "$cache/parts/$(cut -d'|' -f1 <<<"$recipe")-$(group_key "$recipe")" ] && keep=1
  done
  [ "$dir" = "$cache/parts/gateway-api-$(crds_key)" ] && keep=1
  [ "$dir" = "$istio_dir" ] && keep=1
  [ -n "$keep" ] || rm -rf "$dir"
done
fetch_crds
assemble
[ -z "$chart" ] || chart_crds
echo "k8s-test-env: built in $(( $(date +%s) - started )) s; $(du -shL "$cache/current/bin" | cut -f1) of binaries" >&2
"$cache/current/bin/kube-apiserver" --version >&2
echo "$cache/current/bin"
