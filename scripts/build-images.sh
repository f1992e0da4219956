#!/usr/bin/env bash
# Builds the three container images without a container daemon, as OCI
# image layout archives:
#
#   <out>/ztunnel.oci.tar         ztunnel (entrypoint), from scratch
#   <out>/ztunnel-agent.oci.tar   ztunnel-agent (entrypoint) and ztunnel-cni,
#                                 with iptables, ipset and iproute2 and the
#                                 libraries they load, from Debian's packages
#   <out>/ztunnel-ca.oci.tar      ztunnel-ca (entrypoint), from scratch
#
# With --test-images, also the two images the test cluster runs:
#
#   <out>/ztunnel-test-pause.oci.tar  pause (entrypoint), from scratch: the
#                                     CRI sandbox image (test-support/pause)
#   <out>/ztunnel-test-app.oci.tar    ztunnel-loadgen (entrypoint), from
#                                     scratch with an /etc/nsswitch.conf: the
#                                     echo server and load generator of pods;
#                                     and ztunnel-test-waypoint, the waypoint
#                                     of a waypoint pod (test-support)
#
# With --istio-images, also Istio's own components, named as Istio's charts
# name them and tagged with Istio's version (1.31-dev), from the binaries
# of scripts/k8s-test-env.sh --istio (built there on first use):
#
#   <out>/pilot.oci.tar        pilot-discovery (istiod; entrypoint), run as
#                              1337:1337 as Istio's image runs it, from scratch
#   <out>/install-cni.oci.tar  install-cni (the istio-cni node agent; command)
#                              and the istio-cni plugin in /opt/cni/bin, with
#                              the node agent's tools (it runs iptables,
#                              ipset and ip in pods' namespaces as ours does)
#
# Each archive holds one image tagged <tag> (org.opencontainers.image.ref.name).
# The binaries are static (glibc, -C target-feature=+crt-static), so the
# ztunnel and control plane images hold nothing else; the node agent's image
# carries the tools it runs in pods' network namespaces. umoci (built by
# scripts/k8s-test-env.sh from a pinned Go module) assembles the layouts.
#
#   scripts/build-images.sh [--out DIR] [--tag TAG] [--test-images] [--istio-images]
#
# Defaults: --out target/images, --tag the workspace version. Needs apt-get
# and dpkg (a Debian or Ubuntu host) for the agent's tools; they are taken
# from the host's package sources, at the versions apt would install.
# scripts/check-images.sh unpacks the archives and runs every binary.
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/images
tag="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
test_images=0
istio_images=0
# The version Istio's group of scripts/k8s-test-env.sh stamps its binaries with.
istio_tag=1.31-dev
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --test-images) test_images=1; shift ;;
    --istio-images) istio_images=1; shift ;;
    *) echo "build-images: unknown argument $1" >&2; exit 2 ;;
  esac
done

started=$(date +%s)
umoci="$(scripts/k8s-test-env.sh)/umoci"
target="$(rustc -vV | sed -n 's/^host: //p')"
case "$target" in
  x86_64-*) arch=amd64 ;;
  aarch64-*) arch=arm64 ;;
  *) echo "build-images: no image architecture for $target" >&2; exit 1 ;;
esac

# 1. Static binaries. --target keeps crt-static off build scripts and proc
#    macros, which must stay dynamic. The test images' binaries are a second
#    invocation: built together, cargo would unify the features of shared
#    dependencies and the product's binaries would differ with the flag.
images=(ztunnel ztunnel-ca ztunnel-agent)
static=(ztunnel ztunnel-agent ztunnel-cni ztunnel-ca)
echo "build-images: building static binaries for $target" >&2
RUSTFLAGS="-C target-feature=+crt-static" cargo build --locked --profile image \
  --target "$target" \
  -p ztunnel-proxy --bin ztunnel \
  -p ztunnel-cni --bin ztunnel-agent --bin ztunnel-cni \
  -p ztunnel-control-plane --bin ztunnel-ca
if [ "$test_images" = 1 ]; then
  images+=(ztunnel-test-pause ztunnel-test-app)
  static+=(pause ztunnel-loadgen ztunnel-test-waypoint)
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --locked --profile image \
    --target "$target" \
    -p ztunnel-test-pause --bin pause \
    -p ztunnel-benches --bin ztunnel-loadgen \
    -p ztunnel-test-support --bin ztunnel-test-waypoint
