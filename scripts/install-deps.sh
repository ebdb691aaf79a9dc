#!/usr/bin/env bash
# Installs every system package ironguard's demo and tests need on Debian 12 (run as root). Idempotent: packages
# already present are not fetched again.
set -euo pipefail

packages=(
  nftables iptables ipset iproute2 util-linux procps   # the kernel's firewall tools (ipset: the ipset backend), ip netns, setpriv
  dnsmasq-base busybox-static                     # a real DHCP server and a real DHCP client (udhcpc); static busybox
                                                  # also serves as the init of the qemu guest (scripts/guest-kernel.sh)
  isc-dhcp-client                                 # a real DHCPv6 client (dhclient -6)
  isc-dhcp-server                                 # a real DHCP server on raw (AF_PACKET) sockets (ISC dhcpd)
  qemu-system-x86 kmod xz-utils zstd              # stock Debian kernels (12's 6.1, 13's 6.12) under qemu: the ipset
                                                  # backend's tests and the egress dataplane on kernels before 6.16
                                                  # (xz, zstd: the modules Debian 13 compresses, for the guest's initrd)
  jq                                              # reads ironguardctl's JSON in the qemu guest's test scripts
  etcd-server etcd-client                         # the coordination service for HA tests
  mariadb-server                                  # the database several Ironic conductors share (tests/netns/src/mariadb.rs:
                                                  # a private mariadbd per test, never the host's service)
  python3-scapy tcpdump                           # crafted (relayed) DHCP packets; tcpdump compiles scapy's BPF filters
  python3 python3-venv                            # the real Ironic 39 and OpenStack clients (scripts/ironic-venv.sh)
  mmdebstrap                                      # the test command's fresh Debian 12 root (scripts/fresh-root.sh)
  libclang-dev clang protobuf-compiler libprotobuf-dev  # bindgen; protoc and its well-known .proto files (etcd-client)
  systemd                                         # systemd-analyze / systemd-sysusers verify the units
  systemd-container                               # systemd-nspawn: the packages under a real systemd (scripts/systemd-check.sh)
  dpkg-dev                                        # dpkg-shlibdeps: the packages' Depends (scripts/package.sh)
  openssl                                         # the certificates of the demo (scripts/make-certs.sh)
  build-essential pkg-config ca-certificates curl git
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Do not let package scripts start services (etcd, MariaDB) on the host: tests start their own in namespaces.
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; created_policy=1; fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "installing the Rust toolchain with rustup (Debian 12's rustc is too old for this workspace)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi
