"""Just enough HTTP/2 to speak to a gRPC server from a raw socket (RFC 9113, RFC 7541).

Frames are ``length(3) type(1) flags(1) stream id(4)`` then the payload. Header blocks
use HPACK literals without indexing or Huffman coding, which every decoder accepts. A
gRPC message is ``compressed flag(1) length(4, big-endian)`` then the bytes; the tests
declare lengths they never send.
"""

from __future__ import annotations

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream_id)
        + payload
    )


def _literal(name: str, value: str) -> bytes:
    def string(text: str) -> bytes:
        raw = text.encode()
        assert len(raw) < 127  # one-byte length prefix is enough here
        return bytes([len(raw)]) + raw

    return b"\x00" + string(name) + string(value)


def request_headers(address: str, method: str) -> bytes:
    """A HEADERS frame (stream 1) opening a gRPC call of ``method`` (``/pkg.Svc/Name``)."""
    block = b"".join(
        _literal(name, value)
        for name, value in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method),
            (":authority", address),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    return frame(HEADERS, END_HEADERS, 1, block)


def grpc_message_prefix(declared_length: int) -> bytes:
    return b"\x00" + struct.pack(">I", declared_length)


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def frames_until_closed(sock: socket.socket, timeout_s: float) -> list[int]:
    """The types of the frames the server sends until it ends stream 1 (RST_STREAM, or
    HEADERS with END_STREAM: the trailers), closes the connection, or ``timeout_s``."""
    kinds: list[int] = []
    buffer = b""
    deadline = time.monotonic() + timeout_s
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65_536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        buffer += chunk
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags = buffer[3], buffer[4]
            stream_id = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            buffer = buffer[9 + length :]
            kinds.append(kind)
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK, 0, b""))
            if stream_id == 1 and (kind == RST_STREAM or (kind == HEADERS and flags & END_STREAM)):
                return kinds
            if kind == GOAWAY:
                return kinds
    return kinds
