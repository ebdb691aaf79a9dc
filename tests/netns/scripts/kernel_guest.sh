#!/bin/sh
# Checks that need another kernel than this machine's, several parts in one boot of a stock Debian kernel under
# qemu (scripts/guest-kernel.sh), one after another: `ipset` (the ipset backend, ipset_guest.sh), `egress` (the
# reply-side dataplane before Linux 6.16, egress_guest.sh), `seen` (the observation sets, seen_guest.sh). Started by
# tests/netns/tests/debian_kernel.rs; runs chrooted in this machine's root (read-only, tmpfs on /tmp and /run).
#
# Usage: kernel_guest.sh BIN_DIR PART...
# Each part runs in namespaces of its own: a PID namespace (its processes all end with it, whatever it leaves
# running), and a mount namespace with a fresh tmpfs on /tmp and /run (its files, and the names of the network
# namespaces it makes, under /run/netns, are its own; those network namespaces go when their last process and name
# do). The parts share nothing but the kernel's modules and the page cache, so one boot and one load of the
# binaries over 9p serve them all (a boot and the first start of each binary cost the emulated CPU most).
# Prints each part's `RESULT <check> ...` lines with the part's name before the check (`ipset/leader-allowed`),
# then `DONE` once every part has ended.
BIN=$1
shift
dir=$(dirname "$0")
echo "guest: kernel $(uname -r)"
[ $# -gt 0 ] || echo "RESULT parts FAIL no part named"
for part in "$@"; do
  echo "guest: part $part"
  # The inner shell makes the mounts in the new mount namespace, then runs the part. The scripts' and the
  # binaries' directories may live under /tmp or /run (a checkout under /tmp): they are bound back into the fresh
  # tmpfs from a view of the old ones, kept on /mnt.
  unshare --mount --propagation private --pid --fork --mount-proc /bin/sh -c '
    part=$1 dir=$2 bin=$3
    mount -t tmpfs tmpfs /mnt && mkdir /mnt/tmp /mnt/run && mount --bind /tmp /mnt/tmp && mount --bind /run /mnt/run &&
      mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /run || { echo "RESULT $part-namespaces FAIL no tmpfs"; exit 1; }
    for d in "$dir" "$bin"; do
      case $d in
        /tmp/* | /run/*) mkdir -p "$d" && mount --bind "/mnt$d" "$d" || echo "RESULT $part-keep FAIL cannot keep $d" ;;
      esac
    done
    exec /bin/sh "$dir/${part}_guest.sh" "$bin"' part "$part" "$dir" "$BIN" 2>&1 |
    sed -u "s|^RESULT |RESULT $part/|; s|^DONE\$|guest: part $part done|"
  echo "guest: part $part exited"
done
echo DONE
