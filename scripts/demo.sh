#!/usr/bin/env bash
# ironguard's main job on the embedded default, as a real demo in network namespaces (run as root on Debian 12).
#
# A PXE host (namespace ig-demo-pxe) runs a real dnsmasq behind ironguard's guard, a real OpenStack Ironic 39
# (standalone: noauth, fake-hardware driver, sqlite), ironguard's control plane (embedded store, unknown MACs
# denied, the ironic-inspector API on the PXE network) and ironguard's agent. Four machines (ig-demo-node1..3 and
# ig-demo-stranger) run real DHCP clients. The demo then shows, checking every outcome and exiting non-zero on any
# surprise:
#   1. Nobody gets DHCP: Ironic's ports are denied, a stranger is unknown; ironguardctl without the operator's
#      certificate cannot open DHCP (gRPC is TLS with client certificates made by scripts/make-certs.sh), and the
#      stranger cannot start an inspection through the inspector API (http_basic: 401 without the password).
#   2. `ironguardctl inspect start node1`: ironguard sets PXE and powers node1 on through Ironic; only node1 gets a
#      lease; the ramdisk's data (posted with ironic-python-agent's own code from node1) is processed with
#      ironic-inspector's default hooks: node1's cpus, memory_mb, cpu_arch, local_gb and capabilities are set in
#      Ironic (checked); node1 is powered off and DHCP is closed again.
#   3. Ironic's own inspection of node2 (`baremetal node inspect`), ironguard as its PXE filter: only node2 boots;
#      its ramdisk reports to Ironic's /v1/continue_inspection; DHCP closes.
#   4. An inspection of node3 is running when the agent is killed with SIGKILL: DHCP closes at once.
# Everything lives in namespaces named ig-demo-*, removed at the end; the host's own firewall is never touched.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
# A step's header, with the seconds since the demo began (beside a loaded machine's tests, where the time goes).
say() { echo "== $* (at $(($(date +%s) - T0)) s)"; }
source scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

say "building ironguard"
# The workspace's binaries but the benchmark's and the fake Ironic's, which the demo does not need. (The whole
# workspace, not `-p` of the product's packages: cargo then resolves the crates' features as the test build does, so
# a checkout that ran the tests reuses their build.)
cargo build --locked --workspace --bins --exclude ironguard-bench --exclude fake-ironic
BIN=$PWD/target/debug
say "the real Ironic 39 and OpenStack clients (a cached Python environment; made once, about a minute)"
VENV=$(scripts/ironic-venv.sh)
export PYTHONWARNINGS=ignore

PXE=ig-demo-pxe
NODES=(ig-demo-node1 ig-demo-node2 ig-demo-node3 ig-demo-stranger)
MACS=(52:54:00:de:00:01 52:54:00:de:00:02 52:54:00:de:00:03 52:54:00:de:00:99)
IRONIC=http://10.77.0.1:6385
INSPECTOR=http://10.77.0.1:5050
WORK=""

cleanup() {
  disown -a 2>/dev/null || true
  for ns in "$PXE" "${NODES[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  [ -n "$WORK" ] && rm -rf "$WORK"
}
fail() {
  echo
  echo "DEMO FAILED: $*" >&2
  for f in controlplane agent ironic; do
    [ -f "$WORK/$f.log" ] && { echo "---- last lines of $f.log ----" >&2; tail -n 25 "$WORK/$f.log" >&2; }
  done
  exit 1
}
trap cleanup EXIT
trap 'fail "the command at line $LINENO failed"' ERR
cleanup 2>/dev/null || true
WORK=$(mktemp -d /tmp/ig-demo.XXXXXX)
chmod 755 "$WORK"

