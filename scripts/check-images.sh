#!/usr/bin/env bash
# Checks the images scripts/build-images.sh wrote, not their recipe: each
# OCI archive is unpacked with umoci into a root filesystem, its configured
# entrypoint is compared with the expected binary, and every binary runs
# from that root (chroot, an empty environment, a network namespace of its
# own) the way a container runtime would start it:
#   - ztunnel --help, then ztunnel as Istio's chart starts it (args
#     `proxy ztunnel`) with no CA root certificate: it must stop with its
#     clear error naming the missing file;
#   - ztunnel-ca --help and --version;
#   - ztunnel-agent --help, and ztunnel-cni answering CNI's VERSION command;
#   - the agent's tools: iptables (nf_tables) adding a chain and a rule and
#     iptables-save printing them back, ip6tables-restore, ipset creating a
#     set, and `ip -j addr show` (the agent's own use of each);
#   - when the test cluster's images are there (build-images.sh
#     --test-images): pause, as PID 1 of a PID namespace, exiting 0 on
#     SIGTERM; ztunnel-loadgen's server and a soak run against it through a
#     name in /etc/hosts (the image's static resolver), with no failure;
#     ztunnel-test-waypoint --help.
# Needs root (chroot, unshare). Prints each image's size.
#
#   scripts/check-images.sh [DIR]      default target/images
set -euo pipefail
cd "$(dirname "$0")/.."

dir="${1:-target/images}"
tag="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
umoci="$(scripts/k8s-test-env.sh)/umoci"
if [ "$(id -u)" != 0 ]; then
  echo "check-images: needs root (chroot and network namespaces)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0
fail() {
  echo "check-images: FAIL: $*" >&2
  failed=1
}

# unpack NAME: the image's root filesystem in $work/NAME/rootfs.
unpack() {
  local name="$1" archive="$dir/$1.oci.tar"
  if [ ! -f "$archive" ]; then
    echo "check-images: $archive is missing (scripts/build-images.sh builds it)" >&2
    exit 1
  fi
  mkdir -p "$work/$name-layout"
  tar -xf "$archive" -C "$work/$name-layout"
  "$umoci" unpack --image "$work/$name-layout:$tag" "$work/$name" >/dev/null
  printf 'check-images: %s:%s archive %s, unpacked %s\n' "$name" "$tag" \
    "$(du -h "$archive" | cut -f1)" "$(du -sh "$work/$name/rootfs" | cut -f1)"
}

# entrypoint NAME PATH: the image starts PATH.
entrypoint() {
  local args
  args="$(tr -d ' \t\n' <"$work/$1/config.json" | grep -o '"args":\[[^]]*\]' || true)"
  case "$args" in
    "\"args\":[\"$2\""*) ;;
    *) fail "$1's entrypoint is $args, not $2" ;;
  esac
}

# run NAME SCRIPT: a host shell runs SCRIPT with only the image's PATH and
# ROOT, in a network namespace with just loopback; in SCRIPT, `img CMD...`
# runs CMD from the image's root (the images have no shell of their own).
# Both output streams on stdout.
run() {
  env -i PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin ROOT="$work/$1/rootfs" \
    unshare --net -- sh -c 'ip link set lo up 2>/dev/null || exit 1
      img() { chroot "$ROOT" "$@"; }
      eval "$0"' "$2" 2>&1
}

# expect NAME WHAT PATTERN SCRIPT: SCRIPT succeeds and prints PATTERN.
expect() {
  local name="$1" what="$2" pattern="$3" script="$4" output
  if ! output="$(run "$name" "$script")"; then
    fail "$name: $what: $script failed: $output"
  elif ! grep -qE -e "$pattern" <<<"$output"; then
    fail "$name: $what: $script printed no /$pattern/: $output"
  else
    echo "check-images: ok: $name: $what"
  fi
}

unpack ztunnel
entrypoint ztunnel /usr/local/bin/ztunnel
expect ztunnel "help" "Usage" 'img /usr/local/bin/ztunnel --help'
# As Istio's chart starts it (args and environment), with nothing mounted:
# the missing root certificate must stop it with an error naming the file.
output="$(run ztunnel 'cd "$ROOT" && exec timeout 20 env CA_ADDRESS=https://127.0.0.1:15012 \
  XDS_ADDRESS=https://127.0.0.1:15012 POD_NAME=ztunnel-check POD_NAMESPACE=istio-system \
  NODE_NAME=node-check INSTANCE_IP=127.0.0.1 SERVICE_ACCOUNT=ztunnel \
  chroot . /usr/local/bin/ztunnel proxy ztunnel')" && status=0 || status=$?
if [ "$status" = 0 ] || [ "$status" = 124 ]; then
  fail "ztunnel without a CA root certificate did not stop with an error (exit $status): $output"
