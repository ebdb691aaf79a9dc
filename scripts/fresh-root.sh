#!/usr/bin/env bash
# The README's two commands on a brand-new Debian: builds a minimal root with mmdebstrap (--variant=minbase,
# nothing but apt and the essentials), and runs there, as root:
#   1. scripts/install-deps.sh          the install step of both commands (every system package they need)
#   2. ./scripts/test.sh --build-only   the test command's install step and build
#   3. ./scripts/demo.sh                the demo: install step, build, the whole demo
# A package that install-deps.sh forgets makes one of them fail here even when this machine already has it.
# Then, in the same root and beside the demo, scripts/package.sh makes the Debian packages from that build and apt
# installs them, and
# scripts/systemd-check.sh boots the root with systemd-nspawn and checks the packaged units under a real systemd
# (readiness, privileges, watchdog, guard across restarts and a reboot) with real DHCP traffic.
#
# What the root reuses from this machine's build (target/debug, which must be built first, as scripts/test.sh
# does), and why that proves the same: pure Rust crates compiled by the same rustc give the same output on any
# distribution, so they are taken from an overlay of this machine's target/debug. Everything that touches the
# system is done again in the root:
#   - every crate whose build runs a system tool beyond the C compiler (libclang through bindgen, protoc: found
#     from `cargo metadata`, e.g. rustables, etcd-client, ironguard-proto) is cleaned, so that the test command's
#     build runs its build script from scratch, and a missing -dev package or tool fails here;
#   - every binary of the workspace is compiled and linked again in the root (its C compiler driver, its C
#     library's development files: what a crate that compiles C with the `cc` crate, like ring, needs too),
#     without clippy's lints (IRONGUARD_LINTS=0: they depend on the code and the toolchain only, and the test
#     command has run them on this machine);
#   - the Python environment of the real Ironic is made in the root (pip's download cache is shared).
# The checkout is copied (as a clean clone would hold it) to the same absolute path in the root as here, so the
# build's fingerprints match; the Rust toolchain (~/.rustup, ~/.cargo/bin, read-only) and cargo's download cache
# are bound in from this machine, as the machine image ships them.
#
#   scripts/fresh-root.sh [--suite bookworm|trixie] [bootstrap DIR | run DIR]
# Without a phase: both, in a temporary directory deleted at the end (kept with IRONGUARD_KEEP_ROOT=1).
# `bootstrap DIR` makes the root and runs the install step (network and disk, little CPU: scripts/test.sh runs it
# beside the build); `run DIR` does the rest. Everything runs in a private mount namespace, so no mount outlives it.
# IRONGUARD_FRESH_BUILT=FILE (phase run): written when the build is done, before the demo (scripts/test.sh starts
# its tests when every root has built).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD

suite=bookworm
if [ "${1:-}" = --suite ]; then suite=$2; shift 2; fi
phase=${1:-all}
case "$suite" in
  bookworm) mirrors=("deb http://deb.debian.org/debian bookworm main" "deb http://deb.debian.org/debian bookworm-updates main"
    "deb http://deb.debian.org/debian-security bookworm-security main") ;;
  trixie) mirrors=("deb http://deb.debian.org/debian trixie main" "deb http://deb.debian.org/debian trixie-updates main"
    "deb http://deb.debian.org/debian-security trixie-security main") ;;
  *) echo "fresh-root: unknown suite $suite" >&2; exit 2 ;;
esac

for tool in mmdebstrap unshare chroot jq; do
  command -v "$tool" >/dev/null || { echo "fresh-root: $tool is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
[ -x "$cargo_home/bin/cargo" ] && [ -d "$rustup_home/toolchains" ] ||
  { echo "fresh-root: no rustup toolchain in $cargo_home / $rustup_home to bind into the root" >&2; exit 1; }
mkdir -p "$cargo_home/registry" "$HOME/.cache/pip"

case "$phase" in
  all)
    base=$(mktemp -d "${TMPDIR:-/tmp}/ironguard-fresh-root.XXXXXX")
    cleanup() {
      local rc=$?
      if [ "${IRONGUARD_KEEP_ROOT:-0}" = 1 ]; then echo "fresh-root: kept $base"; else rm -rf --one-file-system "$base"; fi
      exit $rc
    }
    trap cleanup EXIT
    "$0" --suite "$suite" bootstrap "$base"
    "$0" --suite "$suite" run "$base"
    exit 0
    ;;
  bootstrap | run) base=${2:?usage: scripts/fresh-root.sh [--suite S] [bootstrap DIR | run DIR]} ;;
  *) echo "usage: scripts/fresh-root.sh [--suite S] [bootstrap DIR | run DIR]" >&2; exit 2 ;;
esac
base=$(cd "$base" && pwd)
root=$base/root
t0=$(date +%s)

