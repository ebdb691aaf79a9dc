#!/usr/bin/env bash
# The whole test suite, as CI runs it (as root): installs what it needs, builds, lints, runs unit, integration and
# privileged end-to-end tests (network namespaces, real nftables, dnsmasq, udhcpc, etcd), and a benchmark smoke run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

echo "== build"
cargo build --workspace --all-targets --locked
if [ "${1:-}" = --build-only ]; then echo "== build only: done"; exit 0; fi
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== unit, integration and end-to-end tests (network namespaces: real kernel, dnsmasq, udhcpc, etcd)"
# One invocation for the whole workspace (no second build with other features). The end-to-end tests mostly wait
# on DHCP timeouts and leases, so more threads than cores.
cargo test --workspace --locked -- --test-threads 8
echo "== benchmark smoke run (small sizes; full figures: see docs/benchmarks.md)"
target/debug/ironguard-bench dataplane --sizes 1000 --delta-at 1000 --reps 5 --load-reps 1 --iptables-macs 20 \
  --json target/bench-smoke/dataplane.json
echo "== all tests passed"
