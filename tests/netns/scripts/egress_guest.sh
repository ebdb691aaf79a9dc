#!/bin/sh
# The reply-side (netdev egress) dataplane in a stock Debian 12 kernel (6.1) booted with qemu
# (scripts/guest-kernel.sh): kernels before 6.16 bind a netdev chain to a device, not to its name, and unbind it for
# good when the device goes away. Started by tests/netns/tests/debian_kernel.rs; runs chrooted in this machine's root
# (read-only, tmpfs on /tmp and /run), as root, in network namespaces it creates.
#
# Usage: egress_guest.sh BIN_DIR
# Prints one line per check, `RESULT <name> PASS|FAIL [detail]`, then `DONE`. Real parts: the Debian kernel's
# nf_tables, ISC dhcpd on AF_PACKET sockets, busybox udhcpc, and ironguard-agent (hold, guard and run) with
# ironguard-controlplane.
BIN=$1
set -u
export RUST_LOG=warn
. "$(dirname "$0")/guest_lib.sh"
load_modules nf_tables veth bridge
EGRESS="--hook none --egress-interface br0 --egress-interface s0"
HOLD_ARGS=$EGRESS
chains() { "$BIN/ironguardctl" chains --json --netns pxe; }
# verdict: the verdict of `ironguardctl chains` (read without jq: one process less).
verdict() {
  v=$(chains)
  v=${v#*\"verdict\": \"}
  echo "${v%%\"*}"
}
# bound TABLE: the table's egress chain is bound to br0 and s0 (as the kernel reports it).
bound() { chains | jq -e --arg t "$1" '[.[$t].chains[]? | select(.devices == ["br0", "s0"])] | length == 1' >/dev/null; }
bound_both() {
  chains | jq -e '[.egress_guard.chains[]?, .egress_owned.chains[]? | select(.devices == ["br0", "s0"])] | length == 2' \
    >/dev/null
}
lease_live() { chains | jq -e '.lease_expires_in_ms > 0' >/dev/null; }
# A leader serving: its tables and a live kernel lease. Under the emulated CPU a lease write often reaches the kernel
# late and is dropped until the next refresh (FENCED for a moment), so a leader is checked with check_eventually.
is_leader() { test "$(verdict)" = LEADER; }
fenced() { case $(verdict) in FENCED*) return 0 ;; *) return 1 ;; esac; }
# repaired CHECK FN WHAT: waits for FN to succeed (up to 300 s, a deadline for something stuck: the agent's read-back
# period is an hour, so only its link notification can do it), checks it, and says how long it took. Each
# ironguardctl call takes a while under qemu's emulated CPU.
repaired() {
  t0=$(date +%s%N)
  until "$2" || [ $(($(date +%s%N) - t0)) -gt 300000000000 ]; do sleep 0.1; done
  t1=$(date +%s%N)
  check "$1" yes "$2"
  echo "guest: $3 $(((t1 - t0) / 1000000)) ms after it came up"
}
# dhcpd on br0 and s0 (raw sockets), serving 10.96.0.0/24 on br0.
start_dhcpd() {
  : >/tmp/dhcpd.leases
  ip netns exec pxe dhcpd -4 -q --no-pid -cf /tmp/dhcpd.conf -lf /tmp/dhcpd.leases br0 s0 >>/tmp/dhcpd.log 2>&1
  i=0; while ! ip netns exec pxe ss -Hlun 'sport = :67' | grep -q 67 && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
}
stop_dhcpd() { pkill -x dhcpd; sleep 0.3; }
# make_br0: the provisioning bridge, with node n1's port in it.
make_br0() {
  ip -n pxe link add br0 type bridge forward_delay 0
  ip -n pxe addr add 10.96.0.1/24 dev br0
  ip -n pxe link set p1 master br0
  ip -n pxe link set br0 up
}

M1=52:54:00:13:d0:01
M2=52:54:00:13:d0:02
UNKNOWN=52:54:00:13:d0:99

