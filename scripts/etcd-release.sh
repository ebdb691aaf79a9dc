#!/usr/bin/env bash
# Fetches (once) Debian 13's etcd-server package and prints the path of its etcd binary. Debian 12's etcd-server
# (3.4, scripts/install-deps.sh) is on PATH for every test; the etcd-backed tests that name Debian 13's release
# (tests/netns/src/etcd.rs, `EtcdRelease::Debian13`) run this one beside it, so that both the 3.4 and the 3.5
# servers a site may run are proven in one run.
#
# The package is a plain Debian package, taken from Debian's pool at the version and SHA-256 below (trixie's
# Packages index), unpacked with dpkg-deb, never installed: nothing on the host changes but the cache
# ($IRONGUARD_ETCD_CACHE, default /var/cache/ironguard). Needs curl, dpkg-deb and deb.debian.org.
set -euo pipefail
version=3.5.16-4
sha256=0875921bb0d023f2af9b8e15cdfbe417a03e65731345fb832c40f9c2dd72967b
mirror=${IRONGUARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${IRONGUARD_ETCD_CACHE:-/var/cache/ironguard}
dir=$cache/etcd-server-$version
bin=$dir/usr/bin/etcd

ready() { [ -x "$bin" ] && [ -f "$dir/.ironguard-sha256" ] && [ "$(cat "$dir/.ironguard-sha256")" = "$sha256" ]; }
if ready; then echo "$bin"; exit 0; fi

mkdir -p "$cache"
exec 9>"$dir.lock"
flock 9
if ready; then echo "$bin"; exit 0; fi   # another run fetched it while this one waited

deb=$(mktemp "$cache/etcd-server.XXXXXX.deb")
trap 'rm -f "$deb"' EXIT
url=$mirror/pool/main/e/etcd/etcd-server_${version}_amd64.deb
echo "etcd-release: fetching $url" >&2
curl -fsS --retry 3 --max-time 300 -o "$deb" "$url" || {
  echo "etcd-release: cannot fetch $url (Debian 13's etcd-server $version): the etcd 3.5 tests need it" >&2
  exit 1
}
got=$(sha256sum "$deb" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
  echo "etcd-release: $url has SHA-256 $got, not $sha256 (trixie's Packages index): refused" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir"
dpkg-deb -x "$deb" "$dir"
"$bin" --version >&2
echo "$sha256" >"$dir/.ironguard-sha256"
echo "$bin"
