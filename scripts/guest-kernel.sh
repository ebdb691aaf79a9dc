#!/usr/bin/env bash
# A stock Debian 12 kernel to boot under qemu, for the tests that need what this machine's kernel lacks (the
# ipset backend needs the hash:mac set type, CONFIG_IP_SET_HASH_MAC, which production kernels have as a module).
#
# Prints the directory that holds, cached after the first run:
#   boot/vmlinuz-*          the kernel of Debian's linux-image-amd64 (apt-get download; never installed)
#   lib/modules/*           its modules, with modules.dep (depmod)
#   initrd.gz               busybox (static) and the virtio/9p modules; its /init mounts this machine's root
#                           read-only over 9p, mounts tmpfs on /tmp and /run, and runs the script named on the
#                           kernel command line (ig.script=PATH ig.args=A,B,...) chrooted in it, then powers off.
#                           Directories named in ig.keep=DIR,DIR,... stay visible from the host even when they lie
#                           under /tmp or /run (a checkout or a target directory there): each is bound back into
#                           the fresh tmpfs at its own path.
# Run as root; needs qemu-system-x86, busybox-static and kmod (scripts/install-deps.sh installs them).
set -euo pipefail
cache=/var/cache/ironguard/guest-kernel
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
  # The metapackage names the current kernel package; download that one.
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  [ -n "$pkg" ] || { echo "guest-kernel: cannot find the kernel package behind linux-image-amd64" >&2; exit 1; }
  apt-get download -q "$pkg" >/dev/null 2>&1 || { chmod 777 "$work"; apt-get download -q "$pkg" >/dev/null; }
  dpkg-deb -x ./*.deb "$cache"
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
k="$cache/lib/modules/$version/kernel"
mods="drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_legacy_dev
  drivers/virtio/virtio_pci_modern_dev drivers/virtio/virtio_pci fs/netfs/netfs fs/fscache/fscache net/9p/9pnet
  net/9p/9pnet_virtio fs/9p/9p"
order=""
for m in $mods; do cp "$k/$m.ko" "$initrd/mods/"; order="$order $(basename "$m")"; done
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
