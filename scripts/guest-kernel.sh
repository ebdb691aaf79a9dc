#!/usr/bin/env bash
# A stock Debian kernel to boot under qemu, for the tests that need what this machine's kernel lacks (the
# ipset backend needs the hash:mac set type, CONFIG_IP_SET_HASH_MAC, which production kernels have as a module), and
# for the kernels sites run: Debian 12's 6.1 (the default) and Debian 13's 6.12 (`--suite trixie`).
#
#   scripts/guest-kernel.sh [--suite bookworm|trixie]
#
# Prints the directory that holds, cached after the first run:
#   boot/vmlinuz-*          the kernel of Debian's linux-image-amd64 (apt-get download; never installed). For
#                           trixie, apt reads trixie's indexes into a private directory (signatures checked against
#                           the machine's debian-archive-keyring, as for the machine's own sources); the machine's
#                           apt state is not touched.
#   lib/modules/*           its modules, with modules.dep (depmod)
#   initrd.gz               busybox (static) and the virtio/9p modules; its /init mounts this machine's root
#                           read-only over 9p, mounts tmpfs on /tmp and /run, and runs the script named on the
#                           kernel command line (ig.script=PATH ig.args=A,B,...) chrooted in it, then powers off.
#                           Directories named in ig.keep=DIR,DIR,... stay visible from the host even when they lie
#                           under /tmp or /run (a checkout or a target directory there): each is bound back into
#                           the fresh tmpfs at its own path.
# Run as root; needs qemu-system-x86, busybox-static and kmod (scripts/install-deps.sh installs them).
set -euo pipefail
suite=bookworm
if [ "${1:-}" = --suite ]; then suite=${2:?usage: guest-kernel.sh [--suite bookworm|trixie]}; fi
case "$suite" in
  bookworm) cache=${IRONGUARD_GUEST_KERNEL_CACHE:-/var/cache/ironguard/guest-kernel} ;;
  trixie) cache=${IRONGUARD_GUEST_KERNEL_CACHE:-/var/cache/ironguard/guest-kernel-trixie} ;;
  *) echo "guest-kernel: unknown suite $suite (bookworm or trixie)" >&2; exit 2 ;;
