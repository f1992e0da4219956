#!/usr/bin/env bash
# Builds istio/ztunnel's release binary from its public repository, at the
# pinned commit below, for the benchmark harness to run beside ours
# (`ztunnel-bench --ztunnel <it> --compare target/release/ztunnel`). A
# benchmarking tool only: nothing in CI or in the product uses it.
#
#   scripts/build-istio-ztunnel.sh [--source URL|DIR] [--provider URL|DIR] [--out DIR]
#
# --source    where istio/ztunnel is cloned from (default its GitHub repository;
#             a local clone or mirror works the same way)
# --provider  where its one git dependency, janrueth/boring-rustls-provider, is
#             fetched from (default its GitHub repository). Cargo fetches it
#             even though only the FIPS build uses it; a local clone is served
#             through git's url.<dir>.insteadOf for this build alone
#             (GIT_CONFIG_* in the environment, not the user's git config).
# --out       the working directory: the checkout, its target/, and the binary
#             at <out>/target/release/ztunnel (default target/istio-ztunnel)
#
# It builds what istio/ztunnel's own `cargo build --release` builds: its
# default features (aws-lc-rs, jemalloc), its release profile (LTO, one
# codegen unit), from its Cargo.lock (--locked). protoc is needed by its
# build script; it is installed with apt-get when missing and we are root.
set -euo pipefail

# istio/ztunnel master of 2026-08-20, the version the facts sheets were read from.
COMMIT=62d826530e5ce85764e309170205b293efcbc80b
PROVIDER_URL=https://github.com/janrueth/boring-rustls-provider

source_repo=https://github.com/istio/ztunnel
provider=$PROVIDER_URL
out=target/istio-ztunnel
while [ $# -gt 0 ]; do
  case "$1" in
    --source) source_repo=$2; shift 2 ;;
    --provider) provider=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

if ! command -v protoc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler >&2
  else
    echo "istio/ztunnel's build needs protoc (apt-get install protobuf-compiler)" >&2
    exit 1
  fi
fi

# A local directory is given to git as a file:// URL.
as_url() {
  if [ -d "$1" ]; then
    echo "file://$(cd "$1" && pwd)"
  else
    echo "$1"
  fi
}

mkdir -p "$out"
checkout="$out/src"
# vendor/boringssl-fips holds prebuilt FIPS libraries (large, and absent from
# some mirrors); only the FIPS build reads them, so they are never fetched.
if [ -d "$source_repo" ]; then
  # A local clone or mirror: the commit's tree without them.
  rm -rf "$checkout"
  mkdir -p "$checkout"
  git -C "$source_repo" archive --format=tar "$COMMIT" -- . ':(exclude)vendor/boringssl-fips' |
    tar -x -C "$checkout"
  # No repository of its own: its build script's git must not find the
  # one this script runs in and report that commit as istio/ztunnel's.
  GIT_CEILING_DIRECTORIES="$(cd "$out" && pwd)"
  export GIT_CEILING_DIRECTORIES
else
  # A remote: a partial clone, whose blobs come only as the checkout needs them.
  if [ ! -d "$checkout/.git" ]; then
    rm -rf "$checkout"
    git clone -q --filter=blob:none --no-checkout "$source_repo" "$checkout"
  fi
  git -C "$checkout" sparse-checkout set --no-cone '/*' '!/vendor/boringssl-fips/'
  git -C "$checkout" checkout -q --force "$COMMIT"
fi

export GIT_CONFIG_COUNT=1
export GIT_CONFIG_KEY_0="url.$(as_url "$provider").insteadOf"
export GIT_CONFIG_VALUE_0=$PROVIDER_URL
export CARGO_NET_GIT_FETCH_WITH_CLI=true
# The version its binary reports (`ztunnel version`).
export VERSION=$COMMIT
(cd "$checkout" && CARGO_TARGET_DIR="$(cd .. && pwd)/target" cargo build --release --locked --bin ztunnel)
binary="$(cd "$out" && pwd)/target/release/ztunnel"
echo "istio/ztunnel $COMMIT: $binary"
