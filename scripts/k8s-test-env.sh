#!/usr/bin/env bash
# Builds the real Kubernetes parts the tests run against: kube-apiserver and
# kubectl (test-support/kube-env, k8s.io/kubernetes), etcd
# (test-support/kube-env/etcd, go.etcd.io/etcd/server), helm
# (test-support/kube-env/helm, helm.sh/helm/v4) and umoci
# (test-support/kube-env/umoci, the daemonless OCI image tool that
# scripts/build-images.sh uses). Every version is pinned in those modules'
# go.mod and go.sum.
#
# The binaries go to a cache outside target/ (default
# ~/.cache/ztunnel-kube-env), in a directory named after the hash of the
# pinning files, with `current` pointing at it; test-support's `KubeApi`
# looks there. A second call with the same pins does nothing.
#
#   scripts/k8s-test-env.sh          build if needed, print the bin directory
#   ZTUNNEL_KUBE_ENV=DIR ...         another cache directory
#   GOCACHE=DIR ...                  build with (and keep) this Go build cache
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${ZTUNNEL_KUBE_ENV:-$HOME/.cache/ztunnel-kube-env}"
modules=test-support/kube-env
version=v1.37.2

if ! command -v go >/dev/null; then
  echo "k8s-test-env: no Go toolchain on PATH; the API server cannot be built" >&2
  exit 1
fi

key="$(cat "$0" "$modules"/go.mod "$modules"/go.sum "$modules"/tools.go \
  "$modules"/etcd/go.mod "$modules"/etcd/go.sum "$modules"/etcd/main.go \
  "$modules"/helm/go.mod "$modules"/helm/go.sum "$modules"/helm/tools.go \
  "$modules"/umoci/go.mod "$modules"/umoci/go.sum "$modules"/umoci/tools.go \
  | sha256sum | cut -c1-16)"
out="$cache/$key"
built() {
  for tool in kube-apiserver etcd kubectl helm umoci; do
    [ -x "$out/bin/$tool" ] || return 1
  done
}
if built; then
  ln -sfn "$key" "$cache/current"
  echo "$out/bin"
  exit 0
fi

# One build at a time: two concurrent runs would share (and delete) each
# other's build directory. The second waits, then finds the binaries built.
mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "k8s-test-env: another build is running; waiting for it" >&2
  flock 9
fi
if built; then
  ln -sfn "$key" "$cache/current"
  echo "$out/bin"
  exit 0
fi

mkdir -p "$out"
# A build cache of its own, removed after a good build: the API server's
# takes ~3 GB and would only be used again when the pins change. A GOCACHE
# the caller exported is used instead, and kept.
build_cache=""
if [ -z "${GOCACHE:-}" ]; then
  build_cache="$out/go-build"
  export GOCACHE="$build_cache"
fi
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

started=$(date +%s)
echo "k8s-test-env: building kube-apiserver, kubectl $version, etcd, helm and umoci into $out (cold: 10-15 minutes on 2 cores)" >&2
# The version the binaries report (/version, kubectl version) is stamped at
# link time, as Kubernetes' own build does.
stamp="-X k8s.io/component-base/version.gitVersion=$version"
stamp+=" -X k8s.io/component-base/version.gitMajor=1"
stamp+=" -X k8s.io/component-base/version.gitMinor=37"
stamp+=" -X k8s.io/component-base/version.gitTreeState=clean"
stamp+=" -X k8s.io/client-go/pkg/version.gitVersion=$version"
stamp+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
stamp+=" -X k8s.io/client-go/pkg/version.gitMinor=37"
(
  cd "$modules"
  go build -trimpath -ldflags "-s -w $stamp" -o "$out/bin.tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
)
(
  cd "$modules/etcd"
  go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/etcd" .
)
(
  cd "$modules/helm"
  go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=v4.3.2 -X helm.sh/helm/v4/internal/version.metadata=" \
    -o "$out/bin.tmp/helm" helm.sh/helm/v4/cmd/helm
)
(
  cd "$modules/umoci"
  go build -trimpath -ldflags "-s -w" -o "$out/bin.tmp/umoci" github.com/opencontainers/umoci/cmd/umoci
)
rm -rf "$out/bin"
mv "$out/bin.tmp" "$out/bin"
if [ -n "$build_cache" ]; then
  chmod -R u+w "$build_cache" 2>/dev/null || true
  rm -rf "$build_cache"
fi
ln -sfn "$key" "$cache/current"
echo "k8s-test-env: built in $(( $(date +%s) - started )) s; $(du -sh "$out/bin" | cut -f1) of binaries" >&2
"$out/bin/kube-apiserver" --version >&2
echo "$out/bin"
