#!/usr/bin/env bash
# ironguard's Debian packages under a real systemd: boots ROOT (a Debian 12 root in which the packages are
# installed, as scripts/fresh-root.sh leaves it) with systemd-nspawn and proves, with real DHCP traffic, that
#   1. the units from the packages are enabled and start at boot, the guard before the agent and dnsmasq, and
#      `systemctl start ironguard-guard ironguard-controlplane ironguard-agent` works;
#   2. the agent runs as the ironguard user with CAP_NET_ADMIN only (CapEff/CapPrm/CapBnd/CapAmb of its MainPID),
#      the control plane as ironguard with no capability at all;
#   3. Type=notify: when `systemctl start ironguard-agent` returns, its table inet ironguard is in the kernel and
#      the unit is active/running;
#   4. DHCP is open to an allowed MAC on the leader (a lease from dnsmasq), closed to a MAC that is not allowed;
#   5. the watchdog: a frozen agent (SIGSTOP) serves nobody, and systemd kills it after WatchdogSec and starts a
#      new one (new MainPID, NRestarts + 1, "Watchdog timeout" in the journal), which opens DHCP again;
#   5b. the packaged unit's ExecStopPost=: with the dnsmasq-hostsdir backend alone (no kernel guard at all), a
#      leader killed with SIGKILL (its main process, as a crash would) leaves every hostsdir file closed — `guard install` ran
#      after the kill, before any restart (held off here by a drop-in) — and dnsmasq serves nobody;
#   6. `systemctl stop ironguard-agent` closes DHCP; the guard keeps it closed while no agent runs, across
#      `systemctl restart ironguard-guard` and across a reboot, after which the guard table is in place and DHCP is
#      closed with dnsmasq running and the agent not started; `systemctl reload|restart ironguard-guard` under a
#      running agent succeed and leave the agent's held guard in place, and the leader keeps serving;
#   7. the maintainer scripts under a running systemd: installing the packages again (the upgrade path, with
#      DEBDIR) restarts the daemons and keeps /etc/ironguard; removing ironguard-agent leaves DHCP closed; purging
#      it and deleting the guard table opens it.
#
# Topology (names unique to this run, removed at the end; the host's own firewall is never touched):
#   the container   systemd-nspawn --private-network: pxe0 10.78.0.1/24 (pxe-net.service), dnsmasq.service (a unit
#                   this check adds: dnsmasq-base on pxe0), the guard and the agent filtering pxe0
#   netns igsd-<pid>-cli   a DHCP client (busybox udhcpc on eth0, the other end of pxe0's veth pair)
# The container runs the embedded-store control plane on loopback (gRPC insecure = true, unknown MACs denied) and an
# agent pointing at it; with no etcd the agent leads alone. Commands run in the container with
# `nsenter -t <its PID 1> -a`. The check writes its configuration into ROOT/etc (ROOT is a throw-away root).
#
#   scripts/systemd-check.sh ROOT [DEBDIR]     (DEBDIR: where the .deb files are, as a path inside ROOT)
# Every failure to set up fails (under CI=true or not), saying what is missing; nothing is skipped. About 40 s.
set -eEuo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)

root=${1:?usage: scripts/systemd-check.sh ROOT [DEBDIR] (a Debian 12 root with the ironguard packages installed)}
root=$(cd "$root" && pwd)
debdir=${2:-}   # the .deb files, as a path inside ROOT: installed again under the running systemd (an upgrade)
tag=igsd-$$
NS_CLI=$tag-cli
MACHINE=$tag
HOST_IF=${tag}h                # the veth end systemd-nspawn creates on the host, moved into $NS_CLI at once
MAC_OK=52:54:00:5d:00:01       # allowed through ironguardctl
MAC_OTHER=52:54:00:5d:00:99    # never allowed: the control plane denies unknown MACs
work=$(mktemp -d "${TMPDIR:-/tmp}/ironguard-systemd-check.XXXXXX")
nspawn_pid=""
pid1=""

say() { echo "== [systemd check $(($(date +%s) - T0)) s] $*"; }
ok() { echo "   ok: $*"; }

# Commands inside the booted container (all its namespaces, its root, a clean environment).
ct() { nsenter -t "$pid1" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb SYSTEMD_COLORS=0 "$@"; }
prop() { ct systemctl show -P "$2" "$1"; }   # unit, property

