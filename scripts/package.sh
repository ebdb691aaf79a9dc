#!/usr/bin/env bash
# Builds ironguard's Debian packages (on Debian 12; run scripts/install-deps.sh first):
#   ironguard-agent          /usr/bin/ironguard-agent, ironguard-guard.service, ironguard-agent.service,
#                            /etc/ironguard/agent.toml (conffile)
#   ironguard-controlplane   /usr/bin/ironguard-controlplane, ironguard-controlplane.service,
#                            /etc/ironguard/controlplane.toml (conffile), Prometheus rules, Grafana dashboard
#   ironguardctl             /usr/bin/ironguardctl
# each with its man pages (one per command and subcommand) and bash, zsh and fish completions, generated from the
# clap definitions by ironguard-gen-docs; the daemons also with their sysusers.d file (the ironguard user).
#
# No debhelper or cargo-deb: the packages are staged under target/debian/stage/debian/<package>/ (the layout
# dpkg-shlibdeps expects) and built with `dpkg-deb --build --root-owner-group`. Depends on shared libraries come
# from dpkg-shlibdeps; the maintainer scripts are packaging/debian/*.{postinst,prerm,postrm}; what the packages
# install and why the units are enabled but not started: docs/operations.md, "Installing the packages".
#
#   scripts/package.sh [--profile release|dev] [--no-build] [--compress xz|gzip|zstd|none] [--out DIR]
#     --profile    the cargo profile whose binaries are packaged (default release; dev packages target/debug,
#                  e.g. in CI, where the debug build exists already)
#     --no-build   package the binaries already built for that profile (fails if one is missing)
#     --compress   dpkg-deb's compressor (default xz for release, gzip for dev: xz takes ~40 s per debug binary;
#                  dev packages are gzipped at level 1, as their level 9 took 12 CPU-s for the control plane's
#                  62 MB binary and level 1 1.3 s, for a file 16% larger)
#     --out        where the .deb files go (default target/debian)
# Prints the path of each package built. SOURCE_DATE_EPOCH (default: the last commit's time) dates the man pages,
# and dpkg-deb clamps the files' times to it.
set -euo pipefail
cd "$(dirname "$0")/.."
umask 022

profile=release build=1 compress="" out=target/debian
while (($#)); do
  case "$1" in
    --profile) profile=${2:?--profile needs release or dev}; shift 2 ;;
    --no-build) build=0; shift ;;
    --compress) compress=${2:?--compress needs xz, gzip, zstd or none}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "package.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release) bindir=target/release; compress=${compress:-xz} ;;
  dev) bindir=target/debug; compress=${compress:-gzip} ;;
  *) echo "package.sh: --profile must be release or dev, not $profile" >&2; exit 2 ;;
esac
for tool in cargo dpkg-deb dpkg-shlibdeps strip python3 gzip; do
  command -v "$tool" >/dev/null ||
    { echo "package.sh: $tool is missing (scripts/install-deps.sh installs it: dpkg-dev, binutils, python3)" >&2; exit 1; }
done

version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
homepage=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^repository = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$version" ] && [ -n "$homepage" ] || { echo "package.sh: no version/repository in [workspace.package] of Cargo.toml" >&2; exit 1; }
debversion=$version-1
arch=$(dpkg --print-architecture)
maintainer="ironguard maintainers <ironguard@example.invalid>"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH
mandate=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)

# The packaged binaries are built without test targets, so no dev-dependency enables a crate's `test-hooks`
# feature (the end-to-end tests' fault injection); a binary that carries one of these strings was built with it
# (e.g. by `cargo build --all-targets`, the test build) and is refused below. tests/netns/tests/packaging.rs checks
# this build command and this list.
test_hook_markers=(IRONGUARD_TEST_CRASH ironguard-fault-injection)
if [ "$build" = 1 ]; then
  echo "== package: cargo build --profile $profile"
  cargo build --locked --profile "$profile" --bins \
    -p ironguard-agent -p ironguard-controlplane -p ironguardctl -p ironguard-gen-docs
