#!/bin/sh
# The observation sets of the agent's table (seen_requests, seen_passed, seen_answers: dynamic sets with a
# per-element counter, filled by `update` rules without a verdict) in a stock Debian 12 kernel (6.1) booted with qemu
# (scripts/guest-kernel.sh): this machine's kernel is newer, and the kernel must accept the set expression and the
# dynset the agent writes. Started by tests/netns/tests/debian_kernel.rs; runs chrooted in this machine's root
# (read-only, tmpfs on /tmp and /run), as root, in network namespaces it creates.
#
# Usage: seen_guest.sh BIN_DIR
# Prints one line per check, `RESULT <name> PASS|FAIL [detail]`, then `DONE`. Real parts: the Debian kernel's
# nf_tables, a real dnsmasq, busybox udhcpc, and ironguard-agent hold.
BIN=$1
set -u
export RUST_LOG=warn
. "$(dirname "$0")/guest_lib.sh"
load_modules nf_tables veth bridge
HOLD_ARGS="--interface br0"
echo "guest: kernel $(uname -r)"

M1=52:54:00:13:e0:01
M2=52:54:00:13:e0:02
UNKNOWN=52:54:00:13:e0:99

for ns in pxe n1; do ip netns add $ns; ip -n $ns link set lo up; done
ip link add p1 netns pxe type veth peer name eth0 netns n1
ip -n pxe link add br0 type bridge forward_delay 0
ip -n pxe addr add 10.97.0.1/24 dev br0
ip -n pxe link set p1 master br0
ip -n pxe link set p1 up
ip -n pxe link set br0 up
ip netns exec pxe dnsmasq --conf-file=/dev/null --port=0 --user=root --no-ping --dhcp-authoritative \
  --interface=br0 --dhcp-range=10.97.0.100,10.97.0.200,255.255.255.0,1h --dhcp-leasefile=/tmp/pxe.leases \
  --pid-file=/tmp/pxe.pid
check_eventually control-no-firewall 300 lease n1 $UNKNOWN

# seen SET MAC: the set holds MAC with a counter above zero.
seen() {
  hex=$(echo "$2" | tr -d :)
  ip netns exec pxe nft list set inet ironguard "$1" | grep -q "0x$hex counter packets [1-9]"
}

# Leader, unknown MACs denied: the table (with its observation sets and chains) must load in this kernel.
hold --mode leader --unknown-mac-policy deny --allow $M1 --deny $M2
check table-loaded yes ip netns exec pxe nft list set inet ironguard seen_requests
check_eventually leader-allowed 300 lease n1 $M1
check leader-denied no lease n1 $M2
check allowed-requests yes seen seen_requests $M1
check allowed-passed yes seen seen_passed $M1
check allowed-answers yes seen seen_answers $M1
check denied-requests yes seen seen_requests $M2
check denied-not-passed no seen seen_passed $M2
check denied-not-answered no seen seen_answers $M2
stop_hold
echo "--- hold log (tail)"; tail -5 /tmp/hold.log
echo DONE
