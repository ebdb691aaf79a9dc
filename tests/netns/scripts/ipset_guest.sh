#!/bin/sh
# The ipset backend's dataplane tests, run inside a stock Debian 12 kernel booted with qemu (scripts/guest-kernel.sh),
# because the kernel of the CI machine has no hash:mac set type. Started by tests/netns/tests/debian_kernel.rs; runs chrooted
# in this machine's root (read-only, tmpfs on /tmp and /run), as root, in network namespaces it creates.
#
# Usage: ipset_guest.sh BIN_DIR
# Prints one line per check, `RESULT <name> PASS|FAIL [detail]`, then `DONE`. Real parts: the Debian kernel's
# x_tables and ipset, iptables-legacy, ipset, a real dnsmasq and a real DHCP relay (dnsmasq), busybox udhcpc, and
# ironguard-agent (hold and run) with ironguard-controlplane.
BIN=$1
set -u
export RUST_LOG=warn
. "$(dirname "$0")/guest_lib.sh"
load_modules x_tables ip_tables iptable_filter iptable_mangle xt_mark xt_comment xt_tcpudp xt_set ip_set ip_set_hash_mac \
  ip_set_bitmap_port veth bridge
HOLD_ARGS="--backend ipset --interface br0 --interface s0"
lease_members() { ip netns exec pxe ipset list ironguard-lease | sed -n '/^Members:/,$p' | grep -c timeout; }

M1=52:54:00:13:f0:01
M2=52:54:00:13:f0:02
UNKNOWN=52:54:00:13:f0:99
RELAY_MAC=52:54:00:13:f0:0f