in_pxe() { ip netns exec "$PXE" "$@"; }
ctl() { in_pxe "$BIN/ironguardctl" "$@"; }
baremetal() { in_pxe "$VENV/bin/baremetal" --os-endpoint "$IRONIC" --os-auth-type none "$@"; }
# node_field NODE FIELD: one field of a node, read from Ironic's REST API with curl. The waits below poll with it:
# each `baremetal` command starts Python and the OpenStack client (about 0.7 s of CPU), a curl almost nothing.
node_field() {
  in_pxe curl -sf -H 'X-OpenStack-Ironic-API-Version: latest' "$IRONIC/v1/nodes/$1?fields=$2" |
    python3 -c "import json, sys; print(json.load(sys.stdin)['$2'])"
}
node_is() { [ "$(node_field "$1" "$2" 2>/dev/null)" = "$3" ]; }
wait_until() { # seconds, description, command...
  local t=$1 what=$2; shift 2
  for _ in $(seq $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "timed out after ${t}s waiting for: $what"
}

echo
say "topology: PXE host $PXE (br0 10.77.0.1/24) and machines ${NODES[*]}"
ip netns add "$PXE"
in_pxe ip link set lo up
in_pxe ip link add br0 type bridge forward_delay 0
in_pxe ip addr add 10.77.0.1/24 dev br0
in_pxe ip link set br0 up
for i in "${!NODES[@]}"; do
  ns=${NODES[$i]}
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  ip link add eth0 netns "$ns" address "${MACS[$i]}" type veth peer name "p$i" netns "$PXE"
  ip netns exec "$ns" ip link set eth0 up
  in_pxe ip link set "p$i" master br0 up
done

say "0. the guard (installed before dnsmasq, as systemd does on a real host), then dnsmasq"
in_pxe "$BIN/ironguard-agent" guard install --interface br0
in_pxe dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 --user=root --interface=br0 \
  --dhcp-range=10.77.0.100,10.77.0.200,255.255.255.0,1h --no-ping --dhcp-authoritative \
  --dhcp-leasefile="$WORK/leases" --log-facility="$WORK/dnsmasq.log" --log-dhcp &
disown
wait_until 10 "dnsmasq on udp/67" sh -c "ip netns exec $PXE ss -Hlun 'sport = :67' | grep -q ."

cat >"$WORK/udhcpc.sh" <<'S'
#!/bin/sh
[ "$1" = bound ] && echo "lease $ip from $serverid"
exit 0
S
chmod +x "$WORK/udhcpc.sh"
# dhcp_expect NODE-INDEX yes|no: one DHCP exchange (3 DISCOVERs, 1 s apart) and a check of its outcome.
dhcp_result() {
  ip netns exec "${NODES[$1]}" busybox udhcpc -i eth0 -f -q -n -t 3 -T 1 -s "$WORK/udhcpc.sh" 2>/dev/null | grep lease || echo "NO LEASE"
}
dhcp_expect() { # space-separated "index:yes|no" pairs, run at once
  local pids=() pair i
  for pair in "$@"; do i=${pair%%:*}; dhcp_result "$i" >"$WORK/dhcp-$i" & pids+=($!); done
  wait "${pids[@]}"
  local bad=""
  for pair in "$@"; do
    i=${pair%%:*}
    local got; got=$(cat "$WORK/dhcp-$i")
    printf '   %-17s %s  %s\n' "${NODES[$i]#ig-demo-}" "${MACS[$i]}" "$got"
    case "${pair#*:}:$got" in
      yes:lease*|no:"NO LEASE") ;;
      *) bad="$bad ${NODES[$i]#ig-demo-} (expected ${pair#*:})" ;;
    esac
  done
  [ -z "$bad" ] || fail "unexpected DHCP outcome for:$bad"
}

say "0. Ironic 39 on $IRONIC (standalone, fake-hardware) with three enrolled, manageable machines"
mkdir -p "$WORK/ironic-locks"
cp "$VENV/ironguard-template.sqlite" "$WORK/ironic.sqlite" 2>/dev/null ||
  "$VENV/bin/ironic-dbsync" --config-file <(printf '[database]\nconnection = sqlite:///%s\n' "$WORK/ironic.sqlite") create_schema >/dev/null 2>&1
