#!/usr/bin/env bash
# ironguard's main job on the embedded default, as a real demo in network namespaces (run as root):
# a PXE host with dnsmasq behind ironguard, the control plane (embedded store) and the agent, three nodes with
# real DHCP clients; a node allowed with `ironguardctl filters allow` gets a lease; the chain dump; and what
# happens when the agent dies. Everything lives in namespaces named ig-demo-*, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

echo "== building ironguard (release)"
cargo build --release --locked --workspace --bins
BIN=$PWD/target/release
WORK=$(mktemp -d /tmp/ig-demo.XXXXXX)
PXE=ig-demo-pxe
NODES=(ig-demo-allowed ig-demo-denied ig-demo-unknown)
MACS=(52:54:00:00:aa:01 52:54:00:00:dd:02 52:54:00:00:cc:03)

cleanup() {
  for ns in "$PXE" "${NODES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
cleanup 2>/dev/null || true
WORK=$(mktemp -d /tmp/ig-demo.XXXXXX)

echo "== topology: PXE host $PXE (br0 10.77.0.1/24, dnsmasq) and nodes ${NODES[*]}"
ip netns add "$PXE"
ip -n "$PXE" link set lo up
ip -n "$PXE" link add br0 type bridge forward_delay 0
ip -n "$PXE" addr add 10.77.0.1/24 dev br0
ip -n "$PXE" link set br0 up
for i in "${!NODES[@]}"; do
  ns=${NODES[$i]}
  ip netns add "$ns"
  ip link add eth0 netns "$ns" address "${MACS[$i]}" type veth peer name "p$i" netns "$PXE"
  ip -n "$ns" link set eth0 up
  ip -n "$PXE" link set "p$i" master br0 up
done
ip netns exec "$PXE" dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 --user=root --interface=br0 \
  --dhcp-range=10.77.0.100,10.77.0.200,255.255.255.0,1h --no-ping --dhcp-authoritative \
  --dhcp-leasefile="$WORK/leases" --log-facility="$WORK/dnsmasq.log" --log-dhcp &
disown
for _ in $(seq 50); do ip netns exec "$PXE" ss -Hlun 'sport = :67' | grep -q . && break; sleep 0.1; done

cat >"$WORK/udhcpc.sh" <<'S'
#!/bin/sh
[ "$1" = bound ] && echo "lease $ip from server $serverid"
exit 0
S
chmod +x "$WORK/udhcpc.sh"
try_dhcp() { # node-namespace
  local out
  if out=$(ip netns exec "$1" busybox udhcpc -i eth0 -f -q -n -t 3 -T 1 -s "$WORK/udhcpc.sh" 2>/dev/null); then
    printf '  %-18s %s -> %s\n' "$1" "$(ip netns exec "$1" cat /sys/class/net/eth0/address)" "$(echo "$out" | grep lease)"
  else
    printf '  %-18s %s -> NO LEASE\n' "$1" "$(ip netns exec "$1" cat /sys/class/net/eth0/address)"
  fi
}
all_nodes() {
  local pids=()
  for ns in "${NODES[@]}"; do try_dhcp "$ns" >"$WORK/out-$ns" & pids+=($!); done
  wait "${pids[@]}"
  for ns in "${NODES[@]}"; do cat "$WORK/out-$ns"; done
}

echo
echo "== 1. the guard alone (installed before dnsmasq on a real host): DHCP is closed for everyone"
ip netns exec "$PXE" "$BIN/ironguard-agent" guard install --interface br0
all_nodes
"$BIN/ironguardctl" chains --netns "$PXE" | tail -n 1

echo
echo "== 2. control plane (embedded store, unknown MACs denied) and agent on the PXE host"
ip netns exec "$PXE" "$BIN/ironguard-controlplane" --grpc-listen 127.0.0.1:9100 --admin-listen 127.0.0.1:9101 \
  --data-dir "$WORK/controlplane" --unknown-mac-policy deny >"$WORK/controlplane.log" 2>&1 &
disown
cat >"$WORK/agent.toml" <<T
[agent]
id = "demo-pxe-host"
network = "demo"
[controlplane]
endpoints = ["http://127.0.0.1:9100"]
[admin]
listen = "127.0.0.1:9181"
[dataplane]
interfaces = ["br0"]
T
ip netns exec "$PXE" "$BIN/ironguard-agent" --config "$WORK/agent.toml" run >"$WORK/agent.log" 2>&1 &
AGENT=$!
CTL=(ip netns exec "$PXE" "$BIN/ironguardctl" --controlplane http://127.0.0.1:9100)
for _ in $(seq 100); do "$BIN/ironguardctl" chains --netns "$PXE" | grep -q "verdict: LEADER" && break; sleep 0.1; done
"$BIN/ironguardctl" chains --netns "$PXE" | tail -n 1
echo "-- no MAC allowed yet:"
all_nodes

echo
echo "== 3. ironguardctl filters allow ${MACS[0]}; ironguardctl filters deny ${MACS[1]}"
"${CTL[@]}" filters allow "${MACS[0]}"
"${CTL[@]}" filters deny "${MACS[1]}"
sleep 0.2
all_nodes
echo
"${CTL[@]}" filters show
echo
"${CTL[@]}" agents
echo
"$BIN/ironguardctl" chains --netns "$PXE"
echo
echo "-- the agent's own metrics (excerpt):"
ip netns exec "$PXE" curl -s http://127.0.0.1:9181/metrics | grep -E "^ironguard_agent_(mode|applied_revision|kernel_transactions_total|set_elements)" || true

echo
echo "== 4. the agent is killed with SIGKILL: the kernel deletes its table, the guard keeps DHCP closed"
kill -9 "$AGENT"; wait "$AGENT" 2>/dev/null || true
all_nodes
"$BIN/ironguardctl" chains --netns "$PXE" | tail -n 1
echo
echo "demo finished; namespaces removed."