fail() {
  echo >&2
  echo "SYSTEMD CHECK FAILED: $*" >&2
  if [ -n "$pid1" ] && kill -0 "$pid1" 2>/dev/null; then
    echo "---- systemctl status (container) ----" >&2
    ct systemctl --no-pager --full status ironguard-guard ironguard-agent ironguard-controlplane dnsmasq 2>&1 |
      tail -n 60 >&2 || true
    echo "---- journal (container, last 60 lines of the ironguard units) ----" >&2
    ct journalctl --no-pager -n 60 -u ironguard-guard -u ironguard-agent -u ironguard-controlplane -u dnsmasq >&2 || true
    echo "---- ironguardctl chains (container) ----" >&2
    ct ironguardctl chains >&2 || true
  fi
  [ -f "$work/boot.log" ] && { echo "---- the container's console (last 20 lines) ----" >&2; tail -n 20 "$work/boot.log" >&2; }
  exit 1
}
# (In a subshell, e.g. a command substitution, only the subshell exits; its caller's failure then reports.)
trap '[ "$BASHPID" = "$$" ] && fail "the command at line $LINENO failed"' ERR

cleanup() {
  local rc=$?
  trap - ERR
  if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
    # SIGTERM: systemd-nspawn asks the container to power off; SIGKILL if it has not after 20 s.
    kill -TERM "$nspawn_pid" 2>/dev/null || true
    for _ in $(seq 200); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
    wait "$nspawn_pid" 2>/dev/null || true
  fi
  for p in $(ip netns pids "$NS_CLI" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  ip netns del "$NS_CLI" 2>/dev/null || true
  ip link del "$HOST_IF" 2>/dev/null || true
  rm -rf "/run/systemd/nspawn/propagate/$MACHINE" "$work"
  leave_cgroups
  exit $rc
}
trap cleanup EXIT

for tool in systemd-nspawn nsenter ip busybox; do
  command -v "$tool" >/dev/null ||
    fail "$tool is missing on this host (scripts/install-deps.sh installs systemd-container, util-linux, iproute2, busybox)"
done
for f in usr/bin/ironguard-agent usr/bin/ironguard-controlplane usr/bin/ironguardctl lib/systemd/systemd \
  usr/sbin/dnsmasq usr/sbin/nft; do
  [ -x "$root/$f" ] || fail "$root/$f is missing: install the packages (scripts/package.sh, then dpkg -i) and dnsmasq-base, nftables"
done
for p in ironguard-agent ironguard-controlplane ironguardctl; do
  chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    fail "package $p is not installed in $root"
done

# wait_for SECONDS DESCRIPTION COMMAND...: polls every 0.2 s.
wait_for() {
  local t=$1 what=$2; shift 2
  for _ in $(seq $((t * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  fail "timed out after ${t}s waiting for: $what"
}

# DHCP with a real client: one exchange (3 DISCOVERs, 1 s apart); "lease <ip>" or "NO LEASE".
cat >"$work/udhcpc.sh" <<'S'
#!/bin/sh
[ "$1" = bound ] && echo "lease $ip from $serverid"
exit 0
S
chmod 755 "$work/udhcpc.sh"
dhcp() {
  ip netns exec "$NS_CLI" busybox udhcpc -i eth0 -f -q -n -t 3 -T 1 -s "$work/udhcpc.sh" 2>/dev/null | grep lease ||
    echo "NO LEASE"
}
client_mac() { ip -n "$NS_CLI" link set eth0 down; ip -n "$NS_CLI" link set eth0 address "$1"; ip -n "$NS_CLI" link set eth0 up; }
expect_dhcp() { # open|closed, why
  local got mac
  mac=$(ip -n "$NS_CLI" -br link show eth0 | awk '{print $3}')
  got=$(dhcp)
  case "$1:$got" in
    open:lease*) ok "DHCP open for $mac ($2): $got" ;;
    closed:"NO LEASE") ok "DHCP closed for $mac ($2): no lease after 3 DISCOVERs" ;;
    *) fail "DHCP for $mac should be $1 ($2), got: $got" ;;
  esac
}
guard_error() { # since: the guard unit's error message
  ct journalctl --no-pager -o cat --since "$1" -u ironguard-guard.service | grep -m1 'ironguard-agent: ' ||
    echo "(no error in the journal)"
}
verdict() { ct ironguardctl chains | sed -n 's/^verdict: //p'; }
expect_verdict() { # PREFIX, why
  local v; v=$(verdict)
  case "$v" in "$1"*) ok "ironguardctl chains: verdict $v ($2)" ;; *) fail "expected verdict $1 ($2), got: $v" ;; esac
}
has_table() { ct nft list table inet "$1" >/dev/null 2>&1; }
leader_allows() { ct ironguardctl chains --elements | grep -q '^verdict: LEADER' && ct ironguardctl chains --elements | grep -qi "$MAC_OK"; }
main_pid() { prop ironguard-agent.service MainPID; }

