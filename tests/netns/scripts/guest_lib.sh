# Shared by the scripts that run inside the qemu guest (ipset_guest.sh, egress_guest.sh, seen_guest.sh, each a part of
# kernel_guest.sh); sourced, not run.
# load_modules M...: the guest kernel's modules (from the cached Debian kernel in $GUEST_KERNEL).
load_modules() {
  for m in "$@"; do
    modprobe -d "${GUEST_KERNEL:?}" "$m" || echo "RESULT modprobe-$m FAIL"
  done
}
# result NAME PASS|FAIL [DETAIL]: one line for the test (tests/netns/src/guest.rs), with the guest's uptime at the
# end (read without starting a process: under the emulated CPU a process start is expensive).
result() {
  read -r up _ </proc/uptime
  echo "RESULT $1 $2 ${3:-}(at ${up} s)"
}
# check NAME yes|no COMMAND...: the command succeeding means "yes".
check() {
  name=$1 want=$2
  shift 2
  if "$@" >/dev/null 2>&1; then got=yes; else got=no; fi
  if [ "$got" = "$want" ]; then result "$name" PASS; else result "$name" FAIL "want $want, got $got"; fi
}
# lease NS MAC: one DHCP exchange from NS's eth0 with MAC (3 DISCOVERs, 1 s apart). Few processes: under qemu's
# emulated CPU every process start costs a good part of a second.
lease() {
  printf 'link set eth0 down\nlink set eth0 address %s\nlink set eth0 up\n' "$2" | ip -n "$1" -batch -
  out=$(ip netns exec "$1" busybox udhcpc -i eth0 -n -q -f -t 3 -T 1 -A 1 -s /bin/true 2>&1)
  case $out in *obtained*) return 0 ;; *) return 1 ;; esac
}
# check_eventually NAME SECS COMMAND...: like `check NAME yes COMMAND...` for what the system does by itself (a
# delta applied, a repair, a thawed holder refreshing its lease): COMMAND is retried until it succeeds or SECS
# seconds have passed. A deadline for something stuck (the emulated CPU is slow, and slower beside other work), not
# a measurement.
check_eventually() {
  name=$1 deadline=$(($(date +%s) + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then result "$name" FAIL "not within the deadline"; return; fi
    sleep 0.2
  done
  result "$name" PASS
}
wait_ready() { i=0; while [ ! -s "$1" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done; [ -s "$1" ]; }
# hold ARGS...: ironguard-agent hold in the PXE namespace with the caller's $HOLD_ARGS before ARGS; sets HOLD_PID
# once its table is in place.
hold() {
  rm -f /tmp/ready
  # shellcheck disable=SC2086
  ip netns exec pxe "$BIN/ironguard-agent" hold $HOLD_ARGS --ready-file /tmp/ready "$@" >>/tmp/hold.log 2>&1 &
  HOLD_PID=$!
  wait_ready /tmp/ready || result "hold-ready" FAIL "$(tail -3 /tmp/hold.log)"
}
# stop NAME PID: SIGTERM, then at most 120 s for PID to exit (polled with the shell's own kill -0, no process start);
# one that does not is a failed check named NAME-exits, and is killed, so that the guest never waits forever.
stop() {
  kill -TERM "$2" 2>/dev/null
  i=0
  while kill -0 "$2" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.2; i=$((i + 1)); done
  if kill -0 "$2" 2>/dev/null; then
    result "$1-exits" FAIL "still running 120 s after SIGTERM"
    kill -KILL "$2" 2>/dev/null
  fi
  wait "$2" 2>/dev/null
}
stop_hold() { stop hold "$HOLD_PID"; }
# start_controlplane: the control plane in the PXE namespace (embedded store in /tmp/cp, unknown MACs denied), on
# 127.0.0.1:9100; sets CP.
start_controlplane() {
  mkdir -p /tmp/cp
  ip netns exec pxe "$BIN/ironguard-controlplane" --grpc-insecure --grpc-listen 127.0.0.1:9100 \
    --admin-listen 127.0.0.1:9101 --data-dir /tmp/cp --unknown-mac-policy deny >/tmp/cp.log 2>&1 &
  CP=$!
}
ctl() { ip netns exec pxe "$BIN/ironguardctl" --controlplane http://127.0.0.1:9100 "$@"; }
# write_agent_toml RECONCILE_SECS DATAPLANE_LINES: /tmp/agent.toml for an agent of that control plane (metrics on
# 127.0.0.1:9181), with the given read-back period and [dataplane] section. The local DHCP health is checked at the
# product's default period (1 s): at 200 ms the checks cost the emulated CPU a sixth more (two 6.1 guests side by
# side: 99 CPU-s in 101 s, 82 in 94 s at 1 s) and showed nothing more.
write_agent_toml() {
  cat >/tmp/agent.toml <<TOML
[agent]
id = "agent-1"
network = "test"
[controlplane]
insecure = true
endpoints = ["http://127.0.0.1:9100"]
[dhcp_health]
interval_ms = 1000
[reconcile]
interval_secs = $1
[admin]
listen = "127.0.0.1:9181"
[dataplane]
$2
TOML
}