fi
for b in ironguard-agent ironguard-controlplane ironguardctl ironguard-gen-docs; do
  [ -x "$bindir/$b" ] || { echo "package.sh: $bindir/$b is missing (build it, or drop --no-build)" >&2; exit 1; }
done

work=target/debian/stage
rm -rf "$work"
mkdir -p "$work/debian" "$out"
echo "== package: man pages and completions (ironguard-gen-docs)"
"$bindir/ironguard-gen-docs" --out "$work/gen" --date "$mandate"
# dpkg-shlibdeps reads debian/control from the directory it runs in.
printf 'Source: ironguard\n\nPackage: ironguard-agent\nArchitecture: any\n\nPackage: ironguard-controlplane\nArchitecture: any\n\nPackage: ironguardctl\nArchitecture: any\n' \
  >"$work/debian/control"

# The crates each binary links, for its copyright file: the normal (not dev, not build) dependencies of its
# package, transitively, on this platform, without proc-macro crates (they run in the compiler and are not linked).
# Writes $work/crates-<package>, lines " name version: license".
cargo metadata --locked --format-version 1 --filter-platform "$(rustc -vV | sed -n 's/^host: //p')" |
  python3 -c "$(cat <<'PY'
import json, sys
meta = json.load(sys.stdin)
pkgs = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
members = set(meta["workspace_members"])
for name in sys.argv[2:]:
    root = next(i for i in members if pkgs[i]["name"] == name)
    seen, todo = set(), [root]
    while todo:
        for d in nodes[todo.pop()]["deps"]:
            macro = all("proc-macro" in t["kind"] for t in pkgs[d["pkg"]]["targets"])
            if any(k["kind"] is None for k in d["dep_kinds"]) and not macro and d["pkg"] not in seen:
                seen.add(d["pkg"])
                todo.append(d["pkg"])
    with open(f"{sys.argv[1]}/crates-{name}", "w") as f:
        for i in sorted(seen - members, key=lambda i: (pkgs[i]["name"], pkgs[i]["version"])):
            p = pkgs[i]
            f.write(" %s %s: %s\n" % (p["name"], p["version"], p["license"] or "see the crate"))
PY
)" "$work" ironguard-agent ironguard-controlplane ironguardctl

# stage PACKAGE BINARY: the files every package has (binary, man pages, completions, copyright).
stage() {
  local pkg=$1 bin=$2 root=$work/debian/$1
  install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/share/man/man1" "$root/usr/share/doc/$pkg" \
    "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
    "$root/usr/share/fish/vendor_completions.d"
  # Debug information is dropped (as dh_strip does; the symbol table stays, so backtraces keep function names).
  strip --strip-debug -o "$root/usr/bin/$bin" "$bindir/$bin"
  chmod 0755 "$root/usr/bin/$bin"
  local marker
  for marker in "${test_hook_markers[@]}"; do
    if grep -q -a -F -- "$marker" "$root/usr/bin/$bin"; then
      echo "package.sh: $bindir/$bin carries a test hook ($marker): it was built with the test-hooks feature, as by" \
        "cargo build --all-targets; build it without (drop --no-build, or cargo build --bins -p PACKAGE)" >&2
      exit 1
    fi
  done
  local page
  for page in "$work/gen/man/man1/$bin".1 "$work/gen/man/man1/$bin"-*.1; do
    [ -e "$page" ] || continue
    gzip -9n <"$page" >"$root/usr/share/man/man1/${page##*/}.gz"
  done
  install -m 0644 "$work/gen/completions/bash/$bin" "$root/usr/share/bash-completion/completions/$bin"
  install -m 0644 "$work/gen/completions/zsh/_$bin" "$root/usr/share/zsh/vendor-completions/_$bin"
  install -m 0644 "$work/gen/completions/fish/$bin.fish" "$root/usr/share/fish/vendor_completions.d/$bin.fish"
  python3 - "$root/usr/share/doc/$pkg/copyright" "/usr/bin/$bin" "$homepage" "$work/crates-$pkg" <<'PY'
import sys
out, binary, homepage, crates = sys.argv[1:]
text = open("packaging/debian/copyright").read()
crates = open(crates).read().rstrip("\n")
text = text.replace("@BINARY@", binary).replace("@HOMEPAGE@", homepage).replace("@CRATES@", crates)
open(out, "w").write(text)
PY
}

