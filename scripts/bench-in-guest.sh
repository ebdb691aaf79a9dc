#!/usr/bin/env bash
# Runs the dataplane benchmark inside a stock Debian 12 kernel under qemu (scripts/guest-kernel.sh), where the ipset
# backend can run (this machine's kernel has no hash:mac). qemu emulates the CPU in software here (KVM does not run
# guests on this machine), so the figures compare the backends with each other in that guest — the nftables rows
# of the same run are the yardstick — not with figures measured on the host.
# Usage: scripts/bench-in-guest.sh [SIZES [BACKEND_SIZES [JSON]]]   (sizes separated by '+'; release build)
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-1000+10000}
backend_sizes=${2:-1000+10000}
json=${3:-bench-results/dataplane-guest.json}
cargo build --release -p ironguard-bench --locked >&2
cache=$(scripts/guest-kernel.sh)
kernel=$(ls "$cache"/boot/vmlinuz-*)
bin_dir=$(realpath target/release)
script=$(realpath tests/netns/scripts/bench_guest.sh)
console=$(mktemp)
timeout 3600 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m 4096 -smp 2 -nographic -no-reboot \
  -kernel "$kernel" -initrd "$cache/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 ig.script=$script ig.args=$bin_dir,$sizes,$backend_sizes ig.keep=$(dirname "$script"),$bin_dir" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap </dev/null >"$console"
tr -d '\r' <"$console" | sed -n '/^| /p;/^Where/p;/^Other/p;/^ironguard dataplane/p;/^$/p' | cat -s
mkdir -p "$(dirname "$json")"
tr -d '\r' <"$console" | sed -n '/^BEGIN-JSON/,/^END-JSON/p' | sed '1d;$d' >"$json"
if ! head -c 1 "$json" | grep -q '{'; then
  echo "bench-in-guest: the guest printed no results; its console is in $console" >&2
  exit 1
fi
rm -f "$console"
echo "wrote $json" >&2