# The PXE host: br0 10.96.0.1/24 with node n1; s0 10.96.2.1/24, a second provisioning link (to an idle peer).
for ns in pxe n1 peer; do ip netns add $ns; ip -n $ns link set lo up; done
ip link add p1 netns pxe type veth peer name eth0 netns n1
ip -n pxe link set p1 up
make_br0
ip link add s0 netns pxe type veth peer name eth0 netns peer
ip -n pxe addr add 10.96.2.1/24 dev s0
ip -n pxe link set s0 up
ip -n peer link set eth0 up
cat >/tmp/dhcpd.conf <<EOF
default-lease-time 600;
max-lease-time 600;
authoritative;
ping-check false;
subnet 10.96.0.0 netmask 255.255.255.0 { range 10.96.0.100 10.96.0.200; }
subnet 10.96.2.0 netmask 255.255.255.0 { }
EOF
start_dhcpd
echo "guest: nft $(nft --version)"

check control-no-firewall yes lease n1 $UNKNOWN

# The guard alone on the reply side: dhcpd answers, the kernel drops the answer.
# shellcheck disable=SC2086
ip netns exec pxe "$BIN/ironguard-agent" guard install $EGRESS >/tmp/guard.log 2>&1 ||
  result guard-install FAIL "$(cat /tmp/guard.log)"
check guard-alone-drops no lease n1 $UNKNOWN
check guard-bound yes bound egress_guard

# Leader, unknown MACs denied; the kernel lease on the reply side.
hold --mode leader --unknown-mac-policy deny --allow $M1 --deny $M2
check_eventually leader-verdict 300 is_leader
check leader-allowed yes lease n1 $M1
check leader-denied no lease n1 $M2
check leader-unknown no lease n1 $UNKNOWN
check_eventually lease-element 300 lease_live
stop_hold
check sigterm-closes no lease n1 $M1
# (Follower, blocked and policy allow on the reply side: egress.rs, on this machine's kernel; the rules are the same.)

# SIGKILL: the owned table goes with the process; the guard closes at once.
hold --mode leader --unknown-mac-policy allow --allow $M1
check before-kill yes lease n1 $M1
kill -KILL "$HOLD_PID"
wait "$HOLD_PID" 2>/dev/null
check sigkill-closed no lease n1 $M1
# SIGSTOP: a frozen holder stops serving when its lease element expires; thawed, it serves again.
hold --mode leader --unknown-mac-policy allow --allow $M1
kill -STOP "$HOLD_PID"
sleep 2.2
check sigstop-fenced yes fenced
check sigstop-closed no lease n1 $M1
kill -CONT "$HOLD_PID"
check_eventually sigcont-serves 300 lease n1 $M1
stop_hold

# Why this kernel needs the agent's help: with nothing watching, a provisioning bridge deleted and created again
# is left without the guard's egress hook (before Linux 6.16), and dhcpd on it answers anybody.
stop_dhcpd
ip -n pxe link del br0
make_br0
start_dhcpd
check kernel-forgets-recreated-device no bound egress_guard
check unwatched-recreated-device-open yes lease n1 $UNKNOWN
stop_dhcpd
# shellcheck disable=SC2086
ip netns exec pxe "$BIN/ironguard-agent" guard install $EGRESS >/tmp/guard.log 2>&1 ||
  result guard-reinstall FAIL "$(cat /tmp/guard.log)"
start_dhcpd

# The agent with a control plane. Its read-back period is an hour, so what repairs the binding below is the link
# notification, not the period.
start_controlplane
write_agent_toml 3600 'hooks = []
egress_interfaces = ["br0", "s0"]'
sleep 1
ip netns exec pxe "$BIN/ironguard-agent" --config /tmp/agent.toml run >/tmp/agent.log 2>&1 &
AGENT=$!
wait_verdict() { i=0; while [ "$(verdict)" != "$1" ] && [ $i -lt "$2" ]; do sleep 0.1; i=$((i + 1)); done; }
check_eventually agent-leads 300 is_leader
ctl filters allow $M1 >/dev/null && ctl filters deny $M2 >/dev/null
check_eventually agent-allowed 300 lease n1 $M1
check agent-denied no lease n1 $M2
check agent-unknown no lease n1 $UNKNOWN