fi
bins="${CARGO_TARGET_DIR:-target}/$target/image"
for bin in "${static[@]}"; do
  if ldd "$bins/$bin" >/dev/null 2>&1 && ! ldd "$bins/$bin" 2>&1 | grep -q "statically linked"; then
    echo "build-images: $bins/$bin is not static:" >&2
    ldd "$bins/$bin" >&2
    exit 1
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# 2. The node agent's tools, unpacked from Debian's packages.
tools_root="$work/agent-tools"
scripts/agent-tools-root.sh "$tools_root"

# 3. The images.
# build NAME ENTRYPOINT [SOURCE=DESTINATION...], tagged $tag, with the
# working directory $workdir and $PATH $path; extra umoci config flags in
# the array `config`.
workdir=/
path=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin
config=()
build() {
  local name="$1" entrypoint="$2"
  shift 2
  local layout="$work/$name"
  "$umoci" init --layout "$layout"
  "$umoci" new --image "$layout:$tag"
  "$umoci" config --image "$layout:$tag" --os linux --architecture "$arch" \
    --config.entrypoint "$entrypoint" --config.workingdir "$workdir" \
    --config.env "PATH=$path" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$tag" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0" \
    ${config[@]+"${config[@]}"}
  # Each further argument is SOURCE=DESTINATION: one layer.
  local pair
  for pair in "$@"; do
    "$umoci" insert --image "$layout:$tag" "${pair%%=*}" "${pair#*=}"
  done
  "$umoci" gc --layout "$layout"
  tar -C "$layout" -cf "$out/$name.oci.tar.tmp" .
  mv "$out/$name.oci.tar.tmp" "$out/$name.oci.tar"
}
stage() {
  local dir="$work/stage-$1"
  shift
  mkdir -p "$dir/usr/local/bin"
  install -m 0755 "$@" "$dir/usr/local/bin/"
  echo "$dir"
}
build ztunnel /usr/local/bin/ztunnel "$(stage ztunnel "$bins/ztunnel")=/"
build ztunnel-ca /usr/local/bin/ztunnel-ca "$(stage ca "$bins/ztunnel-ca")=/"
agent_stage="$(stage agent "$bins/ztunnel-agent" "$bins/ztunnel-cni")"
# istio-cni's chart runs `install-cni`: the agent takes that chart's
# defaults when started under that name.
ln -s ztunnel-agent "$agent_stage/usr/local/bin/install-cni"
build ztunnel-agent /usr/local/bin/ztunnel-agent "$tools_root=/" "$agent_stage=/"
if [ "$test_images" = 1 ]; then
  build ztunnel-test-pause /usr/local/bin/pause "$(stage pause "$bins/pause")=/"
  app_stage="$(stage app "$bins/ztunnel-loadgen" "$bins/ztunnel-test-waypoint")"
  # The static glibc resolver reads this: the kubelet's /etc/hosts first,
  # then the cluster DNS of its /etc/resolv.conf, as in a Debian image
  # (without it glibc would ask DNS first).
  mkdir -p "$app_stage/etc"
  printf 'hosts: files dns\n' >"$app_stage/etc/nsswitch.conf"
  build ztunnel-test-app /usr/local/bin/ztunnel-loadgen "$app_stage=/"
fi

if [ "$istio_images" = 1 ]; then
  istio_bin="$(scripts/k8s-test-env.sh --istio)"
  our_tag="$tag"
  tag="$istio_tag"
  config=(--config.user 1337:1337)
  build pilot /usr/local/bin/pilot-discovery "$(stage pilot "$istio_bin/pilot-discovery")=/"
  # install-cni copies the plugin from its working directory, /opt/cni/bin,
  # to the host's CNI directory.
  cni_stage="$(stage install-cni "$istio_bin/install-cni")"
  mkdir -p "$cni_stage/opt/cni/bin"
  install -m 0755 "$istio_bin/istio-cni" "$cni_stage/opt/cni/bin/"
  config=()
  workdir=/opt/cni/bin
  path+=:/opt/cni/bin
  build install-cni /usr/local/bin/install-cni "$tools_root=/" "$cni_stage=/"
  tag="$our_tag"
fi

echo "build-images: built in $(( $(date +%s) - started )) s" >&2
for name in "${images[@]}"; do
  printf 'build-images: %s:%s %s\n' "$name" "$tag" "$(du -h "$out/$name.oci.tar" | cut -f1)" >&2
done
if [ "$istio_images" = 1 ]; then
  for name in pilot install-cni; do
    printf 'build-images: %s:%s %s\n' "$name" "$istio_tag" "$(du -h "$out/$name.oci.tar" | cut -f1)" >&2
  done
fi
echo "$out"
