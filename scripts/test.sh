#!/usr/bin/env bash
# The whole test suite, as CI runs it (as root): installs what it needs, builds with clippy's lints, runs unit,
# integration and privileged end-to-end tests in one pool (cargo-nextest: network namespaces, real nftables,
# dnsmasq, udhcpc, ISC dhcpd, etcd 3.4 and 3.5, a real Ironic 39), the tests that boot Debian 12's stock kernel (6.1)
# and Debian 13's (6.12) under qemu, benchmark smoke runs (dataplane, boot storm), and the README's two commands in a
# brand-new Debian 12 root and a brand-new Debian 13 root (scripts/fresh-root.sh), which proves the install step is
# complete on both. The stages run in phases (below); the table at the end gives each stage's start, end, duration
# and the CPU time it used (also in target/ci/stages.txt).
#   --build-only   install and build only (what the fresh roots run for this command)
#   IRONGUARD_SKIP_FRESH_ROOT=1 skips the fresh roots and runs the qemu guests in the test pool (a quick local run;
#                              not under CI=true)
#   IRONGUARD_FAULT_ROUNDS     rounds per fault in the fault matrix (1 here; `ironguard-bench ha` repeats them)
#   IRONGUARD_DEBIAN13=0       leaves Debian 13 out: no Debian 13 root, the qemu tests in 6.1 only (a quicker local
#                              run; not under CI=true)
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
CI_DIR=$PWD/target/ci
STAGES=()   # "name|start|end|status|cpu"
now() { echo $(($(date +%s) - T0)); }
# The CPU time of each stage. The foreground stages: from the cpuacct controller (cgroup v1, as on the CI
# machines), the group `main` of this run (empty without the controller). A background stage leaves that group
# for the hierarchy's root (where it would be without this run's groups; a fresh root's systemd-nspawn container
# boots from there as before) and counts the CPU time of the processes it waited for (its shell's `times`: a
# daemon that outlives its parent is not counted). (A group per background stage was tried first; the 219/CGROUP
# failures of the run that tried it were two containers sharing one cgroup, T44, not the accounting.) busy_cs: the
# machine's busy CPU time so far, in hundredths of a second (/proc/stat).
ACCT_GROUP=
acct_ns() { [ -n "$ACCT_GROUP" ] && cat "$ACCT_GROUP/$1/cpuacct.usage" 2>/dev/null || echo ""; }
busy_cs() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
# Of which stolen: time the hypervisor gave this virtual machine's CPUs to others (/proc/stat's steal), which no
# stage's accounting sees and which makes the same work take longer.
steal_cs() { awk '$1 == "cpu" { print $9; exit }' /proc/stat; }
BUSY0=$(busy_cs) STEAL0=$(steal_cs)
stage() { echo "== $1 (at $(now) s)"; }
# Runs a stage in the foreground and records its time.
run_stage() {
  local name=$1 start rc=0 cpu0 cpu1 cpu=
  shift
  start=$(now)
  stage "$name"
  cpu0=$(acct_ns main)
  "$@" || rc=$?
  cpu1=$(acct_ns main)
  [ -z "$cpu0" ] || [ -z "$cpu1" ] || cpu=$(((cpu1 - cpu0) / 1000000000))
  STAGES+=("$name|$start|$(now)|$([ "$rc" = 0 ] && echo ok || echo "FAILED ($rc)")|$cpu")
  return "$rc"
}
# Starts a stage in the background; its output goes to target/ci/<id>.log and is printed when it is awaited.
declare -A BG_PID BG_NAME BG_START
bg_stage() {
  local id=$1 name=$2
  shift 2
  stage "$name: started in the background (target/ci/$id.log)"
  BG_NAME[$id]=$name
  BG_START[$id]=$(now)
  # In a session of its own, so that a run that stops early ends the whole stage (cargo, nextest, the test, its
  # qemu guest), not only its first process; in the background stages' cgroup (side_stage).
  # The stage writes its exit status in target/ci/<id>.rc, its CPU time in <id>.cpu, then the second it ended in
  # target/ci/<id>.end: the table shows when it finished, not when it was awaited, and a stage that needs another
  # one waits for its .end.
  rm -f "$CI_DIR/$id.end" "$CI_DIR/$id.rc" "$CI_DIR/$id.cpu"
  T0=$T0 END_FILE="$CI_DIR/$id.end" RC_FILE="$CI_DIR/$id.rc" CPU_FILE="$CI_DIR/$id.cpu" SIDE_GROUP=${SIDE_GROUP:-} \
    STAGE_SHARES=${STAGE_SHARES:-} \
    ACCT_GROUP=${ACCT_GROUP:-} setsid -w bash -c \
    'side_stage "$0" $$; rc=0; "$@" || rc=$?; echo "$rc" >"$RC_FILE"
     times >"$CPU_FILE.times"
     awk '"'"'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] }
       printf "%d\n", t }'"'"' "$CPU_FILE.times" >"$CPU_FILE"
     echo $(($(date +%s) - T0)) >"$END_FILE"
     exit "$rc"' "$id" "$@" >"$CI_DIR/$id.log" 2>&1 &
  BG_PID[$id]=$!
}
# How the stages share the CPU. From the build to the end the run is CPU-bound on 2 cores, and most of its work costs
# CPU in proportion to its wall time (etcd, Ironic's conductors, the agents and the emulated guests tick while they
# wait): a stage slowed by another costs more in all. The stages that mostly wait on clocks (the qemu guests on DHCP
# timeouts, a fresh root's demo on Ironic and DHCP, its systemd check on boots and restarts: about 0.3-0.5 of a core
# each) must not be left for the end, where they ran on alone for 3-4 minutes with the CPU half idle; the compilers
# must not run beside the tests (two fresh roots' builds on the CPU the tests left idle still cost the tests 90
# CPU-seconds more, measured on 2026-12-07). So:
#   1. the build, beside the fresh roots' bootstraps (apt, dpkg and pip: the disk and the network as much as the CPU);
#   2. the fresh roots' builds, with the machine to themselves but for the qemu guests, which start now;
#   3. the tests, beside the guests and the rest of the fresh roots' runs (demo, packages, systemd check).
# The benchmark smoke runs (mostly waiting on DHCP) run in phase 2, beside the roots' builds.
# With the cgroup-v1 cpu controller (as on the CI machines) the tests run in the cgroup `main` of this run's, the
# background stages in `side`, each in a cgroup of its own: with the same weight, neither can take more than half
# of the machine from the other (the tests start dozens of processes; a guest is one). (`side` at twice the weight
# of `main` was tried on 2026-12-07: the tests, squeezed to a third of the machine while the guests ran, took 506 s
# instead of 360-430, the three-conductor site test 405 s, and two etcd tests failed on their timeouts, T46.) In
# `side` a fresh root has
# twice the weight of the guests: a root's demo runs one short step after another (Ironic's CLI, curl, DHCP) and
# needs little CPU but gets it late under load: with equal weights it took 367 s instead of 48 s, and the roots
# ended the run 77 s after the tests (2026-12-07); with the guests at half weight too, the guests ended after them.
SIDE_GROUP=
# side_stage ID PID: PID, the leader of background stage ID, and what it starts later, in the background stages'
# cgroup, and out of the foreground stages' cpuacct group.
side_stage() {
  [ -n "$SIDE_GROUP" ] && mkdir -p "$SIDE_GROUP/$1" 2>/dev/null && echo "$2" >"$SIDE_GROUP/$1/cgroup.procs" 2>/dev/null &&
    { [ -z "${STAGE_SHARES:-}" ] || echo "$STAGE_SHARES" >"$SIDE_GROUP/$1/cpu.shares" 2>/dev/null; }
  [ -n "$ACCT_GROUP" ] && echo "$2" >"$(dirname "$ACCT_GROUP")/cgroup.procs" 2>/dev/null
  return 0
}
export -f side_stage
cpu_groups_start() {
  local v1=/sys/fs/cgroup/cpu run
  run=$v1/ironguard-test-$$
  if [ -w "$v1/cgroup.procs" ] && mkdir -p "$run/main" "$run/side" 2>/dev/null &&
    echo $$ >"$run/main/cgroup.procs" 2>/dev/null && grep -q "ironguard-test-$$/main" /proc/$$/cgroup; then
    export SIDE_GROUP=$run/side
    stage "CPU shares: cpu cgroups under $run (the tests in main, the background stages in side)"
  else
    rmdir "$run/main" "$run/side" "$run" 2>/dev/null || true
    stage "CPU shares: no cgroup-v1 cpu controller to use; the stages share the CPU as the kernel shares it"
  fi
  local acct=/sys/fs/cgroup/cpuacct
  run=$acct/ironguard-test-$$
  if [ -w "$acct/cgroup.procs" ] && [ -f "$acct/cpuacct.usage" ] && mkdir -p "$run/main" 2>/dev/null &&
    echo $$ >"$run/main/cgroup.procs" 2>/dev/null; then
    export ACCT_GROUP=$run
  else
    rmdir "$run/main" "$run" 2>/dev/null || true
    stage "CPU time of the foreground stages: no cgroup-v1 cpuacct controller; the table shows none"
  fi
}
cpu_groups_end() {
  local run g
  if [ -n "$ACCT_GROUP" ]; then
    echo $$ >"$(dirname "$ACCT_GROUP")/cgroup.procs" 2>/dev/null || true
    rmdir "$ACCT_GROUP/main" "$ACCT_GROUP" 2>/dev/null || true
  fi
  [ -n "$SIDE_GROUP" ] || return 0
  run=$(dirname "$SIDE_GROUP")
  echo $$ >"$(dirname "$run")/cgroup.procs" 2>/dev/null || true
  for g in "$SIDE_GROUP"/*/; do rmdir "$g" 2>/dev/null || true; done
  rmdir "$SIDE_GROUP" "$run/main" "$run" 2>/dev/null || true
}
await_stage() {
  local id=$1 rc=0
  wait "${BG_PID[$id]}" || rc=$?
  echo "== ${BG_NAME[$id]}: output"
  cat "$CI_DIR/$id.log"
  local end
  end=$(cat "$CI_DIR/$id.end" 2>/dev/null || now)
  STAGES+=("${BG_NAME[$id]}|${BG_START[$id]}|$end|$([ "$rc" = 0 ] && echo ok || echo "FAILED ($rc)")|$(cat "$CI_DIR/$id.cpu" 2>/dev/null)")
  unset "BG_PID[$id]"
  return "$rc"
}
print_stages() {
  {
    echo
    echo "| stage | start (s) | end (s) | duration (s) | CPU (s) | result |"
    echo "|---|---:|---:|---:|---:|---|"
    local s name start end status cpu busy
    for s in "${STAGES[@]}"; do
      IFS='|' read -r name start end status cpu <<<"$s"
      echo "| $name | $start | $end | $((end - start)) | $cpu | $status |"
    done
    # The whole machine's busy time (every process, this run's and any other), and what its cores could give.
    busy=$((($(busy_cs) - BUSY0) / 100))
    echo "| **whole run** (the machine busy $busy of $(($(now) * $(nproc))) CPU-s, $((($(steal_cs) - STEAL0) / 100)) of them stolen by the hypervisor) | 0 | $(now) | $(now) | $busy | |"
  } | tee "$CI_DIR/stages.txt"
}
finish() {
  local rc=$?
  # The stages still running (an empty associative array cannot be counted under `set -u`; its keys can).
  local id ids=("${!BG_PID[@]}")
  # Every process of the stage's session: `timeout` (the guest's) puts its child in a process group of its own.
  for id in "${ids[@]}"; do
    stage "stopping ${BG_NAME[$id]} (the run ended before it was awaited)"
    pkill -TERM -s "${BG_PID[$id]}" 2>/dev/null || true
  done
  if [ "${#ids[@]}" -gt 0 ]; then
    sleep 5
    for id in "${ids[@]}"; do pkill -KILL -s "${BG_PID[$id]}" 2>/dev/null || true; done
  fi
  cpu_groups_end
  # Why each failed test failed, just above the table: its whole output (an HA test's ends with a dozen daemons'
  # logs) is far above, where a reader of the end of the log does not look.
  if [ "$rc" != 0 ] && [ "${BUILD_ONLY:-0}" != 1 ]; then
    python3 scripts/failed-tests.py "${CARGO_TARGET_DIR:-target}"/nextest/{ci,ci-qemu}/junit.xml || true
  fi
  [ "${BUILD_ONLY:-0}" = 1 ] || print_stages
  exit "$rc"
}

BUILD_ONLY=0
[ "${1:-}" = --build-only ] && BUILD_ONLY=1
mkdir -p "$CI_DIR"
trap finish EXIT
[ "$BUILD_ONLY" = 1 ] || cpu_groups_start

# A full disk shows up as compiler or test errors far from their cause ("No space left on device" in the middle of
# the build): say how much there is first. A whole run on a fresh machine wrote about 7 GB (the build 2.5 GB, the
# fresh Debian root 2-4 GB, the Python environment 0.8 GB, Debian's packages).
free_mb=$(df -Pm . | awk 'NR == 2 { print $4 }')
tmp_mb=$(df -Pm "${TMPDIR:-/tmp}" | awk 'NR == 2 { print $4 }')
stage "disk: ${free_mb} MB free for the checkout, ${tmp_mb} MB under ${TMPDIR:-/tmp}"
if [ "${free_mb:-0}" -lt 8000 ] || [ "${tmp_mb:-0}" -lt 4000 ]; then
  echo "test.sh: WARNING: the run needs about 7 GB of free disk (4 GB of it under ${TMPDIR:-/tmp}, for the fresh" \
    "root); with less, it fails with 'No space left on device'. Free some (cargo clean in old checkouts)." >&2
fi

# Every crate of the lock file, for every platform: what `cargo metadata` reads (the fresh roots run it), beyond
# what this machine's build downloads. Fetched once, before the roots need them: two roots that find a crate missing
# both unpack it into the shared download cache at once, and one fails ("failed to unpack package ... File exists").
# With a toolchain already on the machine (as on CI's), the download goes on beside the install step.
fetched=0
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
if [ "$BUILD_ONLY" = 0 ] && command -v cargo >/dev/null 2>&1; then
  bg_stage crates "crates (cargo fetch, beside the install step: every platform's, for the fresh roots' cargo metadata)" \
    cargo fetch --locked
  fetched=1
fi
run_stage "install (scripts/install-deps.sh)" source scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
source scripts/cargo-env.sh
if [ "$BUILD_ONLY" = 0 ] && ! cargo nextest --version >/dev/null 2>&1; then
  # The test runner (one pool across all test binaries); from crates.io when the machine has none.
  run_stage "install cargo-nextest (crates.io)" cargo install --locked cargo-nextest
fi

if [ "$BUILD_ONLY" = 0 ]; then
  if [ "$fetched" = 1 ]; then
    await_stage crates
  else
    run_stage "crates (cargo fetch: every platform's, for the fresh roots' cargo metadata)" cargo fetch --locked
  fi
fi
if [ "$BUILD_ONLY" = 0 ]; then
  # The etcd-backed tests run on Debian 12's etcd 3.4 (installed above) and Debian 13's 3.5 (fetched once, cached).
  run_stage "etcd 3.5 (Debian 13's etcd-server package, cached)" scripts/etcd-release.sh
fi

# The fresh roots: Debian 12 (bookworm) and Debian 13 (trixie), each made and proven the same way; the qemu guests in
# Debian 12's kernel and Debian 13's. IRONGUARD_DEBIAN13=0 leaves Debian 13 out (not under CI=true).
debian13=1
if [ "${IRONGUARD_DEBIAN13:-1}" = 0 ]; then
  if [ "${CI:-}" = true ]; then
    echo "test.sh: IRONGUARD_DEBIAN13=0 is for local runs; under CI=true Debian 13 is always proven" >&2
  else
    debian13=0
  fi
fi
SUITES=(bookworm trixie)
guests='binary(end_to_end) & test(/^debian_kernel::/)' kernels="Debian 12 and 13 kernels"
if [ "$debian13" = 0 ]; then
  SUITES=(bookworm)
  guests='binary(end_to_end) & test(/^debian_kernel::/) & not test(/debian_13|6_12/)' kernels="Debian 12 kernel"
fi
declare -A RELEASE=([bookworm]="Debian 12" [trixie]="Debian 13") FRESH=()
fresh_root=0
if [ "$BUILD_ONLY" = 0 ] && { [ "${IRONGUARD_SKIP_FRESH_ROOT:-0}" != 1 ] || [ "${CI:-}" = true ]; }; then
  fresh_root=1
  # Downloading and unpacking Debian waits on the network and the disk more than on the CPU (about 65 CPU-seconds
  # a root): both run beside the build.
  for suite in "${SUITES[@]}"; do
    FRESH[$suite]=$(mktemp -d "${TMPDIR:-/tmp}/ironguard-fresh-root-$suite.XXXXXX")
    bg_stage "fresh-bootstrap-$suite" "fresh ${RELEASE[$suite]} root: mmdebstrap and the install step" \
      scripts/fresh-root.sh --suite "$suite" bootstrap "${FRESH[$suite]}"
  done
fi
if [ "$BUILD_ONLY" = 0 ]; then
  bg_stage venv "the real Ironic 39 (cached Python environment)" scripts/ironic-venv.sh
  # The guests' kernels (Debian's linux-image packages and an initrd, cached): downloaded now, beside the build,
  # rather than by the first guest at the end of the run.
  kernel_suites=(bookworm)
  [ "$debian13" = 1 ] && kernel_suites+=(trixie)
  bg_stage kernels "the guests' kernels (Debian's linux-image packages, cached): ${kernel_suites[*]}" \
    bash -c 'for s; do scripts/guest-kernel.sh --suite "$s" >/dev/null || exit 1; done' kernels "${kernel_suites[@]}"
fi

if [ "$BUILD_ONLY" = 1 ]; then
  # What the demo and the packages need, built as scripts/demo.sh builds it: the workspace's binaries but the
  # benchmark's and the fake Ironic's (in a fresh root they cost about 20 CPU-seconds more and prove nothing more of
  # the system: the same crates with native build steps are built for the others). The whole workspace rather than
  # `-p` of the product's packages, so that cargo resolves the crates' features as for the test build and the root
  # reuses this machine's build of them (with `-p`, bitflags, nix and what depends on them were built again).
  lints="clippy's lints as errors"
  [ "${IRONGUARD_LINTS:-1}" = 0 ] && lints="no lints: IRONGUARD_LINTS=0"
  run_stage "build (bins, $lints)" \
    cargo build --locked --workspace --bins --exclude ironguard-bench --exclude fake-ironic
  stage "build only: done"
  exit 0
fi
run_stage "build (all targets, clippy's lints as errors)" cargo build --workspace --all-targets --locked
# The JUnit reports of an earlier run in this checkout, which the summary of failed tests would read as this one's.
rm -f "${CARGO_TARGET_DIR:-target}"/nextest/{ci,ci-qemu}/junit.xml
await_stage venv

smoke_runs() {
  local rc=0
  run_stage "benchmark smoke run (small sizes; full figures: docs/benchmarks.md)" \
    target/debug/ironguard-bench dataplane --sizes 1000 --delta-at 1000 --reps 5 --load-reps 1 --iptables-macs 20 \
    --backend-sizes 1000 --json target/bench-smoke/dataplane.json || rc=1
  run_stage "boot storm smoke run (20 clients: dnsmasq alone, the 3-host site, its leader killed mid-storm)" \
    target/debug/ironguard-bench storm --clients 20 --reps 1 --fault sigkill --json target/bench-smoke/storm.json || rc=1
  return "$rc"
}
smoke_rc=0
# Phase 2 (above): the guests and the fresh roots' runs start now; the tests when every root has built.
if [ "$fresh_root" = 1 ]; then
  bg_stage guest "$kernels under qemu (one boot each, side by side, beside the roots' builds and the tests): ipset backend, observation sets, egress before Linux 6.16" \
    cargo nextest run --profile ci-qemu --workspace --locked -E "$guests"
  # A fresh root's run needs its bootstrap and this build. It writes fresh-built-<suite> when its own build is done,
  # and goes on with the demo beside the tests, and the packages and their systemd check beside the demo.
  for suite in "${SUITES[@]}"; do
    rm -f "$CI_DIR/fresh-built-$suite"
    STAGE_SHARES=2048 bg_stage "fresh-run-$suite" "fresh ${RELEASE[$suite]} root: the README's commands (the demo beside the tests), the packages under systemd" \
      bash -c 'until [ -f "$1" ]; do sleep 1; done
        [ "$(cat "$2")" = 0 ] || { echo "test.sh: the bootstrap of this root failed (target/ci/fresh-bootstrap-$3.log)" >&2; exit 1; }
        rc=0; IRONGUARD_FRESH_BUILT=$5 scripts/fresh-root.sh --suite "$3" run "$4" || rc=$?
        rm -rf --one-file-system "$4"; exit "$rc"' \
      "fresh-run-$suite" "$CI_DIR/fresh-bootstrap-$suite.end" "$CI_DIR/fresh-bootstrap-$suite.rc" "$suite" \
      "${FRESH[$suite]}" "$CI_DIR/fresh-built-$suite"
  done
  # The benchmark smoke runs meanwhile (about 20 s, mostly waiting on DHCP: 4 CPU-seconds).
  smoke_runs || smoke_rc=1
  # The roots' builds (or their failure: a stage that ended): the tests wait for them, not for their outcome.
  roots_built() {
    local suite
    for suite in "${SUITES[@]}"; do
      until [ -e "$CI_DIR/fresh-built-$suite" ] || [ -e "$CI_DIR/fresh-run-$suite.end" ]; do sleep 1; done
    done
  }
  run_stage "the fresh roots' builds (${SUITES[*]}: the crates with native build steps and every binary, again, in each)" roots_built
fi
export IRONGUARD_FAULT_ROUNDS=${IRONGUARD_FAULT_ROUNDS:-1}
# The property tests' case counts here: a few hundred per pure property, 48 per property that goes over the network
# (each test's default is several times that; scripts/fuzz.sh runs 20,000 and 1,000). Repetition is fuzz.sh's job;
# CI runs every property with fresh random cases on every run.
export IRONGUARD_PROPTEST_CASES=${IRONGUARD_PROPTEST_CASES:-500} IRONGUARD_PROPTEST_NET_CASES=${IRONGUARD_PROPTEST_NET_CASES:-48}
if [ "$fresh_root" = 1 ]; then
  run_stage "tests (cargo nextest, one pool: unit, integration, end-to-end)" \
    cargo nextest run --profile ci --workspace --locked -E 'not (binary(end_to_end) & test(/^debian_kernel::/))'
else
  run_stage "tests (cargo nextest, one pool: unit, integration, end-to-end, $kernels under qemu)" \
    cargo nextest run --profile ci --workspace --locked -E "not (binary(end_to_end) & test(/^debian_kernel::/)) | ($guests)"
  smoke_runs || smoke_rc=1
fi
if [ "$fresh_root" = 1 ]; then
  rc=0
  await_stage kernels || rc=1
  await_stage guest || rc=1
  for suite in "${SUITES[@]}"; do
    await_stage "fresh-bootstrap-$suite" || rc=1
    # The stage deletes its root when it ends (here too, if it never got to run).
    await_stage "fresh-run-$suite" || rc=1
    rm -rf --one-file-system "${FRESH[$suite]}"
  done
  [ "$rc" = 0 ]
else
  await_stage kernels
  stage "fresh Debian roots skipped (IRONGUARD_SKIP_FRESH_ROOT=1)"
fi
[ "$smoke_rc" = 0 ] || { echo "test.sh: a benchmark smoke run failed (its stage above)" >&2; exit 1; }
stage "all tests passed"