cat >"$WORK/ironic.conf" <<C
[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = demo-ironic
enabled_hardware_types = fake-hardware
enabled_boot_interfaces = fake
enabled_deploy_interfaces = fake
enabled_management_interfaces = fake
enabled_power_interfaces = fake
enabled_inspect_interfaces = agent,no-inspect
enabled_network_interfaces = noop
enabled_bios_interfaces = no-bios
enabled_console_interfaces = no-console
enabled_firmware_interfaces = no-firmware
enabled_raid_interfaces = no-raid
enabled_rescue_interfaces = no-rescue
enabled_storage_interfaces = noop
enabled_vendor_interfaces = no-vendor
default_inspect_interface = agent
[api]
host_ip = 10.77.0.1
port = 6385
[database]
connection = sqlite:///$WORK/ironic.sqlite
[dhcp]
dhcp_provider = none
[conductor]
automated_clean = false
[inspector]
# Ironic only sets PXE and powers on; the PXE filter (ironguard) decides who gets DHCP.
require_managed_boot = false
[oslo_concurrency]
lock_path = $WORK/ironic-locks
C
in_pxe "$VENV/bin/ironic" --config-file "$WORK/ironic.conf" >"$WORK/ironic.log" 2>&1 &
disown
wait_until 60 "Ironic's API" in_pxe curl -sf "$IRONIC/"
# The three machines and their ports from one file (`baremetal create`: one start of the OpenStack client instead of
# six), then made manageable side by side.
{
  echo '{"nodes": ['
  for i in 0 1 2; do
    [ "$i" = 0 ] || echo ','
    printf '{"name": "node%d", "driver": "fake-hardware", "driver_info": {"ipmi_address": "10.99.0.%d"}, "ports": [{"address": "%s"}]}\n' \
      $((i + 1)) $((i + 1)) "${MACS[$i]}"
  done
  echo ']}'
} >"$WORK/nodes.json"
baremetal create "$WORK/nodes.json"
pids=()
for i in 0 1 2; do baremetal node manage "node$((i + 1))" --wait 30 & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
UUIDS=()
for i in 0 1 2; do UUIDS+=("$(node_field "node$((i + 1))" uuid)"); done
baremetal node list --fields name provision_state power_state

echo
say "0. ironguard: control plane (embedded store, unknown MACs denied) and agent on the PXE host"
echo "   certificates (openssl): a CA, the control plane's, the agent's (its name is its id) and the operator's"
for cert in "ca" "server controlplane.demo IP:127.0.0.1" "client demo-pxe-host" "client operator"; do
  # shellcheck disable=SC2086
  scripts/make-certs.sh "$WORK/tls" $cert | sed 's/^/   /'
done
# The inspector API listens on the PXE network, where any machine can reach it: operator calls need a password
# (http_basic, a bcrypt htpasswd file as `htpasswd -B` writes it); the ramdisk's /v1/continue needs none.
OPERATOR_PASSWORD=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
"$VENV/bin/python" -c 'import bcrypt, sys; print("operator:" + bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(10)).decode())' \
  "$OPERATOR_PASSWORD" >"$WORK/htpasswd"
echo "   inspector API operators: $WORK/htpasswd (user operator, bcrypt)"
cat >"$WORK/controlplane.toml" <<T
[server]
grpc_listen = "127.0.0.1:9100"
admin_listen = "127.0.0.1:9101"
inspector_listen = "10.77.0.1:5050"   # ironic-inspector's API, for the ramdisk and openstack baremetal introspection
[grpc]                                # TLS; agents and operators prove who they are with certificates
tls_cert_file = "$WORK/tls/controlplane.demo.pem"
tls_key_file = "$WORK/tls/controlplane.demo.key"
client_ca_file = "$WORK/tls/ca.pem"
operator_names = ["operator"]
[inspector_api]                       # noauth on a network address is refused unless insecure = true
auth_strategy = "http_basic"
http_basic_auth_user_file = "$WORK/htpasswd"
[store]
data_dir = "$WORK/controlplane"
[filter]
unknown_mac_policy = "deny"
[ironic]
url = "$IRONIC"
[sync]
ironic_sync_secs = 2                  # deny every MAC Ironic knows
ironic_inspection_period_ms = 500     # allow the nodes Ironic itself inspects
T
in_pxe "$BIN/ironguard-controlplane" --config "$WORK/controlplane.toml" >"$WORK/controlplane.log" 2>&1 &
disown
cat >"$WORK/agent.toml" <<T
[agent]
id = "demo-pxe-host"
network = "demo"
state_dir = "$WORK"
[controlplane]
endpoints = ["https://127.0.0.1:9100"]
ca_file = "$WORK/tls/ca.pem"
cert_file = "$WORK/tls/demo-pxe-host.pem"
key_file = "$WORK/tls/demo-pxe-host.key"
server_name = "controlplane.demo"
[admin]
listen = "127.0.0.1:9181"
[dataplane]
interfaces = ["br0"]
T
# ironguardctl, as the operator (its configuration file; flags and IRONGUARD_* variables work as well).
cat >"$WORK/ctl.toml" <<T
controlplane = "https://127.0.0.1:9100"
ca_file = "$WORK/tls/ca.pem"
cert_file = "$WORK/tls/operator.pem"
key_file = "$WORK/tls/operator.key"
server_name = "controlplane.demo"
T
export IRONGUARD_CTL_CONFIG="$WORK/ctl.toml"
# `ip netns exec` execs the agent, so $! is the agent's own pid (for step 4).
ip netns exec "$PXE" "$BIN/ironguard-agent" --config "$WORK/agent.toml" run >"$WORK/agent.log" 2>&1 &
AGENT=$!
wait_until 20 "the agent leads" sh -c "'$BIN/ironguardctl' chains --netns $PXE | grep -q 'verdict: LEADER'"
wait_until 20 "Ironic's ports denied" sh -c "ip netns exec $PXE '$BIN/ironguardctl' filters show | grep -c ironic | grep -q 3"
"$BIN/ironguardctl" chains --netns "$PXE" | tail -n 1

echo
say "1. nothing is inspected: nobody gets DHCP (Ironic's machines are denied, the stranger is unknown)"
dhcp_expect 0:no 1:no 2:no 3:no
ctl filters show
echo "   without the operator's certificate, opening DHCP to the stranger is refused (and changes nothing):"
if in_pxe env IRONGUARD_CTL_CONFIG=/dev/null "$BIN/ironguardctl" --controlplane https://127.0.0.1:9100 \
  --ca-file "$WORK/tls/ca.pem" --tls-server-name controlplane.demo filters allow "${MACS[3]}" >"$WORK/refused.txt" 2>&1; then
  fail "an unauthenticated ironguardctl opened DHCP: $(cat "$WORK/refused.txt")"
fi
sed 's/^/   /' "$WORK/refused.txt"
grep -q "without valid credentials" "$WORK/refused.txt" || fail "unexpected refusal: $(cat "$WORK/refused.txt")"
echo "   from the stranger, on the PXE network: starting an inspection through the inspector API without the"
echo "   operator's password is refused (401), and with a wrong one too:"
ip netns exec "${NODES[3]}" ip addr add 10.77.0.14/24 dev eth0
for auth in "" "-u operator:wrong"; do
  # shellcheck disable=SC2086
  code=$(ip netns exec "${NODES[3]}" curl -s -o /dev/null -w '%{http_code}' $auth -X POST "$INSPECTOR/v1/introspection/node1")
  echo "   POST $INSPECTOR/v1/introspection/node1 ${auth:+($auth) }-> $code"
  [ "$code" = 401 ] || fail "the inspector API answered $code to an unauthenticated start"
done
ip netns exec "${NODES[3]}" ip addr flush dev eth0
dhcp_expect 3:no

echo
say "2. ironguard inspects node1: ironguardctl inspect start node1"
ctl inspect start node1
UUID1=${UUIDS[0]}
wait_until 30 "node1 waiting for its ramdisk" sh -c "ip netns exec $PXE '$BIN/ironguardctl' inspect status $UUID1 | grep -q 'state: waiting'"
echo "-- Ironic: node1 is powered on (PXE boot device set first)"
baremetal node show node1 --fields name provision_state power_state
[ "$(node_field node1 power_state)" = "power on" ] || fail "ironguard did not power node1 on through Ironic"
grep -q "PUT /v1/nodes/$UUID1/management/boot_device" "$WORK/ironic.log" || fail "no PXE boot device request in Ironic's log"
echo "-- DHCP: only node1 boots"
dhcp_expect 0:yes 1:no 2:no 3:no
echo "-- the ramdisk on node1 posts its data to $INSPECTOR/v1/continue (ironic-python-agent's own client code)"
ip netns exec "${NODES[0]}" ip addr add 10.77.0.11/24 dev eth0
cat >"$WORK/node1-inventory.json" <<J
{"inventory": {"interfaces": [{"name": "eth0", "mac_address": "${MACS[0]}", "ipv4_address": "10.77.0.11", "has_carrier": true}],
  "cpu": {"model_name": "QEMU Virtual CPU", "frequency": "2400", "count": 8, "architecture": "x86_64", "flags": ["lm", "vmx"]},
  "memory": {"total": 17179869184, "physical_mb": 16384},
  "disks": [{"name": "/dev/vda", "size": 107374182400, "rotational": false, "model": "QEMU HARDDISK", "serial": "d1"}],
  "bmc_address": "10.99.0.1", "system_vendor": {"manufacturer": "QEMU", "product_name": "Standard PC"},
  "boot": {"current_boot_mode": "uefi", "pxe_interface": "${MACS[0]}"}},
 "boot_interface": "${MACS[0]}", "root_disk": {"name": "/dev/vda", "size": 107374182400}}
J
echo "-- the stranger heard node1's MAC in its DHCP broadcasts; it posts data naming that MAC, with its own NIC as the"
echo "   boot interface (to get its own MAC made node1's port, and so DHCP later). Nothing ties it to node1's"
echo "   inspection (its MAC was never let through the filter): refused, node1 keeps waiting for its own data"
ip netns exec "${NODES[3]}" ip addr add 10.77.0.14/24 dev eth0
sed -e "s/\"boot_interface\": \"${MACS[0]}\"/\"boot_interface\": \"${MACS[3]}\"/" \
  -e "s/\"interfaces\": \[/\"interfaces\": [{\"name\": \"eth1\", \"mac_address\": \"${MACS[3]}\", \"ipv4_address\": \"10.77.0.14\"}, /" \
  "$WORK/node1-inventory.json" >"$WORK/hijack.json"
code=$(ip netns exec "${NODES[3]}" curl -s -o "$WORK/hijack.out" -w '%{http_code}' -H 'Content-Type: application/json' \
  --data-binary @"$WORK/hijack.json" "$INSPECTOR/v1/continue")
echo "   POST $INSPECTOR/v1/continue -> $code $(cat "$WORK/hijack.out")"
[ "$code" = 400 ] || fail "the stranger's data for node1 was answered $code"
echo "-- it tries again with node1's own NIC as the boot interface (node1 booted from it): the control plane's"
echo "   neighbour table gives the stranger's address to the stranger's NIC, not to node1's: refused too"
sed -e 's/"ipv4_address": "10.77.0.11"/"ipv4_address": "10.77.0.14"/' "$WORK/node1-inventory.json" >"$WORK/own-boot.json"
code=$(ip netns exec "${NODES[3]}" curl -s -o "$WORK/own-boot.out" -w '%{http_code}' -H 'Content-Type: application/json' \
  --data-binary @"$WORK/own-boot.json" "$INSPECTOR/v1/continue")
echo "   POST $INSPECTOR/v1/continue -> $code $(cat "$WORK/own-boot.out")"
[ "$code" = 400 ] || fail "the stranger's data naming node1's boot interface was answered $code"
ip netns exec "${NODES[3]}" ip addr flush dev eth0
ctl inspect status "$UUID1" | grep -q 'state: waiting' || fail "the stranger's data changed node1's inspection"
reply=$(ip netns exec "${NODES[0]}" "$VENV/bin/python" tests/ironic/ipa_callback.py "$WORK/node1-inventory.json" \
  --inspection_callback_url "$INSPECTOR/v1/continue") || fail "the ramdisk's callback was refused"
echo "   reply: $reply"
case "$reply" in *"$UUID1"*) ;; *) fail "the callback did not name node1's UUID" ;; esac
ctl inspect wait "$UUID1" --timeout 30 || fail "node1's inspection did not finish"
ctl inspect status "$UUID1"
echo "-- the stored data (excerpt):"
ctl inspect data "$UUID1" | grep -E '"(count|physical_mb|architecture|current_boot_mode)"' | sed 's/^ */   /'
echo "-- node1 in Ironic after processing (ironic-inspector's default hooks: properties, capabilities):"
baremetal node show node1 --fields name provision_state power_state properties
in_pxe curl -sf -H 'X-OpenStack-Ironic-API-Version: latest' "$IRONIC/v1/nodes/node1?fields=properties" | python3 -c '
import json, sys
p = json.load(sys.stdin)["properties"]
want = {"cpus": "8", "memory_mb": "16384", "cpu_arch": "x86_64", "local_gb": "99"}
bad = {k: p.get(k) for k, v in want.items() if p.get(k) != v}
if bad or "cpu_vt:true" not in p.get("capabilities", ""):
    sys.exit(f"expected {want} and capability cpu_vt:true, got {p}")
