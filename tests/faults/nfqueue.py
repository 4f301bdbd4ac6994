"""The nfnetlink_queue messages the delayer needs, as bytes (issue #29); pure, no socket.

Netfilter's NFQUEUE hands packets that an nftables ``queue`` rule matched to a userspace
process over a ``NETLINK_NETFILTER`` socket; the process answers each by its id with a
verdict (accept or drop), in any order. These functions build and parse those messages
with ``struct`` only: the bindings (NetfilterQueue wraps libnetfilter_queue in C and
needs its headers and a compiler at install) would be a native dependency for a handful
of fixed layouts. The socket itself lives in ``delayer.py``. Layouts (``linux/netlink.h``,
``linux/netfilter/nfnetlink.h``, ``linux/netfilter/nfnetlink_queue.h``; host byte order
unless marked big-endian):

* netlink header, 16 bytes: ``len`` u32 (header included), ``type`` u16, ``flags`` u16,
  ``seq`` u32, ``pid`` u32. Type ``(NFNL_SUBSYS_QUEUE << 8) | msg`` for queue messages,
  ``NLMSG_ERROR`` (2) for an answer carrying an errno (0: an ACK).
* nfgenmsg, 4 bytes: ``family`` u8 (``AF_UNSPEC``), ``version`` u8 (0), ``res_id`` u16
  big-endian: the queue number.
* attributes, each ``len`` u16 (its 4-byte header included, padding excluded), ``type``
  u16, the payload, padded to 4 bytes. Those used:

  - CONFIG ``NFQA_CFG_CMD`` (1): ``command`` u8 (1 bind, 2 unbind), pad u8, ``pf`` u16
    big-endian; ``NFQA_CFG_PARAMS`` (2): ``copy_range`` u32 big-endian, ``copy_mode`` u8
    (1: metadata only, no payload); ``NFQA_CFG_QUEUE_MAXLEN`` (3): u32 big-endian;
    ``NFQA_CFG_MASK`` (4) and ``NFQA_CFG_FLAGS`` (5): u32 big-endian each
    (``FAIL_OPEN`` 1: accept rather than drop when the queue is full or a message cannot
    be delivered; ``GSO`` 4: hand over GSO packets whole instead of segmenting them).
  - PACKET ``NFQA_PACKET_HDR`` (1): ``packet_id`` u32 big-endian, ``hw_protocol`` u16
    big-endian, ``hook`` u8.
  - VERDICT ``NFQA_VERDICT_HDR`` (2): ``verdict`` u32 big-endian (0 drop, 1 accept),
    ``id`` u32 big-endian.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "NETLINK_NETFILTER",
    "NF_ACCEPT",
    "NF_DROP",
    "Message",
    "bind_messages",
    "error_code",
    "packet_id",
    "parse",
    "verdict_message",
]

NETLINK_NETFILTER = 12
NF_DROP = 0
NF_ACCEPT = 1

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
PACKET_TYPE = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 0x1
NFQA_CFG_F_GSO = 0x4

_HEADER = struct.Struct("=IHHII")
_ATTRIBUTE = struct.Struct("=HH")


@dataclass(frozen=True, slots=True)
class Message:
    """One netlink message: its type, flags, sequence number and payload (after the
    16-byte header)."""

    type: int
    flags: int
    seq: int
    payload: bytes


def _align(length: int) -> int:
    return (length + 3) & ~3


def _attribute(kind: int, payload: bytes) -> bytes:
    length = _ATTRIBUTE.size + len(payload)
    return _ATTRIBUTE.pack(length, kind) + payload + b"\0" * (_align(length) - length)


def _message(msg: int, flags: int, seq: int, queue: int, attributes: bytes) -> bytes:
    if not 0 <= queue <= 0xFFFF:
        raise ValueError(f"a queue number is 0..65535: {queue}")
    body = struct.pack("=BB", 0, 0) + struct.pack(">H", queue) + attributes
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg
    return _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0) + body


def bind_messages(queue: int, *, max_length: int, first_seq: int = 1) -> list[bytes]:
    """The CONFIG messages that bind this socket to ``queue``: bind, metadata-only copy,
    the kernel-side queue length ``max_length``, and the fail-open and GSO flags. Each
    asks for an ACK (``NLM_F_ACK``), sequence numbers from ``first_seq``."""
    if max_length < 1:
        raise ValueError(f"max_length must be positive: {max_length}")
    flags = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO
    bodies = [
        _attribute(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_BIND, 0)),
        _attribute(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)),
        _attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", max_length)),
        _attribute(NFQA_CFG_MASK, struct.pack(">I", flags))
        + _attribute(NFQA_CFG_FLAGS, struct.pack(">I", flags)),
    ]
    return [
        _message(NFQNL_MSG_CONFIG, NLM_F_ACK, first_seq + i, queue, body)
        for i, body in enumerate(bodies)
    ]


def verdict_message(queue: int, packet: int, verdict: int, *, seq: int = 0) -> bytes:
    """The VERDICT for packet id ``packet`` of ``queue`` (``NF_ACCEPT`` or ``NF_DROP``);
    no ACK asked (errors still come back as ``NLMSG_ERROR``)."""
    if verdict not in (NF_ACCEPT, NF_DROP):
        raise ValueError(f"verdict must be NF_ACCEPT or NF_DROP: {verdict}")
    header = struct.pack(">II", verdict, packet & 0xFFFFFFFF)
    return _message(NFQNL_MSG_VERDICT, 0, seq, queue, _attribute(NFQA_VERDICT_HDR, header))


def parse(data: bytes) -> list[Message]:
    """The netlink messages in one datagram; raises ``ValueError`` on a truncated one."""
    messages = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, flags, seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise ValueError(f"truncated netlink message at {offset}: length {length}")
        messages.append(Message(kind, flags, seq, data[offset + _HEADER.size : offset + length]))
        offset += _align(length)
    return messages


def _attributes(payload: bytes) -> dict[int, bytes]:
    found = {}
    offset = 4  # after nfgenmsg
    while offset + _ATTRIBUTE.size <= len(payload):
        length, kind = _ATTRIBUTE.unpack_from(payload, offset)
        if length < _ATTRIBUTE.size or offset + length > len(payload):
            raise ValueError(f"truncated netlink attribute at {offset}: length {length}")
        # The top two bits are the nested and byte-order flags, not part of the type.
        found[kind & 0x3FFF] = payload[offset + _ATTRIBUTE.size : offset + length]
        offset += _align(length)
    return found


def packet_id(message: Message) -> int | None:
    """The packet id of a PACKET message, None for any other message."""
    if message.type != PACKET_TYPE:
        return None
    header = _attributes(message.payload).get(NFQA_PACKET_HDR)
    if header is None or len(header) < 4:
        raise ValueError("a queued packet without NFQA_PACKET_HDR")
    (found,) = struct.unpack_from(">I", header)
    return int(found)


def error_code(message: Message) -> int | None:
    """The errno of an ``NLMSG_ERROR`` message (0 is an ACK); None for other messages."""
    if message.type != NLMSG_ERROR:
        return None
    if len(message.payload) < 4:
        raise ValueError("a netlink error message without its code")
    (code,) = struct.unpack_from("=i", message.payload)
    return -int(code)