# The container's systemd manages the cgroups below the one systemd-nspawn runs in (--keep-unit, no systemd on the
# host to give it a scope of its own): two checks booted at once from one cgroup shared that subtree, and one
# container's systemd stopping a unit removed the other's cgroup of the same unit (its restart failed: "Failed to
# kill control group ... Input/output error", status=219/CGROUP). So each check moves into a cgroup of its own, under
# its current one in every cgroup-v1 hierarchy that takes it (cpuset is skipped: a new group there has no CPUs), and
# in the cgroup-v2 hierarchy too: on a hybrid host (v1 controllers, v2 mounted at /sys/fs/cgroup/unified) the
# container's systemd keeps its units' cgroups in both, and systemd 257 starts a unit's processes straight into the
# v2 one (clone into a cgroup). Sharing that subtree, the other root's systemd removed system.slice/ironguard-agent.service
# under Debian 13's, whose ExecStopPost= then failed: "Failed to spawn executor: No such file or directory" (O31).
own_cgroups() {
  local line ctrl path dir groups v2
  v2=$(findmnt -n -t cgroup2 -o TARGET 2>/dev/null | head -n 1 || true)
  # Read whole first: the file changes as this shell moves.
  groups=$(cat /proc/self/cgroup)
  while IFS= read -r line; do
    ctrl=${line#*:}; path=${ctrl#*:}; ctrl=${ctrl%%:*}
    case "$ctrl" in *cpuset*) continue ;; esac
    if [ -z "$ctrl" ]; then
      [ -n "$v2" ] || continue
      dir=$v2${path%/}/$MACHINE
    else
      dir=/sys/fs/cgroup/${ctrl#name=}${path%/}/$MACHINE
    fi
    [ -d "$(dirname "$dir")" ] || continue
    { mkdir -p "$dir" && echo $$ >"$dir/cgroup.procs"; } 2>/dev/null || rmdir "$dir" 2>/dev/null || true
  done <<<"$groups"
}
# Back to the parent groups; the check's own are removed, with what the container's systemd left in them.
leave_cgroups() {
  local g
  while IFS= read -r g; do
    { echo $$ >"$(dirname "$g")/cgroup.procs"; } 2>/dev/null || true
    find "$g" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done < <(find /sys/fs/cgroup/ -mindepth 2 -maxdepth 8 -type d -name "$MACHINE" 2>/dev/null)
}

# The container gets a private network of its own (systemd-nspawn --private-network, so a reboot starts from an
# empty kernel state: the guard must come from the boot) with one extra veth pair: pxe0 inside, the other end moved
# into the client's namespace as eth0. (Not --network-namespace-path with a namespace of ours: systemd-nspawn 252
# then mounts a sysfs that shows the host's interfaces, so the agent finds no /sys/class/net/pxe0.)
boot() { # log name
  ip netns del "$NS_CLI" 2>/dev/null || true
  ip netns add "$NS_CLI"
  ip -n "$NS_CLI" link set lo up
  rm -rf "/run/systemd/nspawn/propagate/$MACHINE"
  # --register=no: no machined on this host (PID 1 need not be systemd); --keep-unit: no scope unit either.
  systemd-nspawn --quiet -D "$root" -M "$MACHINE" --boot --register=no --keep-unit --private-network \
    --network-veth-extra="$HOST_IF:pxe0" --console=read-only >"$work/$1.log" 2>&1 &
  nspawn_pid=$!
  ln -sf "$1.log" "$work/boot.log"
  wait_for 10 "systemd-nspawn to create the veth pair ($HOST_IF)" ip link show "$HOST_IF"
  ip link set "$HOST_IF" netns "$NS_CLI"
  ip -n "$NS_CLI" link set "$HOST_IF" name eth0
  ip -n "$NS_CLI" link set eth0 address "$MAC_OK"
  ip -n "$NS_CLI" link set eth0 up
  pid1=""
  for _ in $(seq 100); do
    pid1=$(ps -o pid= --ppid "$nspawn_pid" | tr -d ' ' | head -n 1 || true)
    [ -n "$pid1" ] && [ "$(cat "/proc/$pid1/comm" 2>/dev/null)" = systemd ] && break
    kill -0 "$nspawn_pid" 2>/dev/null || fail "systemd-nspawn exited while booting $root"
    pid1=""
    sleep 0.1
  done
  [ -n "$pid1" ] || fail "no systemd in the container 10 s after systemd-nspawn started"
  wait_for 30 "systemd's private socket in the container" nsenter -t "$pid1" -a test -S /run/systemd/private
  local state
  state=$(timeout 90 nsenter -t "$pid1" -a systemctl is-system-running --wait 2>/dev/null || true)
  case "$state" in
    running) ok "the container booted (systemd $(ct systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p'), PID 1 is pid $pid1 here): $state" ;;
    degraded) ok "the container booted: degraded, failed units: $(ct systemctl --failed --plain --no-legend | awk '{print $1}' | xargs)" ;;
    *) fail "the container did not finish booting within 90 s (state: ${state:-none})" ;;
  esac
}

