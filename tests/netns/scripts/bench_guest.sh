#!/bin/sh
# Runs `ironguard-bench dataplane` inside the stock Debian 12 kernel of scripts/guest-kernel.sh, so that the ipset
# backend (which needs hash:mac) is measured next to nftables and the hostsdir in one run. Started by
# scripts/bench-in-guest.sh; prints the JSON between BEGIN-JSON and END-JSON on the console.
# Usage: bench_guest.sh BIN_DIR SIZES BACKEND_SIZES (sizes separated by '+')
BIN=$1
SIZES=$(echo "$2" | tr + ,)
BACKEND_SIZES=$(echo "$3" | tr + ,)
K=${GUEST_KERNEL:?}
for m in nfnetlink nf_tables nft_compat x_tables ip_tables iptable_filter iptable_mangle xt_mark xt_comment \
  xt_tcpudp xt_mac xt_set ip_set ip_set_hash_mac ip_set_bitmap_port; do
  modprobe -d "$K" "$m" 2>/dev/null
done
cd /tmp
"$BIN/ironguard-bench" dataplane --sizes "$SIZES" --backend-sizes "$BACKEND_SIZES" --delta-at "${SIZES##*,}" \
  --reps 50 --load-reps 3 --iptables-macs 200 --json /tmp/dataplane.json 2>/tmp/bench.err || {
  echo "bench failed:"
  tail -20 /tmp/bench.err
}
echo BEGIN-JSON
cat /tmp/dataplane.json
echo
echo END-JSON
