#!/usr/bin/env bash
# Makes (once) the Python virtual environment with a real OpenStack Ironic 39 and the clients that talk to it and
# to ironguard's inspector API, and prints its path. The end-to-end tests and the demo use it:
#   ironic, ironic-dbsync                     the real Ironic (standalone, noauth, fake-hardware, sqlite)
#   baremetal (python-ironicclient)           Ironic's own CLI
#   openstack baremetal introspection ...     python-ironic-inspector-client + python-openstackclient
#   ironic_python_agent.inspector             ironic-python-agent's own callback code
#   keystone, keystone-manage, gunicorn       a real Keystone (sqlite, fernet tokens) served by a WSGI server, for
#                                             the inspector API's `auth_strategy = "keystone"` (tests/netns/src/keystone.rs)
#   PyMySQL                                   the MariaDB driver of several conductors sharing one database
#                                             (`mysql+pymysql://`, tests/netns/src/mariadb.rs)
# Every package version is pinned in tests/ironic/constraints.txt (the set this project was tested with). The
# environment is cached in $IRONGUARD_IRONIC_VENV (default /var/cache/ironguard/ironic-39.0.0-<hash of the
# constraints>: checkouts with different constraints, e.g. two branches' worktrees, each keep their own instead of
# rebuilding one in turn under each other's running tests) and rebuilt only when the constraints change. Needs
# Debian's python3 and python3-venv (scripts/install-deps.sh) and PyPI.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
constraints=$here/tests/ironic/constraints.txt
venv=${IRONGUARD_IRONIC_VENV:-/var/cache/ironguard/ironic-39.0.0-$(sha256sum "$constraints" | cut -c1-12)}
packages=(ironic python-ironicclient python-ironic-inspector-client python-openstackclient ironic-python-agent keystone gunicorn
          PyMySQL)
stamp=$venv/.ironguard-constraints

ready() { [ -x "$venv/bin/ironic" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$constraints"; }
# An environment made without compiling (below), now used where Python keeps nothing it compiles: compiled once here.
uncompiled=$venv/.ironguard-not-compiled
if ready && [ -f "$uncompiled" ] && [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  exec 9>"$venv.lock"
  flock 9
  if [ -f "$uncompiled" ]; then
    echo "ironic-venv: compiling $venv (PYTHONDONTWRITEBYTECODE is set: Python keeps nothing it compiles)" >&2
    "$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null || true
    rm -f "$uncompiled"
  fi
fi
if ready; then echo "$venv"; exit 0; fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ready; then echo "$venv"; exit 0; fi   # another run made it while this one waited

python=/usr/bin/python3
[ -x "$python" ] || { echo "ironic-venv: $python is missing (scripts/install-deps.sh installs python3-venv)" >&2; exit 1; }
echo "ironic-venv: creating $venv (Ironic 39, Keystone and the OpenStack clients from PyPI; about two minutes)" >&2
t0=$(date +%s)
rm -rf "$venv"
"$python" -m venv "$venv"
# Where Python keeps what it compiles at first import (__pycache__), pip need not compile every module up front
# (29 -> 18 CPU-s from pip's cache; most modules are never imported here). Where PYTHONDONTWRITEBYTECODE is set (as
# on the CI machines) nothing compiled at import would be kept, and every Ironic, Keystone and OpenStack client
# process would compile its imports again (tried: the tests cost 718 CPU-s instead of 493), so pip compiles all.
compile=()
[ -n "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=(--no-compile)
"$venv/bin/pip" install --quiet "${compile[@]}" --disable-pip-version-check --no-input -c "$constraints" "${packages[@]}" >&2
[ "${#compile[@]}" = 0 ] || touch "$uncompiled"
cp "$constraints" "$stamp"
echo "ironic-venv: ready in $(($(date +%s) - t0)) s" >&2
echo "$venv"