shutdown_container() { # poweroff|reboot
  ct systemctl "$1" --no-block
  for _ in $(seq 300); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$nspawn_pid" 2>/dev/null && fail "the container did not $1 within 30 s"
  local rc=0
  wait "$nspawn_pid" || rc=$?
  nspawn_pid="" pid1=""
  # systemd-nspawn exits with 133 when the container asked for a reboot, 0 after a poweroff.
  case "$1:$rc" in poweroff:0|reboot:133) ;; *) fail "systemd-nspawn exited with $rc after $1" ;; esac
}

say "test configuration in $root/etc: control plane (embedded store, loopback, insecure, unknown MACs denied), agent on pxe0, dnsmasq.service"
cat >"$root/etc/ironguard/controlplane.toml" <<'T'
# scripts/systemd-check.sh: embedded store on loopback, plaintext gRPC (a test on one host only).
[grpc]
insecure = true
[filter]
unknown_mac_policy = "deny"
T
cat >"$root/etc/ironguard/agent.toml" <<'T'
# scripts/systemd-check.sh: the control plane on loopback, DHCP filtered on pxe0.
[agent]
id = "pxe-check"
network = "provisioning"
[controlplane]
endpoints = ["http://127.0.0.1:9100"]
insecure = true
[dataplane]
interfaces = ["pxe0"]
T
# Services of the install step's packages that this check does not test (the tests start etcd and MariaDB of their
# own in namespaces; ISC dhcpd has no configuration here): masked, so that the container's two boots do not start
# them beside the units under test.
for unit in mariadb.service etcd.service isc-dhcp-server.service isc-dhcp-server6.service; do
  ln -sfn /dev/null "$root/etc/systemd/system/$unit"
done
cat >"$root/etc/systemd/system/dnsmasq.service" <<'U'
# scripts/systemd-check.sh: the PXE host's DHCP server (dnsmasq-base), under the name Debian's dnsmasq package uses,
# so that the guard's RequiredBy=dnsmasq.service and the agent's Before=dnsmasq.service apply to it.
[Unit]
Description=dnsmasq on pxe0 (ironguard systemd check)
Wants=pxe-net.service
After=pxe-net.service
[Service]
ExecStart=/usr/sbin/dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 --user=root --interface=pxe0 \
  --dhcp-range=10.78.0.100,10.78.0.200,255.255.255.0,1h --no-ping --dhcp-authoritative \
  --dhcp-leasefile=/run/dnsmasq-check.leases --log-dhcp
[Install]
WantedBy=multi-user.target
U
cat >"$root/etc/systemd/system/pxe-net.service" <<'U'
# scripts/systemd-check.sh: the provisioning network's address, configured where network configuration belongs:
# after network-pre.target, which the guard orders itself before.
[Unit]
Description=pxe0 10.78.0.1/24 (ironguard systemd check)
After=network-pre.target
Before=network.target dnsmasq.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/ip addr replace 10.78.0.1/24 dev pxe0
ExecStart=/usr/sbin/ip link set pxe0 up
[Install]
WantedBy=multi-user.target
U
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
for u in dnsmasq pxe-net; do
  ln -sf "/etc/systemd/system/$u.service" "$root/etc/systemd/system/multi-user.target.wants/$u.service"
done

say "1. boot the root with systemd-nspawn (the packages' postinst enabled the units)"
own_cgroups
boot boot1
for u in ironguard-guard ironguard-agent ironguard-controlplane; do
  [ "$(ct systemctl is-enabled "$u.service")" = enabled ] || fail "$u.service is not enabled after installing the package"
  owner=$(ct dpkg-query -S "/usr/lib/systemd/system/$u.service" | cut -d: -f1)
  # (Debian 12's systemd names /lib/systemd/system first; /lib is /usr/lib.)
  [ "$(ct readlink -f "$(prop "$u.service" FragmentPath)")" = "/usr/lib/systemd/system/$u.service" ] ||
    fail "$u.service is loaded from $(prop "$u.service" FragmentPath), not the packaged unit"
  wait_for 20 "$u.service active after boot" sh -c "[ \"\$(nsenter -t $pid1 -a systemctl is-active $u.service)\" = active ]"
  ok "$u.service: enabled, active after boot, /usr/lib/systemd/system/$u.service from package $owner"
done
[ -L "$root/etc/systemd/system/dnsmasq.service.requires/ironguard-guard.service" ] ||
  fail "enabling the guard did not make dnsmasq.service require it (RequiredBy=)"
# Boot order, in ms since the container's systemd started (monotonic timestamps of the units).
since_boot() { echo $((($(prop "$1" "$2") - $(ct systemctl show -P UserspaceTimestampMonotonic)) / 1000)); }
guard_up=$(since_boot ironguard-guard.service ActiveEnterTimestampMonotonic)
agent_start=$(since_boot ironguard-agent.service InactiveExitTimestampMonotonic)
dnsmasq_start=$(since_boot dnsmasq.service InactiveExitTimestampMonotonic)
[ "$guard_up" -ge 0 ] && [ "$guard_up" -le "$agent_start" ] && [ "$guard_up" -le "$dnsmasq_start" ] ||
  fail "boot order: guard installed at ${guard_up} ms, agent started at ${agent_start} ms, dnsmasq at ${dnsmasq_start} ms"