elif ! grep -q "root-cert.pem" <<<"$output"; then
  fail "ztunnel's error does not name the missing root certificate: $output"
else
  echo "check-images: ok: ztunnel stops without its CA root: $(grep -m1 "root-cert.pem" <<<"$output")"
fi

unpack ztunnel-ca
entrypoint ztunnel-ca /usr/local/bin/ztunnel-ca
expect ztunnel-ca "help" "serve" 'img /usr/local/bin/ztunnel-ca --help'
expect ztunnel-ca "version" "$tag" 'img /usr/local/bin/ztunnel-ca --version'

unpack ztunnel-agent
entrypoint ztunnel-agent /usr/local/bin/ztunnel-agent
expect ztunnel-agent "help" "install-cni" 'img /usr/local/bin/ztunnel-agent --help'
expect ztunnel-agent "install-cni (istio-cni's command) is the agent" "^ztunnel-agent " \
  'img install-cni --version'
expect ztunnel-agent "the CNI plugin answers VERSION" '"supportedVersions"' \
  'CNI_COMMAND=VERSION img /usr/local/bin/ztunnel-cni </dev/null'
expect ztunnel-agent "iptables is nf_tables" "nf_tables" 'img iptables --version'
expect ztunnel-agent "iptables adds a rule and saves it" "-A ZTUNNEL_CHECK -p tcp -j RETURN" \
  'img iptables -t nat -N ZTUNNEL_CHECK && img iptables -t nat -A ZTUNNEL_CHECK -p tcp -j RETURN && img iptables-save -t nat'
expect ztunnel-agent "ip6tables-restore loads a table" "ZTUNNEL_CHECK" \
  'printf "*nat\n:ZTUNNEL_CHECK - [0:0]\nCOMMIT\n" | img ip6tables-restore && img ip6tables-save -t nat'
expect ztunnel-agent "ipset creates a set" "Name: ztunnel-check" \
  'img ipset create ztunnel-check hash:ip && img ipset list ztunnel-check'
expect ztunnel-agent "ip -j addr show" '"ifname":"lo"' 'img ip -j addr show'

if [ -f "$dir/ztunnel-test-pause.oci.tar" ]; then
  unpack ztunnel-test-pause
  entrypoint ztunnel-test-pause /usr/local/bin/pause
  expect ztunnel-test-pause "version" "^pause $tag" 'img /usr/local/bin/pause -v'
  # As a pod's sandbox runs it: PID 1 of its PID namespace, where a signal
  # without a handler of its own would be dropped. Ready once asleep in
  # sigwait.
  expect ztunnel-test-pause "as PID 1, SIGTERM ends it with status 0" "^status 0$" '
    unshare --pid --fork --kill-child chroot "$ROOT" /usr/local/bin/pause & outer=$!
    for _ in $(seq 100); do
      pid="$(cat /proc/$outer/task/$outer/children 2>/dev/null)"
      [ -n "$pid" ] && grep -q sigtimedwait "/proc/$pid/wchan" 2>/dev/null && break
      sleep 0.1
    done
    kill -TERM $pid; wait $outer; echo "status $?"'
fi

if [ -f "$dir/ztunnel-test-app.oci.tar" ]; then
  unpack ztunnel-test-app
  entrypoint ztunnel-test-app /usr/local/bin/ztunnel-loadgen
  expect ztunnel-test-app "help" "soak" 'img /usr/local/bin/ztunnel-loadgen --help'
  expect ztunnel-test-app "the waypoint's help" "--route" \
    'img /usr/local/bin/ztunnel-test-waypoint --help'
  # The kubelet mounts a pod's /etc/hosts; a name in it must resolve through
  # the image's static glibc and its nsswitch.conf.
  printf '127.0.0.1 localhost\n127.0.0.1 echo.check.svc.cluster.local\n' \
    >"$work/ztunnel-test-app/rootfs/etc/hosts"
  expect ztunnel-test-app "soak by name against serve: answers, no failure" \
    '^\{"mode":"soak",.*"new":\{"ok":[1-9][0-9]*,"failed":\{("[a-z]+":0,?)+\}\},"long_lived":\{"wanted":2,"open":2,"exchanges":[1-9]' '
    chroot "$ROOT" /usr/local/bin/ztunnel-loadgen serve --listen 127.0.0.1:9000 \
      >"$ROOT/../serve.out" 2>&1 & server=$!
    for _ in $(seq 100); do
      grep -q listening "$ROOT/../serve.out" && break
      sleep 0.1
    done
    img /usr/local/bin/ztunnel-loadgen soak --target echo.check.svc.cluster.local:9000 \
      --duration 1.5 --connections 2 --rate 10 | tail -n 1
    kill $server'
fi

if [ "$failed" != 0 ]; then
  echo "check-images: some checks failed" >&2
  exit 1
fi
echo "check-images: all images passed"
