#!/usr/bin/python3
"""Sends one DHCPv6 SOLICIT whose client identifier is a DUID-LL naming DUID_MAC, and reports the ADVERTISE.

Usage: dhcp6_solicit.py IFACE DUID_MAC TIMEOUT
The SOLICIT is sent once the capture that will see the ADVERTISE is running, and TIMEOUT counts from then (it ends
at the first ADVERTISE). It leaves from IFACE's own Ethernet and link-local addresses (so that the server's unicast answer reaches
it) to ff02::1:2, udp 546 -> 547. Its options come in this order: IA_NA, client identifier (DUID-LL), elapsed time.
That order is legal (RFC 8415 fixes none) and puts the DUID's link-layer address 28 bytes into the DHCPv6 message:
exactly where BOOTP's chaddr sits in a DHCPv4 packet (@th,288,48). The filter must identify a DHCPv6 client by its
Ethernet source alone, whatever its DUID says. Prints one JSON object:
{"advertise": bool, "src_mac": str, "at_chaddr_offset": hex}. Runs in a node's namespace as root.
"""
import json
import random
import sys
import threading
import time

# Only the layers used, not scapy.all (a third of its start-up CPU; see dhcp_probe.py).
from scapy.arch import get_if_hwaddr  # noqa: E402
from scapy.config import conf  # noqa: E402
from scapy.layers.inet import UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.sendrecv import AsyncSniffer, sendp  # noqa: E402
from scapy.layers.dhcp6 import (  # noqa: E402
    DUID_LL,
    DHCP6_Advertise,
    DHCP6_Solicit,
    DHCP6OptClientId,
    DHCP6OptElapsedTime,
    DHCP6OptIA_NA,
)

conf.verb = 0
iface, duid_mac, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
src = get_if_hwaddr(iface)


def link_local(name):
    """The interface's link-local address, from /proc/net/if_inet6 (address, index, prefix, scope, flags, name)."""
    with open("/proc/net/if_inet6") as f:
        for line in f:
            addr, _, _, scope, _, dev = line.split()
            if dev == name and scope == "20":
                return ":".join(addr[i : i + 4] for i in range(0, 32, 4))
    sys.exit(f"{name} has no link-local address")


lla = link_local(iface)
trid = random.randint(1, 2**24 - 1)
solicit = (
    DHCP6_Solicit(trid=trid)
    / DHCP6OptIA_NA(iaid=random.randint(1, 2**31))
    / DHCP6OptClientId(duid=DUID_LL(lladdr=duid_mac))
    / DHCP6OptElapsedTime()
)
got = []
capturing = threading.Event()
sniffer = AsyncSniffer(
    iface=iface,
    filter="udp and port 546",
    prn=lambda p: got.append(p) if DHCP6_Advertise in p and p[DHCP6_Advertise].trid == trid else None,
    store=False,
    started_callback=capturing.set,
)
sniffer.start()
# The capture socket (and its BPF filter, which scapy compiles by running tcpdump) must be in place before the
# SOLICIT leaves: on a busy machine that takes far longer than any fixed pause.
CAPTURE_START_LIMIT = 60
if not capturing.wait(CAPTURE_START_LIMIT):
    sys.exit(f"the capture on {iface} did not start within {CAPTURE_START_LIMIT} s")
sendp(
    Ether(src=src, dst="33:33:00:01:00:02") / IPv6(src=lla, dst="ff02::1:2") / UDP(sport=546, dport=547) / solicit,
    iface=iface,
)
deadline = time.time() + timeout
while time.time() < deadline and not got:
    time.sleep(0.05)
sniffer.stop()
print(json.dumps({"advertise": bool(got), "src_mac": src, "at_chaddr_offset": bytes(solicit)[28:34].hex()}))
