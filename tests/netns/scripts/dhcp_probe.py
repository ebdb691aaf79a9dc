#!/usr/bin/python3
"""Sends DHCPDISCOVERs and reports, per DISCOVER, every server that offered.

Usage: dhcp_probe.py IFACE MAC SECONDS INTERVAL [MIN_DISCOVERS]
Sends a DISCOVER every INTERVAL seconds for SECONDS, and on until MIN_DISCOVERS (default 0) have left (a busy
machine sends fewer than SECONDS / INTERVAL), unless SIGTERM ends it first.
Prints one JSON object per line: {"xid": N, "sent": t, "servers": ["10.80.0.1", ...]}. A DISCOVER answered by two
servers is the failure the HA tests look for. The first DISCOVER leaves once the capture is running; after the last
one the capture stays open until every DISCOVER has an answer (and a little longer, for a second server's) or
TAIL seconds have passed. Runs inside a node's network namespace (as root).
"""
import json
import random
import signal
import sys
import threading
import time

# SIGTERM ends the probe early but still reports what was seen; installed before the (slow) scapy import so that
# an early SIGTERM is not a failure.
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())

# Only the layers used (and the bindings they carry: Ether -> IP -> UDP -> BOOTP -> DHCP), not scapy.all: the probe
# starts in a third of the CPU time (0.5 -> 0.2 CPU-s, measured with Debian's python3-scapy), and the HA tests
# start dozens of probes on a busy machine.
from scapy.arch import get_if_hwaddr  # noqa: E402
from scapy.config import conf  # noqa: E402
from scapy.layers.dhcp import BOOTP, DHCP  # noqa: E402
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.sendrecv import AsyncSniffer, sendp  # noqa: E402

conf.verb = 0
iface, mac, seconds, interval = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
min_discovers = int(sys.argv[5]) if len(sys.argv) > 5 else 0
chaddr = bytes.fromhex(mac.replace(":", "")) + b"\x00" * 10
offers = {}
lock = threading.Lock()


def on_packet(p):
    if BOOTP not in p or p[BOOTP].op != 2:
        return
    opts = {o[0]: o[1] for o in p[DHCP].options if isinstance(o, tuple)} if DHCP in p else {}
    if opts.get("message-type") != 2:  # OFFER
        return
    with lock:
        offers.setdefault(p[BOOTP].xid, set()).add(str(opts.get("server_id", p[IP].src)))


capturing = threading.Event()
sniffer = AsyncSniffer(
    iface=iface,
    filter="udp and (port 67 or port 68)",
    prn=on_packet,
    store=False,
    started_callback=capturing.set,
)
sniffer.start()
# The capture socket (and its BPF filter, which scapy compiles by running tcpdump) must be in place before the first
# DISCOVER leaves: on a busy machine that takes far longer than any fixed pause.
CAPTURE_START_LIMIT = 60
if not capturing.wait(CAPTURE_START_LIMIT):
    sys.exit(f"the capture on {iface} did not start within {CAPTURE_START_LIMIT} s")
sent = []
end = time.time() + seconds
while (time.time() < end or len(sent) < min_discovers) and not stop.is_set():
    xid = random.randint(1, 2**31)
    pkt = (
        Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")
        / IP(src="0.0.0.0", dst="255.255.255.255")
        / UDP(sport=68, dport=67)
        / BOOTP(chaddr=chaddr, xid=xid, flags=0x8000)
        / DHCP(options=[("message-type", "discover"), "end"])
    )
    sendp(pkt, iface=iface)
    sent.append((xid, time.time()))
    time.sleep(interval)
# Offers to the last DISCOVERs may still be on their way (or queued for the capture thread on a busy machine).
TAIL, SECOND_OFFER_GRACE = 3.0, 0.5
last = time.time()
while time.time() < last + TAIL:
    with lock:
        all_answered = all(xid in offers for xid, _ in sent)
    if all_answered and time.time() >= last + SECOND_OFFER_GRACE:
        break
    time.sleep(0.05)
sniffer.stop()
with lock:
    for xid, t in sent:
        print(json.dumps({"xid": xid, "sent": t, "servers": sorted(offers.get(xid, set()))}))