# Runs the script $1 in the root, in a private mount namespace: the system mounts, the toolchain, the checkout at
# this machine's path, and (phase run) target/debug as an overlay of this machine's.
in_root() {
  local inner=$1 tls_env=() v
  for v in SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE PIP_CERT CURL_CA_BUNDLE PIP_INDEX_URL PIP_EXTRA_INDEX_URL \
    http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [ -n "${!v:-}" ] && tls_env+=("$v=${!v}")
  done
  unshare --mount --propagation private -- bash -euo pipefail -c '
    base=$1 root=$2 src=$3 cargo_home=$4 rustup_home=$5 phase=$6 inner=$7
    # The root as a mount point of its own: `ip netns exec` remounts / as a slave, which needs one.
    mount --bind "$root" "$root"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/run"
    mount -t tmpfs tmpfs "$root/tmp"
    mkdir -p "$root/root/.rustup" "$root/root/.cargo/bin" "$root/root/.cargo/registry" "$root/root/.cache/pip" "$root$src"
    mount --bind "$rustup_home" "$root/root/.rustup" && mount -o remount,bind,ro "$root/root/.rustup"
    mount --bind "$cargo_home/bin" "$root/root/.cargo/bin" && mount -o remount,bind,ro "$root/root/.cargo/bin"
    mount --bind "$cargo_home/registry" "$root/root/.cargo/registry"
    mount --bind "$HOME/.cache/pip" "$root/root/.cache/pip"
    mount --bind "$base/checkout" "$root$src"
    if [ "$phase" = run ]; then
      mkdir -p "$base/checkout/target/debug" "$base/target"/{upper,work}
      mount -t overlay overlay -o "lowerdir=$src/target/debug,upperdir=$base/target/upper,workdir=$base/target/work" \
        "$root$src/target/debug"
    fi
    shift 7
    exec chroot "$root" /usr/bin/env -i TERM=dumb CI="${CI:-}" SRC="$src" "$@" /bin/bash -c "$inner"
  ' fresh-root "$base" "$root" "$src" "$cargo_home" "$rustup_home" "$phase" "$inner" "${tls_env[@]}"
}

if [ "$phase" = bootstrap ]; then
  echo "== fresh Debian root ($suite): mmdebstrap --variant=minbase"
  # force-unsafe-io: dpkg without an fsync per unpacked file, in this throwaway root only (it stays in the root's
  # dpkg.cfg.d, so the install step below unpacks the same way). It changes what survives a power cut, not what is
  # installed; with an fsync per file, two roots unpacking beside the build stalled the build's writes (the build
  # took 241 s beside them, 160 s alone).
  mmdebstrap --quiet --variant=minbase --mode=root --dpkgopt=force-unsafe-io "$suite" "$root" "${mirrors[@]}"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # This machine's network: the certificate authorities it trusts locally (e.g. an egress proxy's) and the variables
  # that point TLS clients at the trust store. Not an install step of ironguard's; ca-certificates (installed by
  # install-deps.sh in the root) adds these to the root's bundle.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  # This checkout as a clean clone would hold it (tracked and new, not ignored, files; the working tree's contents).
  mkdir -p "$base/checkout"
  git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
    tar --null -T - -cf - | tar -xf - -C "$base/checkout"
  echo "== [fresh root] the install step (scripts/install-deps.sh) ($(($(date +%s) - t0)) s so far)"
  in_root 'set -euo pipefail
export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd "$SRC"
./scripts/install-deps.sh
# The first install step of the demo, run here while the host still builds: the real Ironic and the OpenStack clients from
# PyPI, made by the same script the demo runs (it then finds them ready). Network-bound, off the critical path.
echo "== [fresh root] the Python environment of the demo (scripts/ironic-venv.sh)"
scripts/ironic-venv.sh >/dev/null'
  echo "== fresh root ($suite): bootstrapped in $(($(date +%s) - t0)) s"
  exit 0
fi

