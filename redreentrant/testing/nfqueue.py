"""A packet delayer: holds the packets of netfilter queues for a while, then lets them go.

Linux-only, and for :mod:`redreentrant.testing.netlab`, which starts it as a process of
its own inside a lab's network namespace, where rules send packets to its queues
(``iptables ... -j NFQUEUE --queue-num Q --queue-bypass``). Each packet of queue ``Q``
is let go (an ``NF_ACCEPT`` verdict) after a delay drawn uniformly from ``[delay -
jitter, delay + jitter]`` milliseconds; verdicts may go out of order, so packets
reorder under jitter. Run as root, by its module name or, since it needs only the
standard library, by its path (what the lab does)::

    python -m redreentrant.testing.nfqueue
    python -I -S .../redreentrant/testing/nfqueue.py

It reads one JSON object a line on stdin, and answers each with a line on stdout,
``{"ok": Q}`` or ``{"error": "..."}``:

- ``{"queue": 5, "delay_ms": 100, "jitter_ms": 20}``: bind queue 5 (or change its delay);
- ``{"queue": 5, "remove": true}``: let its held packets go now, and unbind it.

When stdin closes (its parent is gone, however it went) it lets every held packet go and
exits. A queue that nobody binds passes its packets (``--queue-bypass``), so the rules
may outlive the delayer.

Hand-written over ``AF_NETLINK`` because there is nothing to install instead:
``NetfilterQueue`` ships no wheel (its sdist needs a C compiler and
``libnetfilter-queue``), and ``tc netem`` is missing from kernels built without
``CONFIG_NET_SCH_NETEM``. It needs only metadata (``NFQNL_COPY_META``: the packet id), so
this is a short client of the ``nfnetlink_queue`` protocol (``<linux/netfilter/
nfnetlink_queue.h>``), standard library only.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import random
import select
import socket
import struct
import sys
import time
from typing import Any

__all__ = ["Delayer", "main"]

# <linux/netlink.h>, <linux/netfilter/nfnetlink.h>, <linux/netfilter/nfnetlink_queue.h>
NETLINK_NETFILTER = 12
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_PACKET = 0
_NFQNL_MSG_VERDICT = 1
_NFQNL_MSG_CONFIG = 2
_NFQA_PACKET_HDR = 1
_NFQA_VERDICT_HDR = 2
_NFQA_CFG_CMD = 1
_NFQA_CFG_PARAMS = 2
_NFQA_CFG_MASK = 4
_NFQA_CFG_FLAGS = 5
_NFQNL_CFG_CMD_BIND = 1
_NFQNL_CFG_CMD_UNBIND = 2
_NFQNL_COPY_META = 1
# Fail open: a packet the queue cannot take (full, or our socket buffer full) passes
# rather than being dropped. GSO: big loopback segments come whole, not cut up for us.
_NFQA_CFG_F_FAIL_OPEN = 0x1
_NFQA_CFG_F_GSO = 0x4
_NF_ACCEPT = 1
_NLA_TYPE_MASK = 0x3FFF

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_NFGEN = struct.Struct("!BBH")  # nfgenmsg: family, version, res_id (the queue number)
_ATTR = struct.Struct("=HH")  # nlattr: len, type
_RECV_BUFFER = 4 << 20


def _attr(kind: int, payload: bytes) -> bytes:
    data = _ATTR.pack(_ATTR.size + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def _message(kind: int, flags: int, seq: int, queue: int, attrs: bytes) -> bytes:
    body = _NFGEN.pack(socket.AF_UNSPEC, 0, queue) + attrs
    return (
        _HEADER.pack(_HEADER.size + len(body), (_NFNL_SUBSYS_QUEUE << 8) | kind, flags, seq, 0)
        + body
    )


def _attrs(data: bytes) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    offset = 0
    while offset + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size:
            break
        found[kind & _NLA_TYPE_MASK] = data[offset + _ATTR.size : offset + length]
        offset += (length + 3) & ~3
    return found


class Delayer:
    """The queues bound on one netlink socket, and the verdicts they owe, by due time."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        with contextlib.suppress(OSError):  # FORCE needs root, which binding needs anyway
            self.sock.setsockopt(socket.SOL_SOCKET, 33, _RECV_BUFFER)  # SO_RCVBUFFORCE
        self.sock.bind((0, 0))
        self.delays: dict[int, tuple[float, float]] = {}  # queue -> (delay s, jitter s)
        self.due: list[tuple[float, int, int, int]] = []  # (when, seq, queue, packet id)
        self._seq = 0

    def set(self, queue: int, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay the packets of ``queue`` from now on (binding it first if need be)."""
        if delay_ms < 0 or jitter_ms < 0:
            raise ValueError("delay_ms and jitter_ms must be >= 0")
        if queue not in self.delays:
            self._configure(
                queue, _attr(_NFQA_CFG_CMD, struct.pack("!BxH", _NFQNL_CFG_CMD_BIND, 0))
            )
            flags = struct.pack("!I", _NFQA_CFG_F_FAIL_OPEN | _NFQA_CFG_F_GSO)
            self._configure(
                queue,
                _attr(_NFQA_CFG_PARAMS, struct.pack("!IB", 0, _NFQNL_COPY_META))
                + _attr(_NFQA_CFG_FLAGS, flags)
                + _attr(_NFQA_CFG_MASK, flags),
            )
        self.delays[queue] = (delay_ms / 1000, jitter_ms / 1000)

    def remove(self, queue: int) -> None:
        """Let the held packets of ``queue`` go, and unbind it (an unbound queue's held
        packets would be dropped)."""
        if queue not in self.delays:
            return
        held = [entry for entry in self.due if entry[2] == queue]
        self.due = [entry for entry in self.due if entry[2] != queue]
        heapq.heapify(self.due)
        for _, _, _, packet in held:
            self._verdict(queue, packet)
        del self.delays[queue]
        self._configure(queue, _attr(_NFQA_CFG_CMD, struct.pack("!BxH", _NFQNL_CFG_CMD_UNBIND, 0)))

    def release_all(self) -> None:
        """Let every held packet go now."""
        due, self.due = self.due, []
        for _, _, queue, packet in due:
            self._verdict(queue, packet)

    def timeout(self) -> float | None:
        """Seconds until the next verdict is due, None if none is owed."""
        return max(0.0, self.due[0][0] - time.monotonic()) if self.due else None

    def release_due(self) -> None:
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            _, _, queue, packet = heapq.heappop(self.due)
            self._verdict(queue, packet)

    def receive(self) -> None:
        """Read what the kernel sent: queue each packet's verdict for its due time."""
        try:
            data = self.sock.recv(1 << 16)
        except OSError:  # ENOBUFS: messages were lost; their packets passed (fail open)
            return
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                break
            if kind == (_NFNL_SUBSYS_QUEUE << 8) | _NFQNL_MSG_PACKET:
                _, _, queue = _NFGEN.unpack_from(data, offset + _HEADER.size)
                start = offset + _HEADER.size + _NFGEN.size
                header = _attrs(data[start : offset + length]).get(_NFQA_PACKET_HDR)
                if header is not None:
                    self._hold(queue, struct.unpack_from("!I", header)[0])
            offset += (length + 3) & ~3

    def _hold(self, queue: int, packet: int) -> None:
        delay, jitter = self.delays.get(queue, (0.0, 0.0))
        when = time.monotonic() + max(0.0, random.uniform(delay - jitter, delay + jitter))
        self._seq += 1
        heapq.heappush(self.due, (when, self._seq, queue, packet))

    def _verdict(self, queue: int, packet: int) -> None:
        attrs = _attr(_NFQA_VERDICT_HDR, struct.pack("!II", _NF_ACCEPT, packet))
        with contextlib.suppress(OSError):
            self.sock.send(_message(_NFQNL_MSG_VERDICT, _NLM_F_REQUEST, 0, queue, attrs))

    def _configure(self, queue: int, attrs: bytes) -> None:
        """Send a config message and wait for its acknowledgement; packets that arrive
        meanwhile are held as usual."""
        self._seq += 1
        seq = self._seq
        self.sock.send(_message(_NFQNL_MSG_CONFIG, _NLM_F_REQUEST | _NLM_F_ACK, seq, queue, attrs))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready:
                continue
            data = self.sock.recv(1 << 16, socket.MSG_PEEK)
            _, kind, _, got, _ = _HEADER.unpack_from(data)
            if kind == _NLMSG_ERROR and got == seq:
                self.sock.recv(1 << 16)
                error = -struct.unpack_from("=i", data, _HEADER.size)[0]
                if error:
                    raise OSError(error, f"queue {queue}: {os.strerror(error)}")
                return
            self.receive()
        raise TimeoutError(f"queue {queue}: no answer from nfnetlink_queue")

    def close(self) -> None:
        self.release_all()
        self.sock.close()


def _command(delayer: Delayer, line: str) -> dict[str, Any]:
    try:
        request = json.loads(line)
        queue = int(request["queue"])
        if request.get("remove"):
            delayer.remove(queue)
        else:
            delayer.set(queue, float(request["delay_ms"]), float(request.get("jitter_ms", 0)))
    except (ValueError, LookupError, TypeError, OSError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"ok": queue}


def main() -> None:
    delayer = Delayer()
    stdin = sys.stdin.fileno()
    pending = b""
    try:
        while True:
            ready, _, _ = select.select([stdin, delayer.sock], [], [], delayer.timeout())
            if delayer.sock in ready:
                delayer.receive()
            if stdin in ready:
                chunk = os.read(stdin, 1 << 16)
                if not chunk:
                    return  # our parent is gone
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        answer = _command(delayer, line.decode())
                        sys.stdout.write(json.dumps(answer) + "\n")
                        sys.stdout.flush()
            delayer.release_due()
    finally:
        delayer.close()


if __name__ == "__main__":
    main()