# The PXE host: br0 10.95.0.1/24 with node n1, s0 10.95.2.1/24 towards a relay (10.95.2.2 | 10.95.1.1) with node
# far behind it; dnsmasq serves both networks.
for ns in pxe n1 relay far; do ip netns add $ns; ip -n $ns link set lo up; done
ip -n pxe link add br0 type bridge forward_delay 0
ip -n pxe addr add 10.95.0.1/24 dev br0
ip -n pxe link set br0 up
ip link add p1 netns pxe type veth peer name eth0 netns n1
ip -n pxe link set p1 master br0
ip -n pxe link set p1 up
ip link add s0 netns pxe type veth peer name r1 netns relay
ip link add r0 netns relay type veth peer name eth0 netns far
ip -n relay link set r1 address $RELAY_MAC
ip -n relay addr add 10.95.2.2/24 dev r1
ip -n relay addr add 10.95.1.1/24 dev r0
ip -n pxe addr add 10.95.2.1/24 dev s0
for l in "pxe s0" "relay r1" "relay r0"; do ip -n ${l% *} link set ${l#* } up; done
ip -n pxe route add 10.95.1.0/24 via 10.95.2.2
ip netns exec pxe dnsmasq --conf-file=/dev/null --port=0 --user=root --no-ping --dhcp-authoritative \
  --interface=br0 --interface=s0 --dhcp-range=10.95.0.100,10.95.0.200,255.255.255.0,1h \
  --dhcp-range=10.95.1.100,10.95.1.200,255.255.255.0,1h --dhcp-leasefile=/tmp/pxe.leases --pid-file=/tmp/pxe.pid
ip netns exec relay dnsmasq --conf-file=/dev/null --port=0 --user=root --interface=r0 --interface=r1 \
  --dhcp-relay=10.95.1.1,10.95.2.1 --pid-file=/tmp/relay.pid

check_eventually control-no-firewall 300 lease n1 $UNKNOWN
check_eventually control-relayed 300 lease far $UNKNOWN

# The guard alone: nothing marks, so every DISCOVER is dropped.
ip netns exec pxe "$BIN/ironguard-agent" guard install --backend ipset --interface br0 --interface s0 >/tmp/guard.log 2>&1 ||
  result guard-install FAIL "$(cat /tmp/guard.log)"
check guard-alone-drops no lease n1 $UNKNOWN
check guard-status yes ip netns exec pxe "$BIN/ironguard-agent" guard status --backend ipset --interface br0 --interface s0

# Leader, unknown MACs denied.
hold --mode leader --unknown-mac-policy deny --allow $M1 --deny $M2
check leader-allowed yes lease n1 $M1
check leader-denied no lease n1 $M2
check leader-unknown no lease n1 $UNKNOWN
lease_written() { test "$(lease_members)" -ge 1; }
check_eventually lease-element 300 lease_written
# Behind a relay the Ethernet source is the relay's: it decides for every node behind it.
check relayed-allowed-node-unknown-relay no lease far $M1
stop_hold
check sigterm-closes no lease n1 $M1
hold --mode leader --unknown-mac-policy deny --allow $RELAY_MAC
check relayed-denied-node-allowed-relay yes lease far $M2
stop_hold

# Leader, unknown MACs allowed; follower.
hold --mode leader --unknown-mac-policy allow --deny $M2
check policy-allow-unknown yes lease n1 $UNKNOWN
check policy-allow-denied no lease n1 $M2
stop_hold
hold --mode follower --unknown-mac-policy allow --allow $M1
check follower-serves-nobody no lease n1 $M1
check follower-unknown no lease n1 $UNKNOWN
stop_hold
hold --mode blocked --unknown-mac-policy allow --allow $M1
check blocked-serves-nobody no lease n1 $M1
stop_hold

# SIGKILL: nothing goes with the process (no owned tables); the lease element expires within its 2 s.
hold --mode leader --unknown-mac-policy allow --allow $M1
check before-kill yes lease n1 $M1
kill -KILL "$HOLD_PID"
wait "$HOLD_PID" 2>/dev/null
sleep 2.2
check sigkill-lease-expired yes test "$(lease_members)" -eq 0
check sigkill-closed no lease n1 $M1

# SIGSTOP: a frozen holder stops serving at its lease; thawed, it serves again.
hold --mode leader --unknown-mac-policy allow --allow $M1
kill -STOP "$HOLD_PID"
sleep 2.2
check sigstop-closed no lease n1 $M1
kill -CONT "$HOLD_PID"
check_eventually sigcont-serves 300 lease n1 $M1
stop_hold

# The agent with a control plane: deltas, and tampering repaired by its read-back.
start_controlplane
write_agent_toml 2 'interfaces = ["br0", "s0"]
backends = ["ipset"]'
sleep 1
ip netns exec pxe "$BIN/ironguard-agent" --config /tmp/agent.toml run >/tmp/agent.log 2>&1 &
AGENT=$!
leading() { ip netns exec pxe busybox wget -q -O - http://127.0.0.1:9181/metrics | grep -q '^ironguard_agent_mode 3'; }
check_eventually agent-leads 300 leading
leading || { echo "--- agent log (not leading)"; tail -40 /tmp/agent.log; echo "--- control plane log"; tail -20 /tmp/cp.log; }
ctl filters allow $M1 >/dev/null && ctl filters deny $M2 >/dev/null
check_eventually agent-allowed 300 lease n1 $M1
check agent-denied no lease n1 $M2
check agent-unknown no lease n1 $UNKNOWN
ip netns exec pxe iptables-legacy -w 60 -F ironguard-guard
ip netns exec pxe ipset flush ironguard-allow
# The read-back (every 2 s here) repairs both.
check_eventually tamper-guard-repaired 300 \
  ip netns exec pxe "$BIN/ironguard-agent" guard status --backend ipset --interface br0 --interface s0
check tamper-unknown-still-closed no lease n1 $UNKNOWN
check_eventually tamper-allow-set-repaired 300 lease n1 $M1
stop agent $AGENT
check agent-sigterm-closes no lease n1 $M1
stop controlplane $CP
echo "--- agent log (tail)"; tail -5 /tmp/agent.log
echo DONE