[ -d "$src/target/debug/deps" ] || { echo "fresh-root: build target/debug first (scripts/test.sh does)" >&2; exit 1; }
echo "== [fresh root] the README's commands ($suite)"
in_root 'set -euo pipefail
export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd "$SRC"
# Without clippy: the test command on this machine has linted this checkout with the same toolchain (cargo-env.sh).
export IRONGUARD_LINTS=0
source scripts/cargo-env.sh
t=$(date +%s)
# The crates whose build runs a system tool beyond the C compiler: their artifacts are removed, so that the build of
# the test command below runs their build scripts from scratch here (bindgen with libclang and the kernel headers,
# protoc with the well-known types of libprotobuf-dev) and compiles and links everything that depends on them again.
# The C compiler needs no crate of its own: every binary of the workspace is linked here by `cc` (gcc, the C
# library development files), which is all that a crate built with the `cc` crate alone (ring) asks of the system;
# rebuilding ring too rebuilt rustls, tonic, reqwest and what depends on them (22 crates instead of 11: a root
# build took 120 CPU-seconds instead of 97, measured on 2026-12-07), for nothing more: gcc brings binutils and cpp.
# (A separate `cargo build -p` of these crates resolved other features than the workspace and rebuilt 57 crates for
# nothing: 338 s beside the tests.) No apostrophe in this quoted script.
native=$(cargo metadata --locked --format-version 1 | jq -r '"'"'
  .packages[] | select(any(.dependencies[]; .kind == "build" and (.optional | not) and
    (.name | IN("bindgen", "prost-build", "tonic-prost-build", "tonic-build", "pkg-config", "cmake"))))
  | .name'"'"' | sort -u)
[ -n "$native" ] || { echo "fresh-root: found no crate with a native build step" >&2; exit 1; }
members=$(cargo metadata --locked --no-deps --format-version 1 | jq -r '"'"'.packages[].name'"'"')
deps=() own=()
for p in $native; do
  if grep -qx "$p" <<<"$members"; then own+=(-p "$p"); else deps+=(-p "$p"); fi
done
echo "== [fresh root] crates with native build steps, built from scratch by the build below: "$native
# Dependencies and workspace members in separate runs: cargo resolves `-p` of a member within that member alone.
[ "${#deps[@]}" = 0 ] || cargo clean --locked "${deps[@]}"
[ "${#own[@]}" = 0 ] || cargo clean --locked "${own[@]}"
# Every binary of the workspace compiled and linked again here.
for b in $(cargo metadata --locked --no-deps --format-version 1 | jq -r '"'"'.packages[].targets[] | select(any(.kind[]; . == "bin")) | .name'"'"'); do
  rm -f "target/debug/$b" target/debug/deps/"${b//-/_}"-*
done
echo "== [fresh root] the test command: install step and build"
./scripts/test.sh --build-only'
# The test command starts its tests when this build is done (IRONGUARD_FRESH_BUILT): the demo, the packages and the
# systemd check then run beside them (scripts/test.sh, "How the stages share the CPU").
echo "== [fresh root] built ($(($(date +%s) - t0)) s so far)"
[ -z "${IRONGUARD_FRESH_BUILT:-}" ] || touch "$IRONGUARD_FRESH_BUILT"
# The demo, and beside it the packages of the same build and their systemd check: the demo mostly waits (on DHCP,
# Ironic and its clients), as the systemd check does (on boots, restarts and the watchdog), and one after the other
# they ended the test command's run, 70 s after its tests. They share nothing but the root's files: the demo runs in
# network namespaces of its own from the build's binaries, its /run and /tmp private; the container boots the same
# root with its own /run and /tmp and a private network; the packages are installed while the demo runs from
# target/debug (the demo's install step finds every system package there already, so it runs no apt).
demo_log=$base/demo.log
in_root 'set -euo pipefail
export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd "$SRC"
# The build above, as the test command made it (the same cargo settings: the demo finds its binaries built).
export IRONGUARD_LINTS=0
source scripts/cargo-env.sh
./scripts/demo.sh' >"$demo_log" 2>&1 &
demo_pid=$!
echo "== [fresh root] the demo: started beside the packages ($demo_log)"
rc=0
in_root 'set -euo pipefail
export HOME=/root PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd "$SRC"
echo "== [fresh root] the Debian packages of this build (scripts/package.sh), installed with apt"
t=$(date +%s)
./scripts/package.sh --profile dev --no-build
apt-get install -y -qq --no-install-recommends ./target/debian/*.deb
rm -rf /var/cache/ironguard-debs && mkdir -p /var/cache/ironguard-debs && cp target/debian/*.deb /var/cache/ironguard-debs/
echo "== [fresh root] packages built and installed ($(($(date +%s) - t)) s)"' || rc=$?
# The same root booted under systemd-nspawn: the packages' units under a real systemd, with real DHCP traffic.
[ "$rc" != 0 ] || scripts/systemd-check.sh "$root" /var/cache/ironguard-debs || rc=$?
demo_rc=0
wait "$demo_pid" || demo_rc=$?
echo "== [fresh root] the demo ($( [ "$demo_rc" = 0 ] && echo passed || echo "FAILED ($demo_rc)")):"
sed 's/^/   demo: /' "$demo_log"
[ "$demo_rc" = 0 ] || { echo "fresh-root ($suite): the demo failed" >&2; exit 1; }
[ "$rc" = 0 ] || { echo "fresh-root ($suite): the packages or their systemd check failed" >&2; exit 1; }
echo "== fresh root ($suite): the README's commands passed, the packages installed and checked under systemd; passed ($(($(date +%s) - t0)) s)"
