#!/usr/bin/env bash
# Two ztunnels and the CA by hand, on one machine (root): nodes a and b are
# network namespaces joined by a veth pair (198.18.0.1 and 198.18.0.2). The
# CA runs in node a; each node runs a dedicated ztunnel for its workload;
# node a's outbound TCP is redirected to 15001 except the proxy's own
# (marked) sockets. With `--iperf`, measures one stream through the tunnel
# with iperf3 and prints the proxies' CPU seconds per GB; otherwise waits
# for Ctrl-C. Everything is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}; seconds=${2:-10}
[ "$(id -u)" = 0 ] || { echo "two-nodes: needs root (network namespaces, iptables)"; exit 1; }
cargo build --release -q -p ztunnel-control-plane -p ztunnel-proxy
bin=$(pwd)/target/release
run=$(mktemp -d)
a="zt-demo-a-$$"; b="zt-demo-b-$$"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "$run"
}
trap cleanup EXIT

ip netns add "$a"; ip netns add "$b"
ip link add "va$$" netns "$a" type veth peer name "vb$$" netns "$b"
ip -n "$a" addr add 198.18.0.1/24 dev "va$$"; ip -n "$b" addr add 198.18.0.2/24 dev "vb$$"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "va$$" up; ip -n "$b" link set "vb$$" up
ip -n "$a" route add 198.19.0.0/16 dev "va$$"
ip netns exec "$a" iptables -t nat -A OUTPUT -p tcp ! -o lo -m mark ! --mark 1337 \
  -j REDIRECT --to-ports 15001

cat >"$run/pods.yaml" <<PODS
- {name: client-0, namespace: default, uid: uid-client-0, serviceAccount: client, nodeName: node-a, phase: Running}
- {name: server-0, namespace: default, uid: uid-server-0, serviceAccount: server, nodeName: node-b, phase: Running}
PODS
"$bin/ztunnel-ca" token --state-dir "$run/ca" --namespace default --service-account client \
  --pod client-0 --pod-uid uid-client-0 --node node-a >"$run/client.token"
"$bin/ztunnel-ca" token --state-dir "$run/ca" --namespace default --service-account server \
  --pod server-0 --pod-uid uid-server-0 --node node-b >"$run/server.token"
ip netns exec "$a" "$bin/ztunnel-ca" serve --state-dir "$run/ca" --pods "$run/pods.yaml" \
  --listen 198.18.0.1:15012 --serving-ip 198.18.0.1 --metrics-listen 127.0.0.1:15014 \
  >"$run/ca.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -f "$run/ca/root-cert.pem" ] && break; sleep 0.1; done

start_ztunnel() { # namespace workload
  ip netns exec "$1" env -i PROXY_MODE=dedicated PROXY_WORKLOAD_INFO="default/$2/${2%-0}" \
    LOCAL_XDS_PATH="$(pwd)/demo/two-nodes.yaml" CA_ADDRESS=https://198.18.0.1:15012 \
    CA_ROOT_CA="$run/ca/root-cert.pem" AUTH_TOKEN="$run/${2%-0}.token" PACKET_MARK=1337 \
    ZTUNNEL_WORKER_THREADS=1 RUST_LOG=info "$bin/ztunnel" >"$run/$2.log" 2>&1 &
  pids+=($!)
}
start_ztunnel "$a" client-0; ztunnel_a=${pids[-1]}
start_ztunnel "$b" server-0; ztunnel_b=${pids[-1]}
for ip_ns in "198.18.0.1 $a" "198.18.0.2 $b"; do
  ip=${ip_ns% *}; ns=${ip_ns#* }
  for _ in $(seq 100); do
    ip netns exec "$ns" bash -c "exec 3<>/dev/tcp/$ip/15021 && printf 'GET /healthz/ready HTTP/1.0\r\n\r\n' >&3 && grep -q ' 200 ' <&3" 2>/dev/null && break
    sleep 0.1
  done
done
echo "two-nodes: ready. Node a: ip netns exec $a <cmd>; node b: ip netns exec $b <cmd>"
echo "two-nodes: logs in $run"

cpu_seconds() { # pid -> utime+stime in seconds
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}

if [ "$mode" = "--iperf" ]; then
  ip netns exec "$b" iperf3 -s -B 198.18.0.2 -1 >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.5
  before_a=$(cpu_seconds "$ztunnel_a"); before_b=$(cpu_seconds "$ztunnel_b")
  ip netns exec "$a" iperf3 -c 198.18.0.2 -t "$seconds" -J >"$run/iperf.json"
  after_a=$(cpu_seconds "$ztunnel_a"); after_b=$(cpu_seconds "$ztunnel_b")
  python3 - "$run/iperf.json" "$before_a" "$after_a" "$before_b" "$after_b" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
received = result["end"]["sum_received"]
gbytes = received["bytes"] / 1e9
cpu_a = float(sys.argv[3]) - float(sys.argv[2])
cpu_b = float(sys.argv[5]) - float(sys.argv[4])
print(f"one stream: {received['bits_per_second'] / 1e9:.2f} Gbit/s, {gbytes:.2f} GB moved")
print(f"client ztunnel: {cpu_a:.2f} CPU s ({cpu_a / gbytes:.2f} s/GB); "
      f"server ztunnel: {cpu_b:.2f} CPU s ({cpu_b / gbytes:.2f} s/GB)")
PY
  grep -h "connection complete" "$run/server-0.log" | tail -1
else
  echo "two-nodes: try: ip netns exec $b iperf3 -s -B 198.18.0.2 & ip netns exec $a iperf3 -c 198.18.0.2"
  echo "two-nodes: Ctrl-C to stop"
  wait "$ztunnel_a"
fi