' || fail "processing did not set node1's properties in Ironic"
wait_until 10 "node1 powered off" node_is node1 power_state "power off"
echo "-- DHCP: closed again"
dhcp_expect 0:no 1:no 2:no 3:no

echo
say "3. Ironic inspects node2 itself (baremetal node inspect), ironguard as its PXE filter"
baremetal node inspect node2
wait_until 30 "node2 in inspect wait" node_is node2 provision_state "inspect wait"
baremetal node show node2 --fields name provision_state power_state
wait_until 10 "node2's port allowed" sh -c "ip netns exec $PXE '$BIN/ironguardctl' filters show --mac ${MACS[1]} | grep -q ironic-inspection"
echo "-- DHCP: only node2 boots"
dhcp_expect 0:no 1:yes 2:no 3:no
echo "-- the ramdisk on node2 reports to Ironic's $IRONIC/v1/continue_inspection"
ip netns exec "${NODES[1]}" ip addr add 10.77.0.12/24 dev eth0
sed -e "s/${MACS[0]}/${MACS[1]}/g" -e 's/10.99.0.1/10.99.0.2/' -e 's/10.77.0.11/10.77.0.12/' "$WORK/node1-inventory.json" >"$WORK/node2-inventory.json"
ip netns exec "${NODES[1]}" "$VENV/bin/python" tests/ironic/ipa_callback.py "$WORK/node2-inventory.json" \
  --inspection_callback_url "$IRONIC/v1/continue_inspection" >/dev/null || fail "Ironic refused node2's data"
wait_until 30 "node2 manageable again" node_is node2 provision_state manageable
baremetal node show node2 --fields name provision_state properties
wait_until 10 "node2's allow removed" sh -c "! ip netns exec $PXE '$BIN/ironguardctl' filters show --mac ${MACS[1]} | grep -q ironic-inspection"
echo "-- DHCP: closed again"
dhcp_expect 0:no 1:no 2:no 3:no

echo
say "4. node3 is being inspected when the agent dies (SIGKILL): the kernel drops its table, the guard closes DHCP"
ctl inspect start node3
UUID3=${UUIDS[2]}
wait_until 30 "node3 waiting" sh -c "ip netns exec $PXE '$BIN/ironguardctl' inspect status $UUID3 | grep -q 'state: waiting'"
dhcp_expect 2:yes
kill -9 "$AGENT"; wait "$AGENT" 2>/dev/null || true
"$BIN/ironguardctl" chains --netns "$PXE" | tail -n 1
"$BIN/ironguardctl" chains --netns "$PXE" | grep -q "verdict: CLOSED" || fail "the guard is not closing DHCP after the agent died"
dhcp_expect 2:no

echo
echo "demo finished: every step behaved as expected ($(($(date +%s) - T0)) s in all); namespaces removed."
