#!/usr/bin/python3
"""Sends DHCPDISCOVERs and reports, per DISCOVER, every server that offered.

Usage: dhcp_probe.py IFACE MAC SECONDS INTERVAL
Prints one JSON object per line: {"xid": N, "sent": t, "servers": ["10.80.0.1", ...]}. A DISCOVER answered by two
servers is the failure the HA tests look for. Runs inside a node's network namespace (as root).
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

from scapy.all import BOOTP, DHCP, IP, UDP, Ether, AsyncSniffer, conf, get_if_hwaddr, sendp  # noqa: E402

conf.verb = 0
iface, mac, seconds, interval = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
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


sniffer = AsyncSniffer(iface=iface, filter="udp and (port 67 or port 68)", prn=on_packet, store=False)
sniffer.start()
time.sleep(0.3)
sent = []
end = time.time() + seconds
while time.time() < end and not stop.is_set():
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
time.sleep(1.0)
sniffer.stop()
with lock:
    for xid, t in sent:
        print(json.dumps({"xid": xid, "sent": t, "servers": sorted(offers.get(xid, set()))}))