# The bridge rebuilt under the agent: it binds both egress chains to the new br0 when the link comes back.
stop_dhcpd
ip -n pxe link del br0
sleep 1
make_br0
repaired agent-rebinds-recreated-device bound_both "both egress chains bound to the new br0"
start_dhcpd
check_eventually recreated-leads 300 is_leader
check recreated-unknown no lease n1 $UNKNOWN
check recreated-denied no lease n1 $M2
check_eventually recreated-allowed 300 lease n1 $M1
stop agent $AGENT
check agent-sigterm-closes no lease n1 $M1

# One egress interface only: when it goes, the kernel before 6.16 takes the whole base chain with it (in the guard's
# table and in the agent's). The agent stays closed meanwhile and builds both again when the interface is back.
sed -i 's/^egress_interfaces = .*/egress_interfaces = ["br0"]/' /tmp/agent.toml
ip netns exec pxe "$BIN/ironguard-agent" guard install --hook none --egress-interface br0 >/tmp/guard.log 2>&1 ||
  result guard-install-single FAIL "$(cat /tmp/guard.log)"
# At info, each reopening of the control-plane stream is logged ("watching filters"): counted below.
RUST_LOG=info ip netns exec pxe "$BIN/ironguard-agent" --config /tmp/agent.toml run >/tmp/agent1.log 2>&1 &
AGENT=$!
check_eventually single-leads 300 is_leader
stop_dhcpd
# A snapshot retry reopens the stream ("watching filters") without a warning; a stream lost for another reason (the
# control plane silent for 10 s: the emulated guest starved beside CI's tests) reopens it after a "stream lost"
# warning. Only the first are counted.
retries() { echo $(($(grep -c 'watching filters' /tmp/agent1.log) - $(grep -c 'control plane stream lost' /tmp/agent1.log))); }
before=$(retries)
ip -n pxe link del br0
# Eight seconds without br0 (the retries' pace is judged over them).
sleep 8
# What the kernel did with the two base chains bound to br0 alone: Linux 6.1 deletes them with their last device,
# so the agent's repairs fail until br0 is back (it retries, backing off); 6.12 keeps them, bound to no device, so
# nothing fails and there is nothing to retry.
unbound=$(chains | jq '[.egress_guard.chains[]?, .egress_owned.chains[]? | select(.hook == "egress" and (.devices // []) == [])] | length')
reconnects=$(($(retries) - before))
i=0
if [ "$unbound" != 2 ]; then
  # ... and on until two retries were seen.
  while [ "$reconnects" -lt 2 ] && [ $i -lt 600 ]; do
    sleep 0.2; i=$((i + 1))
    reconnects=$(($(retries) - before))
  done
fi
echo "guest: br0 gone: verdict $(verdict); egress chains $(chains | jq -c '[.egress_guard.chains[]? , .egress_owned.chains[]? | {name, devices}]')"
check single-agent-survives-absent-device yes kill -0 $AGENT
make_br0
bound_single() { chains | jq -e '[.egress_guard.chains[]?, .egress_owned.chains[]? | select(.devices == ["br0"])] | length == 2' >/dev/null; }
repaired single-rebuilt-and-bound bound_single "single egress interface: both chains back on the new br0"
start_dhcpd
wait_verdict LEADER 1200
check single-unknown no lease n1 $UNKNOWN
check_eventually single-allowed 300 lease n1 $M1
# Its retries back off, and the same kernel error is said once, not at every retry.
check single-errors-said-once yes test "$(grep -c ERROR /tmp/agent1.log)" -le 4
echo "guest: $reconnects snapshot retries in the 8 s without br0"
if [ "$unbound" = 2 ]; then
  # The kernel kept both chains: the agent saw no error and did not churn.
  check single-chains-kept-no-retries yes test "$reconnects" -le 0
else
  check single-retries-back-off yes test "$reconnects" -ge 2 -a "$reconnects" -le $((10 + i / 5))
fi
grep -E "ERROR|WARN" /tmp/agent1.log | cut -c1-400 | head -12
stop agent $AGENT
stop controlplane $CP
echo "--- agent log (tail)"; tail -8 /tmp/agent.log
echo DONE
