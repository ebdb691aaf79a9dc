#!/usr/bin/python3
"""A PXE ROM's two exchanges with a proxyDHCP server, each reported on its own.

Usage: pxe_probe.py IFACE MAC SERVER OFFER_WAIT ACK_WAIT [BOOT_TYPE]
  1. udp/67: a PXE DHCPDISCOVER (vendor class "PXEClient", client architecture, UUID), broadcast from 0.0.0.0 as a
     ROM sends it once the capture that will see the answer is running; waits up to OFFER_WAIT seconds for a proxy
     offer (an OFFER naming the PXE service, no address).
  2. udp/4011: a PXE DHCPREQUEST for boot item BOOT_TYPE (the first type the proxy offer's boot menu names, else
     BOOT_TYPE, default 0x8000 (dnsmasq's first --pxe-service), layer 0), unicast from the interface's address to
     SERVER:4011 through a kernel UDP socket bound before it is sent; waits up to ACK_WAIT seconds for the ACK.
Each wait ends at the first answer: a long one costs time only when no answer comes.
Prints one JSON object: {"offer": bool, "offer_server": str|null, "boot_types": [int], "ack": bool,
"ack_file": str|null}. The Ethernet source and the BOOTP chaddr are both MAC. Runs in a node's namespace as root;
the interface must already carry MAC and an IPv4 address for step 2.
"""
import json
import random
import socket
import struct
import sys
import threading
import time

# Only the layers used, not scapy.all (a third of its start-up CPU; see dhcp_probe.py).
from scapy.arch import get_if_addr  # noqa: E402
from scapy.config import conf  # noqa: E402
from scapy.layers.dhcp import BOOTP, DHCP  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.sendrecv import AsyncSniffer, sendp  # noqa: E402

conf.verb = 0
iface, mac, server = sys.argv[1], sys.argv[2], sys.argv[3]
offer_wait, ack_wait = float(sys.argv[4]), float(sys.argv[5])
default_type = int(sys.argv[6], 0) if len(sys.argv) > 6 else 0x8000
chaddr = bytes.fromhex(mac.replace(":", "")) + b"\x00" * 10
uuid = bytes([0]) + bytes(random.getrandbits(8) for _ in range(16))
pxe_opts = [
    ("vendor_class_id", b"PXEClient:Arch:00000:UNDI:002001"),
    (93, b"\x00\x00"),  # client system architecture: x86 BIOS
    (94, b"\x01\x02\x01"),  # client network interface identifier: UNDI 2.1
    (97, uuid),  # client machine identifier
]


def suboptions(data):
    """Parses option 43 (PXE vendor options) into {code: bytes}."""
    out, i = {}, 0
    while i + 1 < len(data) and data[i] != 255:
        if data[i] == 0:
            i += 1
            continue
        code, n = data[i], data[i + 1]
        out[code] = data[i + 2 : i + 2 + n]
        i += 2 + n
    return out


def options(p):
    return {o[0]: o[1] for o in p[DHCP].options if isinstance(o, tuple)} if DHCP in p else {}


# 1. DISCOVER on udp/67.
CAPTURE_START_LIMIT = 60
capturing = threading.Event()
xid = random.randint(1, 2**31)
offers = []
sniffer = AsyncSniffer(
    iface=iface,
    filter="udp and (port 67 or port 68)",
    prn=lambda p: offers.append(p)
    if BOOTP in p and p[BOOTP].op == 2 and p[BOOTP].xid == xid and options(p).get("message-type") == 2
    else None,
    store=False,
    started_callback=capturing.set,
)
sniffer.start()
# The capture socket (and its BPF filter, which scapy compiles by running tcpdump) must be in place before the
# DISCOVER leaves: on a busy machine that takes far longer than any fixed pause.
if not capturing.wait(CAPTURE_START_LIMIT):
    sys.exit(f"the capture on {iface} did not start within {CAPTURE_START_LIMIT} s")
sendp(
    Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")
    / IP(src="0.0.0.0", dst="255.255.255.255")
    / UDP(sport=68, dport=67)
    / BOOTP(chaddr=chaddr, xid=xid, flags=0x8000)
    / DHCP(options=[("message-type", "discover")] + pxe_opts + ["end"]),
    iface=iface,
)
deadline = time.time() + offer_wait
while time.time() < deadline and not offers:
    time.sleep(0.05)
sniffer.stop()
result = {"offer": False, "offer_server": None, "boot_types": [], "ack": False, "ack_file": None}
if offers:
    o = options(offers[0])
    result["offer"] = True
    result["offer_server"] = str(o.get("server_id", offers[0][IP].src))
    menu = suboptions(bytes(o.get("vendor_specific", b""))).get(9, b"")  # PXE_BOOT_MENU: type(2) len(1) text
    i = 0
    while i + 3 <= len(menu):
        result["boot_types"].append(struct.unpack("!H", menu[i : i + 2])[0])
        i += 3 + menu[i + 2]

# 2. REQUEST on udp/4011, unicast, for a boot item.
boot_type = result["boot_types"][0] if result["boot_types"] else default_type
ip = get_if_addr(iface)
vendor = bytes([71, 4]) + struct.pack("!HH", boot_type, 0) + b"\xff"  # PXE_BOOT_ITEM
request = BOOTP(ciaddr=ip, chaddr=chaddr, xid=random.randint(1, 2**31)) / DHCP(
    options=[("message-type", "request")] + pxe_opts + [("vendor_specific", vendor), "end"]
)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((ip, 68))
s.settimeout(0.2)
s.sendto(bytes(request), (server, 4011))
deadline = time.time() + ack_wait
while time.time() < deadline:
    try:
        data, _ = s.recvfrom(4096)
    except socket.timeout:
        continue
    reply = BOOTP(data)
    if reply.op == 2 and reply.xid == request.xid and options(reply).get("message-type") == 5:
        result["ack"] = True
        result["ack_file"] = reply.file.rstrip(b"\x00").decode(errors="replace") or None
        break
print(json.dumps(result))