# daemon PACKAGE UNIT...: a daemon's units and its sysusers.d file (named after the package, so that both daemons
# can be installed on one host: the two files declare the same user, which systemd-sysusers accepts).
daemon() {
  local pkg=$1 root=$work/debian/$1 unit; shift
  install -d "$root/usr/lib/systemd/system" "$root/usr/lib/sysusers.d" "$root/etc/ironguard"
  for unit in "$@"; do install -m 0644 "packaging/systemd/$unit" "$root/usr/lib/systemd/system/$unit"; done
  install -m 0644 packaging/sysusers.d/ironguard.conf "$root/usr/lib/sysusers.d/$pkg.conf"
  local s
  for s in postinst prerm postrm; do install -m 0755 "packaging/debian/$pkg.$s" "$root/DEBIAN/$s"; done
}

stage ironguard-agent ironguard-agent
daemon ironguard-agent ironguard-guard.service ironguard-agent.service
install -m 0644 packaging/etc/agent.toml "$work/debian/ironguard-agent/etc/ironguard/agent.toml"

stage ironguard-controlplane ironguard-controlplane
daemon ironguard-controlplane ironguard-controlplane.service
install -m 0644 packaging/etc/controlplane.toml "$work/debian/ironguard-controlplane/etc/ironguard/controlplane.toml"
install -d "$work/debian/ironguard-controlplane/usr/share/ironguard"
install -m 0644 packaging/prometheus/ironguard-alerts.yml packaging/grafana/ironguard-dashboard.json \
  "$work/debian/ironguard-controlplane/usr/share/ironguard/"

stage ironguardctl ironguardctl

echo "== package: dpkg-deb ($compress)"
for pkg in ironguard-agent ironguard-controlplane ironguardctl; do
  root=$work/debian/$pkg
  bin=$pkg
  shlibs=$(cd "$work" && dpkg-shlibdeps -O -e "debian/$pkg/usr/bin/$bin" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
  [ -n "$shlibs" ] || { echo "package.sh: dpkg-shlibdeps found no shared-library dependency for $bin" >&2; exit 1; }
  if [ -d "$root/etc" ]; then
    (cd "$root" && find etc -type f | sort | sed 's|^|/|') >"$root/DEBIAN/conffiles"
  fi
  # md5sums of everything but the conffiles (as dh_md5sums does).
  (cd "$root" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -print | sed 's|^\./||' | sort |
    xargs md5sum) >"$root/DEBIAN/md5sums"
  size=$(du -sk --apparent-size --exclude=DEBIAN "$root" | cut -f1)
  sed -e "s|@VERSION@|$debversion|" -e "s|@ARCH@|$arch|" -e "s|@MAINTAINER@|$maintainer|" \
    -e "s|@INSTALLED_SIZE@|$size|" -e "s|@SHLIBS@|$shlibs|" -e "s|@HOMEPAGE@|$homepage|" \
    "packaging/debian/$pkg.control" >"$root/DEBIAN/control"
  if grep -q "@[A-Z_]*@" "$root/DEBIAN/control"; then echo "package.sh: unfilled field in $pkg's control file" >&2; exit 1; fi
  deb="$out/${pkg}_${debversion}_$arch.deb"
  level=()
  [ "$profile" = dev ] && [ "$compress" = gzip ] && level=(-z1)
  dpkg-deb --root-owner-group -Z"$compress" "${level[@]}" --build "$root" "$deb" >/dev/null
  echo "$deb"
done
