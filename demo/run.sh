#!/usr/bin/env bash
# The local demo: builds the workspace and runs the CA on 127.0.0.1:15012 with
# a root generated under target/demo/ca and the example pod registry
# demo/pods.yaml. It mints a pod-bound token for each node's ztunnel into
# target/demo/ and then serves in the foreground until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ztunnel-certs --bin ztunnel-ca
ca=target/release/ztunnel-ca
state=target/demo/ca
mkdir -p target/demo

for node in a b; do
  "$ca" token --state-dir "$state" --namespace istio-system --service-account ztunnel \
    --pod "ztunnel-node-$node" --pod-uid "uid-ztunnel-$node" --node "node-$node" \
    >"target/demo/ztunnel-node-$node.token"
done

echo "demo: tokens for the node-a and node-b ztunnels are in target/demo/*.token"
echo "demo: the root certificate (CA_ROOT_CA) is in $state/"
echo "demo: metrics: curl -s http://127.0.0.1:15014/metrics"
exec "$ca" serve --state-dir "$state" --pods demo/pods.yaml