ok "boot order: guard installed at ${guard_up} ms, before the agent started (${agent_start} ms) and dnsmasq (${dnsmasq_start} ms); dnsmasq.service requires the guard"
# The guard's private /dev is made in /tmp by Debian 12's systemd, which systemd-tmpfiles-setup.service empties at
# boot: the guard must start after it (O32: at once, the guard failed with 226/NAMESPACE now and then).
guard_start=$(since_boot ironguard-guard.service InactiveExitTimestampMonotonic)
tmpfiles_done=$(since_boot systemd-tmpfiles-setup.service ActiveEnterTimestampMonotonic)
[ "$tmpfiles_done" -ge 0 ] && [ "$tmpfiles_done" -le "$guard_start" ] ||
  fail "boot order: systemd-tmpfiles-setup.service done at ${tmpfiles_done} ms, the guard started at ${guard_start} ms"
ok "boot order: systemd-tmpfiles-setup.service (which empties /tmp) done at ${tmpfiles_done} ms, before the guard started (${guard_start} ms)"

say "2. systemctl start ironguard-guard ironguard-controlplane ironguard-agent (after stopping the daemons)"
ct systemctl stop ironguard-agent.service ironguard-controlplane.service
has_table ironguard && fail "the agent's table inet ironguard is still in the kernel after systemctl stop"
ct systemctl start ironguard-guard.service ironguard-controlplane.service ironguard-agent.service
# Type=notify: READY=1 only once the owned table exists, so it must be there the moment start returns.
has_table ironguard || fail "systemctl start ironguard-agent returned, but table inet ironguard is not in the kernel (READY=1 too early?)"
state=$(prop ironguard-agent.service ActiveState)/$(prop ironguard-agent.service SubState)
[ "$state" = active/running ] || fail "ironguard-agent.service is $state right after systemctl start returned"
has_table ironguard_guard || fail "the guard table inet ironguard_guard is missing"
ok "start returned: ironguard-agent.service active/running, table inet ironguard in the kernel (Type=notify), guard present"
for i in 1 2; do # readiness once more, on a restart
  ct systemctl restart ironguard-agent.service
  has_table ironguard || fail "restart $i: systemctl restart returned before table inet ironguard existed"
done
ok "twice more (systemctl restart): the table exists when the command returns"

say "3. privileges of the daemons"
pid=$(main_pid)
[ "$pid" -gt 0 ] || fail "ironguard-agent.service has no MainPID"
status=$(ct cat "/proc/$pid/status")
uid=$(ct id -u ironguard)
capline() { echo "$status" | sed -n "s/^$1:\t*//p"; }
for c in CapEff CapPrm CapBnd CapAmb; do
  [ "$(capline "$c")" = 0000000000001000 ] ||
    fail "agent (pid $pid) $c is $(capline "$c"), expected 0000000000001000 (CAP_NET_ADMIN only)"
done
[ "$(capline CapInh)" = 0000000000001000 ] || [ "$(capline CapInh)" = 0000000000000000 ] || fail "agent CapInh is $(capline CapInh)"
read -r ruid euid suid fsuid <<<"$(capline Uid)"
[ "$ruid $euid $suid $fsuid" = "$uid $uid $uid $uid" ] || fail "agent runs as uids $ruid/$euid/$suid/$fsuid, not ironguard ($uid)"
[ "$(prop ironguard-agent.service User)" = ironguard ] || fail "ironguard-agent.service has User=$(prop ironguard-agent.service User)"
[ "$(capline NoNewPrivs)" = 1 ] || fail "agent NoNewPrivs is $(capline NoNewPrivs)"
ok "agent pid $pid: User=ironguard (uid $uid), CapEff=CapPrm=CapBnd=CapAmb=0000000000001000 (CAP_NET_ADMIN only), NoNewPrivs=1, Seccomp=$(capline Seccomp)"
cpid=$(prop ironguard-controlplane.service MainPID)
cstatus=$(ct cat "/proc/$cpid/status")
for c in CapEff CapPrm CapBnd CapAmb; do
  v=$(echo "$cstatus" | sed -n "s/^$c:\t*//p")
  [ "$v" = 0000000000000000 ] || fail "control plane (pid $cpid) $c is $v, expected no capability"
done
[ "$(echo "$cstatus" | sed -n 's/^Uid:\t*\([0-9]*\).*/\1/p')" = "$uid" ] || fail "the control plane does not run as ironguard"
ok "control plane pid $cpid: User=ironguard, no capability at all (CapEff=CapPrm=CapBnd=CapAmb=0)"

