#!/usr/bin/env python3
"""Delays every packet of one NFQUEUE queue, in order: a slow network path made of the kernel's own queue (this
kernel has no netem). Usage: nfqueue_delay.py QUEUE MAX_MS [SEED]

Packets the rule sends to queue QUEUE (iptables ... -j NFQUEUE --queue-num QUEUE --queue-bypass) are accepted again
after a delay that moves every 500 ms to a new value drawn from 0..MAX_MS; order is kept (a packet never leaves
before one queued earlier). Prints "ready" once bound. Stops on SIGTERM; the rule's --queue-bypass then lets packets
through undelayed. Speaks nfnetlink_queue directly (no library): config (bind, copy metadata only), packet, verdict.
"""
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def attr(kind, payload):
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def message(msg, queue, attrs, flags=NLM_F_REQUEST, seq=0):
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def attrs_of(data):
    out, i = {}, 0
    while i + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, i)
        if length < 4:
            break
        out[kind & 0x7FFF] = data[i + 4 : i + length]
        i += (length + 3) & ~3
    return out


def main():
    queue, max_ms = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else None)
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((0, 0))
    for seq, attrs in enumerate(
        [
            [attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND, 0))],
            [attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))],
        ],
        start=1,
    ):
        s.send(message(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK, seq))
        reply = s.recv(65536)
        length, kind = struct.unpack_from("=IH", reply, 0)
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", reply, 16)
            if err != 0:
                sys.exit(f"nfqueue_delay: binding queue {queue} failed: {os.strerror(-err)}")
    print("ready", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    delay, next_change = 0.0, 0.0
    last_release = 0.0
    pending = []  # (release time, sequence, packet id)
    counter = 0
    while not stop:
        now = time.monotonic()
        while pending and pending[0][0] <= now:
            _, _, pid = heapq.heappop(pending)
            s.send(message(NFQNL_MSG_VERDICT, queue, [attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, pid))]))
        timeout = max(0.0, pending[0][0] - now) if pending else 0.2
        readable, _, _ = select.select([s], [], [], min(timeout, 0.2))
        if not readable:
            continue
        try:
            data = s.recv(1 << 16)
        except InterruptedError:
            continue
        i = 0
        while i + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, i)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                hdr = attrs_of(data[i + 20 : i + length]).get(NFQA_PACKET_HDR)
                if hdr:
                    (pid,) = struct.unpack_from(">I", hdr, 0)
                    now = time.monotonic()
                    if now >= next_change:
                        delay, next_change = rng.uniform(0, max_ms / 1000.0), now + 0.5
                    last_release = max(last_release, now + delay)
                    counter += 1
                    heapq.heappush(pending, (last_release, counter, pid))
            i += (length + 3) & ~3


if __name__ == "__main__":
    main()
