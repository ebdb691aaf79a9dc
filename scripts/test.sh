#!/usr/bin/env bash
# The whole test suite, as CI runs it (as root): installs what it needs, builds, lints, runs unit, integration and
# privileged end-to-end tests (network namespaces, real nftables, dnsmasq, udhcpc, etcd, a real Ironic 39), a
# benchmark smoke run, and finally the README's two commands in a brand-new Debian 12 root (scripts/fresh-root.sh),
# which proves the install step is complete.
#   --build-only   install and build only (what the fresh root runs for this command)
#   IRONGUARD_SKIP_FRESH_ROOT=1 skips the fresh-root stage (for a quick local run; CI never sets it)
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
stage() { echo "== $* (at $(($(date +%s) - T0)) s)"; }
source scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

stage "build"
cargo build --workspace --all-targets --locked
if [ "${1:-}" = --build-only ]; then stage "build only: done"; exit 0; fi
stage "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage "the real Ironic 39 for the end-to-end tests (cached Python environment)"
scripts/ironic-venv.sh >/dev/null
stage "unit, integration and end-to-end tests (network namespaces: real kernel, dnsmasq, udhcpc, etcd, Ironic 39)"
# One invocation for the whole workspace (no second build with other features). The end-to-end tests mostly wait
# on DHCP timeouts and leases, so more threads than cores.
# The tests that boot a Debian 12 kernel under qemu (tests/netns/tests/debian_kernel.rs: emulated CPU, minutes, no
# timing assertions) run later, beside the fresh root, where much of the time is spent downloading and waiting.
cargo test --workspace --locked -- --test-threads 8 --skip in_a_debian_
guest_tests=$(cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
  jq -r 'select(.reason == "compiler-artifact" and .target.name == "debian_kernel") | .executable // empty')
[ -x "$guest_tests" ] || { echo "test.sh: cannot find the debian_kernel test binary" >&2; exit 1; }
run_guest_tests() { "$guest_tests" --test-threads 1 in_a_debian_; }
stage "benchmark smoke run (small sizes; full figures: see docs/benchmarks.md)"
target/debug/ironguard-bench dataplane --sizes 1000 --delta-at 1000 --reps 5 --load-reps 1 --iptables-macs 20 --backend-sizes 1000 \
  --json target/bench-smoke/dataplane.json
if [ "${IRONGUARD_SKIP_FRESH_ROOT:-0}" = 1 ] && [ "${CI:-}" != true ]; then
  stage "the Debian 12 kernel under qemu: the ipset backend, the egress dataplane before Linux 6.16"
  run_guest_tests
  stage "fresh Debian 12 root skipped (IRONGUARD_SKIP_FRESH_ROOT=1)"
else
  stage "the README's two commands in a fresh Debian 12 root; beside it, the Debian 12 kernel under qemu"
  guest_log=target/debian-kernel-tests.log
  run_guest_tests >"$guest_log" 2>&1 &
  guest_pid=$!
  trap 'kill "$guest_pid" 2>/dev/null' EXIT
  scripts/fresh-root.sh
  stage "the Debian 12 kernel under qemu: the ipset backend, the egress dataplane before Linux 6.16"
  guest_rc=0
  wait "$guest_pid" || guest_rc=$?
  trap - EXIT
  cat "$guest_log"
  [ "$guest_rc" = 0 ] || { echo "test.sh: the tests in the Debian 12 kernel failed" >&2; exit 1; }
fi
stage "all tests passed"