say "4. DHCP with real traffic: $MAC_OK allowed (ironguardctl filters allow), $MAC_OTHER not"
ct ironguardctl filters allow "$MAC_OK" | sed 's/^/   /'
wait_for 20 "the agent leads with $MAC_OK in its allow set" leader_allows
expect_verdict LEADER "the only agent, embedded store"
expect_dhcp open "allowed, agent leading"
client_mac "$MAC_OTHER"
expect_dhcp closed "unknown MACs are denied"
client_mac "$MAC_OK"

if [ -n "$debdir" ]; then
  say "4b. the packages installed again under the running systemd: the maintainer scripts' upgrade path"
  pid=$(main_pid)
  cpid=$(prop ironguard-controlplane.service MainPID)
  ct sh -c "DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold $debdir/*.deb" >"$work/dpkg.log" 2>&1 ||
    fail "dpkg -i $debdir/*.deb failed: $(tail -n 20 "$work/dpkg.log")"
  [ "$(main_pid)" != "$pid" ] || fail "the upgrade did not restart the running agent (MainPID $pid)"
  [ "$(prop ironguard-controlplane.service MainPID)" != "$cpid" ] || fail "the upgrade did not restart the control plane"
  [ "$(ct systemctl is-active ironguard-guard.service)/$(prop ironguard-guard.service Result)" = active/success ] ||
    fail "ironguard-guard.service is not active after the upgrade"
  grep -q '^id = "pxe-check"' "$root/etc/ironguard/agent.toml" || fail "the upgrade replaced the administrator's agent.toml"
  ok "dpkg -i: agent restarted (pid $pid -> $(main_pid)), control plane restarted, guard active, /etc/ironguard kept"
  wait_for 20 "the agent leads after the upgrade" leader_allows
  expect_dhcp open "after the upgrade"
fi

say "5. the watchdog: SIGSTOP the agent (WatchdogSec=10s, then SIGABRT, RestartSec=1s)"
pid=$(main_pid)
restarts=$(prop ironguard-agent.service NRestarts)
since=$(ct date '+%Y-%m-%d %H:%M:%S')
ct kill -STOP "$pid"
t_stop=$(date +%s.%N)
sleep 2.5 # the local backend's kernel lease (2 s) ends: a frozen leader stops serving by itself
[ "$(ct sed -n 's/^State:\t*\(.\).*/\1/p' "/proc/$pid/status")" = T ] || fail "agent pid $pid is not stopped"
expect_verdict FENCED "frozen leader: its kernel lease expired"
expect_dhcp closed "agent frozen (pid $pid stopped)"
wait_for 30 "systemd to restart the frozen agent" sh -c \
  "p=\$(nsenter -t $pid1 -a systemctl show -P MainPID ironguard-agent.service); [ \"\$p\" -gt 0 ] && [ \"\$p\" != $pid ]"
t_new=$(date +%s.%N)
new_pid=$(main_pid)
[ "$(prop ironguard-agent.service NRestarts)" -gt "$restarts" ] || fail "NRestarts did not increase ($restarts)"
journal=$(ct journalctl --no-pager -u ironguard-agent.service --since "$since" -o cat)
echo "$journal" | grep -q "Watchdog timeout" || fail "no \"Watchdog timeout\" in the agent's journal: $(echo "$journal" | tail -n 5)"
echo "$journal" | grep -E "Watchdog timeout|Killing process|Main process exited|Scheduled restart" | sed 's/^/   journal: /'
ok "frozen agent $pid replaced by $new_pid $(awk "BEGIN { printf \"%.1f\", $t_new - $t_stop }") s after SIGSTOP; NRestarts $restarts -> $(prop ironguard-agent.service NRestarts)"
wait_for 20 "the new agent leads with $MAC_OK allowed" leader_allows
expect_dhcp open "the restarted agent leads again"

say "5b. dnsmasq-hostsdir alone: SIGKILL to the leader, then ExecStopPost= closes every file"
HOSTSDIR=/var/lib/ironguard-check/hostsdir
hostsdir_file() { cat "$root$HOSTSDIR/$1" 2>/dev/null || echo "(none)"; }
ct systemctl stop ironguard-agent.service
ct install -d -o ironguard -g ironguard -m 0755 "$HOSTSDIR"
cp "$root/etc/ironguard/agent.toml" "$work/agent.toml.nftables"
cat >"$root/etc/ironguard/agent.toml" <<T
# scripts/systemd-check.sh, 5b: dnsmasq's host directory is the only filter (no kernel guard).
[agent]
id = "pxe-check"
network = "provisioning"
[controlplane]
endpoints = ["http://127.0.0.1:9100"]
insecure = true
[dataplane]
interfaces = ["pxe0"]
backends = ["dnsmasq-hostsdir"]
[dataplane.hostsdir]
dir = "$HOSTSDIR"
T
# The agent writes the directory (docs/operations.md's drop-in); its restart is held off, so that what systemd did
# after the kill is what is seen.
mkdir -p "$root/etc/systemd/system/ironguard-agent.service.d" "$root/etc/systemd/system/dnsmasq.service.d"
cat >"$root/etc/systemd/system/ironguard-agent.service.d/hostsdir.conf" <<U
[Service]
ReadWritePaths=$HOSTSDIR
RestartSec=120s
U
cat >"$root/etc/systemd/system/dnsmasq.service.d/hostsdir.conf" <<U
[Service]
ExecStart=
ExecStart=/usr/sbin/dnsmasq --keep-in-foreground --conf-file=/dev/null --port=0 --user=root --interface=pxe0 \\
  --dhcp-range=10.78.0.100,10.78.0.200,255.255.255.0,1h --no-ping --dhcp-authoritative \\
  --dhcp-leasefile=/run/dnsmasq-check.leases --log-dhcp --dhcp-hostsdir=$HOSTSDIR
