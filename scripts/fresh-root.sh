#!/usr/bin/env bash
# The README's two commands on a brand-new Debian 12: builds a minimal Debian 12 root with mmdebstrap
# (--variant=minbase, nothing but apt and the essentials), copies this checkout into it, and runs there, as root:
#   1. ./scripts/test.sh --build-only   the test command's install step and build
#   2. ./scripts/demo.sh                the demo: install step, debug build of the binaries, the whole demo
# A package that install-deps.sh forgets makes one of them fail here even when this machine already has it.
# Then, in the same root, scripts/package.sh makes the Debian packages from that build and apt installs them, and
# scripts/systemd-check.sh boots the root with systemd-nspawn and checks the packaged units under a real systemd
# (readiness, privileges, watchdog, guard across restarts and a reboot) with real DHCP traffic.
#
# Only the Rust toolchain (~/.rustup, ~/.cargo/bin, read-only) and cargo's download cache (~/.cargo/registry)
# are bound in from this machine, as the machine image ships them; everything else the root gets from
# install-deps.sh. Everything runs in a private mount namespace, so no bind mount outlives the run, and the root
# is deleted at the end (kept with IRONGUARD_KEEP_ROOT=1).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD

for tool in mmdebstrap unshare chroot; do
  command -v "$tool" >/dev/null || { echo "fresh-root: $tool is missing (scripts/test.sh installs mmdebstrap)" >&2; exit 1; }
done
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
[ -x "$cargo_home/bin/cargo" ] && [ -d "$rustup_home/toolchains" ] ||
  { echo "fresh-root: no rustup toolchain in $cargo_home / $rustup_home to bind into the root" >&2; exit 1; }
mkdir -p "$cargo_home/registry"

base=$(mktemp -d "${TMPDIR:-/tmp}/ironguard-fresh-root.XXXXXX")
root=$base/root
cleanup() {
  local rc=$?
  # The mounts lived in the private mount namespace of the run below and died with it; --one-file-system is a
  # second guard against deleting through a bind mount.
  if [ "${IRONGUARD_KEEP_ROOT:-0}" = 1 ]; then echo "fresh-root: kept $root"; else rm -rf --one-file-system "$base"; fi
  exit $rc
}
trap cleanup EXIT

echo "== fresh Debian 12 root: mmdebstrap --variant=minbase bookworm"
t0=$(date +%s)
mmdebstrap --quiet --variant=minbase --mode=root bookworm "$root" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's network: the certificate authorities it trusts locally (e.g. an egress proxy's) and the variables
# that point TLS clients at the trust store. Not an install step of ironguard's; ca-certificates (installed by
# install-deps.sh in the root) adds these to the root's bundle.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
tls_env=()
for v in SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE PIP_CERT CURL_CA_BUNDLE PIP_INDEX_URL PIP_EXTRA_INDEX_URL \
  http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [ -n "${!v:-}" ] && tls_env+=("$v=${!v}")
done

# This checkout as a clean clone would hold it (tracked and new, not ignored, files; the working tree's contents).
mkdir -p "$root/root/ironguard"
git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
  tar --null -T - -cf - | tar -xf - -C "$root/root/ironguard"

inner='set -euo pipefail
export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd /root/ironguard
echo "== [fresh root] the test command: install step and build"
./scripts/test.sh --build-only
echo "== [fresh root] the demo"
./scripts/demo.sh
echo "== [fresh root] the Debian packages of this build (scripts/package.sh), installed with apt"
t=$(date +%s)
./scripts/package.sh --profile dev --no-build
apt-get install -y -qq --no-install-recommends ./target/debian/*.deb
echo "== [fresh root] packages built and installed ($(($(date +%s) - t)) s)"'

echo "== running the README's commands in the fresh root ($(($(date +%s) - t0)) s so far)"
unshare --mount --propagation private -- bash -euo pipefail -c '
  root=$1 cargo_home=$2 rustup_home=$3 inner=$4
  # The root as a mount point of its own: `ip netns exec` remounts / as a slave, which needs one.
  mount --bind "$root" "$root"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs tmpfs "$root/run"
  mount -t tmpfs tmpfs "$root/tmp"
  mkdir -p "$root/root/.rustup" "$root/root/.cargo/bin" "$root/root/.cargo/registry"
  mount --bind "$rustup_home" "$root/root/.rustup" && mount -o remount,bind,ro "$root/root/.rustup"
  mount --bind "$cargo_home/bin" "$root/root/.cargo/bin" && mount -o remount,bind,ro "$root/root/.cargo/bin"
  mount --bind "$cargo_home/registry" "$root/root/.cargo/registry"
  shift 4
  exec chroot "$root" /usr/bin/env -i TERM=dumb CI="${CI:-}" "$@" /bin/bash -c "$inner"
' fresh-root "$root" "$cargo_home" "$rustup_home" "$inner" "${tls_env[@]}"
echo "== fresh root: the README's commands passed, the packages are installed ($(($(date +%s) - t0)) s)"
# The same root booted under systemd-nspawn: the packages' units under a real systemd, with real DHCP traffic.
scripts/systemd-check.sh "$root" /root/ironguard/target/debian
echo "== fresh root: passed ($(($(date +%s) - t0)) s)"