esac
# .ready-v1: the kernel, its modules and an initrd are there. .ready-v2: the initrd's /init knows ig.keep. .ready-v3:
# it mounts the host's root with cache=loose. (Older checkouts sharing this cache look for their own stamp, and each
# initrd does all the older ones did.)
kernel_stamp="$cache/.ready-v1"
stamp="$cache/.ready-v3"
if [ -f "$stamp" ]; then echo "$cache"; exit 0; fi
# Tests that boot the guest run in parallel: the first one builds the cache, the others wait for it.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock 9
if [ -f "$stamp" ]; then echo "$cache"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if [ ! -f "$kernel_stamp" ]; then
  rm -rf "$cache" && mkdir -p "$cache"
  apt_opts=()
  if [ "$suite" != bookworm ]; then
    # Another release's indexes, in a directory of this run's own: apt checks their signatures as for the
    # machine's sources, and the machine's own lists and cache stay as they are.
    mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
    printf 'deb http://deb.debian.org/debian %s main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
      "$suite" "$suite" >"$work/apt/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
      -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" -o APT::Sandbox::User=root)
    apt-get "${apt_opts[@]}" -qq update >/dev/null ||
      { echo "guest-kernel: cannot read $suite's package indexes from deb.debian.org" >&2; exit 1; }
  fi
  # The metapackage names the current kernel package; download that one.
  pkg=$(apt-cache "${apt_opts[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [ -n "$pkg" ] || { echo "guest-kernel: cannot find the kernel package behind linux-image-amd64 ($suite)" >&2; exit 1; }
  apt-get "${apt_opts[@]}" download -q "$pkg" >/dev/null 2>&1 ||
    { chmod 777 "$work"; apt-get "${apt_opts[@]}" download -q "$pkg" >/dev/null; }
  dpkg-deb -x ./*.deb "$cache"
  # Debian 13's packages ship /usr/lib/modules (merged /usr); depmod and modprobe -d read DIR/lib/modules.
  if [ ! -d "$cache/lib/modules" ] && [ -d "$cache/usr/lib/modules" ]; then
    mkdir -p "$cache/lib" && ln -s ../usr/lib/modules "$cache/lib/modules"
  fi
  depmod -b "$cache" "$(ls "$cache/lib/modules")"
fi
version=$(ls "$cache/lib/modules")

initrd="$work/initrd"
mkdir -p "$initrd"/{bin,mods,proc,sys,dev,host}
cp "$(command -v busybox)" "$initrd/bin/busybox"
if ldd "$initrd/bin/busybox" >/dev/null 2>&1; then
  echo "guest-kernel: busybox must be the static one (Debian package busybox-static)" >&2
  exit 1
fi
# The virtio and 9p modules with what they need, in load order, as modprobe resolves them from the kernel's own
# modules.dep (6.1 and 6.12 differ: fscache went into netfs; trixie compresses modules with xz, which busybox's
# insmod cannot read, so they are unpacked here). Built-in ones are skipped.
order=""
while read -r verb path _; do
  [ "$verb" = insmod ] || continue
  name=$(basename "$path"); name=${name%%.ko*}
  case " $order " in *" $name "*) continue ;; esac
  case "$path" in
    *.ko.xz) xz -dc "$path" >"$initrd/mods/$name.ko" ;;
    *.ko.zst) zstd -qdc "$path" >"$initrd/mods/$name.ko" ;;
    *) cp "$path" "$initrd/mods/$name.ko" ;;
  esac
  order="$order $name"
done < <(for m in virtio_pci 9pnet_virtio 9p; do modprobe -d "$cache" -S "$version" --show-depends "$m"; done)
case " $order " in *" 9p "*) ;; *) echo "guest-kernel: no 9p module found in $version (got:$order)" >&2; exit 1 ;; esac
cat >"$initrd/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $order; do insmod /mods/\$m.ko || echo "guest: insmod \$m failed"; done
# cache=loose: the guest's page cache keeps what it read (the host's root does not change under a guest), so
# running a binary again costs no 9p reads; with no cache, each ironguardctl run cost 1.3 s of emulated CPU, 0.25 s
# with it. A large msize: fewer, larger 9p messages.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host ||
  echo "guest: mounting the host's root failed"
for d in proc sys dev; do mount --bind /\$d /host/\$d; done
# /tmp and /run get a tmpfs of their own (the root is read-only), which hides what the host has there; the
# directories named in ig.keep are bound back from a view of the host's /tmp and /run kept before.
mkdir -p /hostview/tmp /hostview/run
mount --bind /host/tmp /hostview/tmp; mount --bind /host/run /hostview/run
mount -t tmpfs tmpfs /host/tmp; mount -t tmpfs tmpfs /host/run
for dir in \$(sed -n 's/.*ig\.keep=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' '); do
  case "\$dir" in
    /tmp/*|/run/*) mkdir -p "/host\$dir" && mount --bind "/hostview\$dir" "/host\$dir" || echo "guest: cannot keep \$dir" ;;
  esac
done
script=\$(sed -n 's/.*ig\.script=\([^ ]*\).*/\1/p' /proc/cmdline)
args=\$(sed -n 's/.*ig\.args=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ')
echo "guest: kernel \$(uname -r), running \$script"
chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin GUEST_KERNEL=$cache /bin/sh "\$script" \$args
echo "guest: script exited \$?"
poweroff -f
EOF
chmod 755 "$initrd/init"
(cd "$initrd" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initrd.gz")
# Replaced in one rename: a guest of an older checkout booting right now reads either the old file or the new one.
mv "$work/initrd.gz" "$cache/initrd.gz.new" && mv "$cache/initrd.gz.new" "$cache/initrd.gz"
touch "$kernel_stamp" "$stamp"
echo "$cache"