U
ct systemctl daemon-reload
# No kernel guard: the host directory alone decides. (The agent's ExecStartPre= closes the files before it starts.)
ct nft delete table inet ironguard_guard
ct systemctl restart dnsmasq.service
ct systemctl start ironguard-agent.service
has_table ironguard_guard && fail "an nftables guard although the configuration has no nftables backend"
wait_for 30 "the hostsdir leader serves $MAC_OK" sh -c "[ \"\$(cat $root$HOSTSDIR/$MAC_OK 2>/dev/null)\" = $MAC_OK ]"
expect_dhcp open "dnsmasq-hostsdir leader, $MAC_OK served by its file"
pid=$(main_pid)
since=$(ct date '+%Y-%m-%d %H:%M:%S')
# SIGKILL to the main process, as a crash or the OOM killer sends it. (`systemctl kill -s KILL` was used first:
# Debian 12's systemd 252 on a busy machine once refused it, "Failed to send signal SIGKILL to auxiliary processes:
# Input/output error", after the agent had been killed.)
ct kill -KILL "$pid"
wait_for 30 "ironguard-agent.service waiting to restart after the kill" sh -c \
  "[ \"\$(nsenter -t $pid1 -a systemctl show -P SubState ironguard-agent.service)\" = auto-restart ]"
[ "$(main_pid)" = 0 ] || fail "an agent runs (pid $(main_pid)) although its restart is held off"
ct kill -0 "$pid" 2>/dev/null && fail "the killed agent (pid $pid) still runs"
[ "$(hostsdir_file "$MAC_OK")" = "$MAC_OK,ignore" ] ||
  fail "after SIGKILL and ExecStopPost= the file of $MAC_OK says $(hostsdir_file "$MAC_OK"), not ignore"
[ "$(hostsdir_file unknown_hosts_filter)" = "*:*:*:*:*:*,ignore" ] || fail "unknown_hosts_filter is not closed after the kill"
# The leader's file was rewritten by ExecStopPost= (no agent ran after the kill): "(1 files written)".
closed=$(ct journalctl --no-pager -o cat -u ironguard-agent.service --since "$since" |
  grep '^hostsdir closed' | grep -m1 -E '\([1-9][0-9]* files written\)' || true)
[ -n "$closed" ] || fail "no \"hostsdir closed\" line from ExecStopPost= rewriting a file in the journal after the kill"
ok "ExecStopPost= after SIGKILL of agent pid $pid, no agent since: $closed"
expect_dhcp closed "leader killed with SIGKILL, no agent running: the files say ignore"
# Back to the nftables configuration of the other steps.
rm -f "$root/etc/systemd/system/ironguard-agent.service.d/hostsdir.conf" "$root/etc/systemd/system/dnsmasq.service.d/hostsdir.conf"
cp "$work/agent.toml.nftables" "$root/etc/ironguard/agent.toml"
ct systemctl daemon-reload
ct systemctl restart ironguard-guard.service dnsmasq.service
has_table ironguard_guard || fail "the guard is not back with the nftables configuration"
ct systemctl restart ironguard-agent.service
wait_for 20 "the nftables leader again" leader_allows
expect_dhcp open "nftables configuration again"

say "6. systemctl stop ironguard-agent; systemctl restart ironguard-guard; reboot"
ct systemctl stop ironguard-agent.service
has_table ironguard && fail "table inet ironguard still exists after systemctl stop ironguard-agent"
has_table ironguard_guard || fail "the guard table is gone after systemctl stop ironguard-agent"
expect_verdict CLOSED "agent stopped"
expect_dhcp closed "agent stopped, guard present"
ct systemctl restart ironguard-guard.service
[ "$(ct systemctl is-active ironguard-guard.service)" = active ] || fail "ironguard-guard.service is not active after restart"
has_table ironguard_guard || fail "the guard table is gone after systemctl restart ironguard-guard"
wait_for 10 "dnsmasq restarted with the guard (Requires=)" sh -c "[ \"\$(nsenter -t $pid1 -a systemctl is-active dnsmasq.service)\" = active ]"
expect_dhcp closed "guard restarted, no agent, dnsmasq running"
ct systemctl start ironguard-agent.service
wait_for 20 "the agent leads again" leader_allows
expect_dhcp open "agent started again"
# `systemctl reload|restart ironguard-guard` while the agent runs (and nftables.service's restart or reload, through
# PartOf=/ReloadPropagatedFrom=): the agent holds the guard; `guard install` finds it as configured and succeeds
# without touching it, so the unit stays active and dnsmasq.service (which requires it) keeps running.
since=$(ct date '+%Y-%m-%d %H:%M:%S')
ct systemctl reload ironguard-guard.service 2>/dev/null ||
  fail "systemctl reload ironguard-guard fails while the agent runs: $(guard_error "$since")"
has_table ironguard_guard || fail "the guard table is gone after reloading the guard unit under a running agent"
ok "systemctl reload ironguard-guard under a running agent: done (the held guard is as configured: nothing to do)"
expect_dhcp open "guard unit reloaded under a running agent"
sleep 1 # a new second for journalctl --since
since=$(ct date '+%Y-%m-%d %H:%M:%S')
ct systemctl restart ironguard-guard.service 2>/dev/null ||
  fail "systemctl restart ironguard-guard fails while the agent runs: $(guard_error "$since")"
has_table ironguard_guard || fail "the guard table is gone after restarting the guard unit under a running agent"
wait_for 20 "dnsmasq active again after the guard's restart (Requires=)" sh -c "[ \"\$(nsenter -t $pid1 -a systemctl is-active dnsmasq.service)\" = active ]"
wait_for 20 "the agent leads after the guard's restart" leader_allows
expect_dhcp open "guard unit restarted under a running agent"

ct systemctl disable ironguard-agent.service 2>/dev/null
say "   reboot, with the agent disabled: only the guard and dnsmasq start"
shutdown_container reboot
boot boot2
[ "$(ct systemctl is-active ironguard-guard.service)" = active ] || fail "ironguard-guard.service is not active after the reboot"
[ "$(ct systemctl is-active ironguard-agent.service)" = inactive ] || fail "the disabled agent is running after the reboot"
wait_for 20 "dnsmasq active after the reboot" sh -c "[ \"\$(nsenter -t $pid1 -a systemctl is-active dnsmasq.service)\" = active ]"
has_table ironguard_guard || fail "no guard table after the reboot (ironguard-guard.service at boot)"
has_table ironguard && fail "table inet ironguard exists although no agent runs"
guard_up=$(since_boot ironguard-guard.service ActiveEnterTimestampMonotonic)
dnsmasq_start=$(since_boot dnsmasq.service InactiveExitTimestampMonotonic)
[ "$guard_up" -le "$dnsmasq_start" ] || fail "after the reboot dnsmasq started before the guard was installed"
ok "after the reboot: the guard was installed at boot (${guard_up} ms, before dnsmasq at ${dnsmasq_start} ms); no agent"
expect_verdict CLOSED "after the reboot, agent not started"
expect_dhcp closed "after the reboot: dnsmasq serving, guard only"
ct systemctl enable --now ironguard-agent.service 2>/dev/null
has_table ironguard || fail "systemctl enable --now returned before table inet ironguard existed"
wait_for 20 "the agent leads after the reboot (the control plane kept the allow)" leader_allows
expect_dhcp open "agent started after the reboot; the allow survived in the control plane's store"

say "7. apt-get remove ironguard-agent (DHCP stays closed), then purge and delete the guard table (DHCP unfiltered)"
ct env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ironguard-agent >"$work/remove.log" 2>&1 ||
  fail "apt-get remove ironguard-agent failed: $(tail -n 20 "$work/remove.log")"
has_table ironguard && fail "table inet ironguard still exists after removing the package"
has_table ironguard_guard || fail "removing the package removed the guard table (DHCP would be unfiltered)"
expect_verdict CLOSED "package removed"
expect_dhcp closed "ironguard-agent removed, dnsmasq running"
ct env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ironguard-agent >>"$work/remove.log" 2>&1 ||
  fail "apt-get purge ironguard-agent failed: $(tail -n 20 "$work/remove.log")"
[ ! -e "$root/etc/systemd/system/dnsmasq.service.requires/ironguard-guard.service" ] ||
  fail "purging ironguard-agent left dnsmasq.service requiring the guard unit"
ct nft delete table inet ironguard_guard
client_mac "$MAC_OTHER"
expect_dhcp open "purged and the guard table deleted: no filter at all"
client_mac "$MAC_OK"

say "8. power off"
shutdown_container poweroff
say "passed: every property held"
echo "   ($(($(date +%s) - T0)) s)"
