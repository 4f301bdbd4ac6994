"""Kafka requests on raw sockets, for tests that must see what the listener answers as
sent (kafka-python's protocol classes build and decode the frames; for the APIs
kafka-python lacks, such as KIP-932's share groups, ``kio_frame``/``kio_answer`` use the
listener's own kio codec with plain values)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import os
import socket
import struct
import time
from typing import Any

from kafka.protocol.consumer import (
    FetchRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
)
from kafka.protocol.producer import ProduceRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kio.serial import entity_reader, entity_writer

from tidelog.broker.kafka.codec import _request_schema as request_schema
from tidelog.broker.kafka.codec import _response_schema as response_schema
from tidelog.broker.kafka.codec import build, to_plain
from tidelog.storage.records import BatchBuilder


def fetch_request(
    topic: str,
    *,
    max_wait_ms: int = 0,
    max_bytes: int = 1 << 20,
    offsets: list[int] | None = None,
    partition_max_bytes: int | None = None,
    isolation_level: int = 0,
) -> Any:
    """Fetch v11 of ``topic``: partition ``i`` from ``offsets[i]`` (default: partition 0
    from offset 0), each up to ``partition_max_bytes`` (default ``max_bytes``)."""
    per_partition = max_bytes if partition_max_bytes is None else partition_max_bytes
    return FetchRequest[11](
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=[
            FetchRequest.FetchTopic(
                topic=topic,
                partitions=[
                    FetchRequest.FetchTopic.FetchPartition(
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=per_partition,
                    )
                    for partition, offset in enumerate(offsets or [0])
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def produce_request(topic: str, value: bytes, *, acks: int = -1) -> Any:
    """Produce v7 of one record (``value``, no key) to partition 0 of ``topic``."""
    builder = BatchBuilder()
    builder.append(int(time.time() * 1000), None, value)
    return ProduceRequest[7](
        acks=acks,
        timeout_ms=5_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(
                        index=0, records=builder.build()
                    )
                ],
            )
        ],
    )


def offset_commit_request(
    group: str, topic: str, offsets: dict[int, tuple[int, int]], *, version: int = 8
) -> Any:
    """OffsetCommit ``version`` (6+) of ``partition -> (offset, committed leader epoch)``,
    as a consumer outside any group (generation -1, no member id), metadata "m"."""
    request_class = OffsetCommitRequest[version]
    return request_class(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=[
            request_class.OffsetCommitRequestTopic(
                name=topic,
                partitions=[
                    request_class.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=partition,
                        committed_offset=offset,
                        committed_leader_epoch=epoch,
                        committed_metadata="m",
                    )
                    for partition, (offset, epoch) in offsets.items()
                ],
            )
        ],
    )


def offset_fetch_request(group: str, topic: str, partitions: list[int], *, version: int) -> Any:
    """OffsetFetch ``version`` (5-7: one group, not the batched v8+ form)."""
    request_class = OffsetFetchRequest[version]
    return request_class(
        group_id=group,
        topics=[request_class.OffsetFetchRequestTopic(name=topic, partition_indexes=partitions)],
        require_stable=False,
    )


def offset_for_leader_epoch_request(
    topic: str, epochs: dict[int, int], *, version: int = 4, current_leader_epoch: int = -1
) -> Any:
    """OffsetForLeaderEpoch ``version`` (3+), as a consumer, of ``partition -> epoch``."""
    request_class = OffsetForLeaderEpochRequest[version]
    return request_class(
        replica_id=-1,
        topics=[
            request_class.OffsetForLeaderTopic(
                topic=topic,
                partitions=[
                    request_class.OffsetForLeaderTopic.OffsetForLeaderPartition(
                        partition=partition,
                        current_leader_epoch=current_leader_epoch,
                        leader_epoch=epoch,
                    )
                    for partition, epoch in epochs.items()
                ],
            )
        ],
    )


def frame(request: Any, client_id: str, correlation_id: int = 1) -> bytes:
    """``request`` framed with its header."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))


def kio_frame(
    api_key: int, version: int, body: dict[str, Any], client_id: str, correlation_id: int = 1
) -> bytes:
    """A flexible request (header v2) of ``api_key`` ``version`` built from plain values
    by the listener's codec, framed."""
    out = io.BytesIO()
    name = client_id.encode()
    out.write(struct.pack(">hhih", api_key, version, correlation_id, len(name)) + name + b"\0")
    entity_writer(request_schema(api_key, version))(
        out, build(request_schema(api_key, version), body)
    )
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def kio_answer(api_key: int, version: int, answer: bytes) -> dict[str, Any]:
    """A flexible response frame (header v1: correlation id, no tags) as plain values."""
    assert answer[4] == 0, "a response header with tags"
    entity, _ = entity_reader(response_schema(api_key, version))(answer, 5)
    plain = to_plain(entity)
    assert isinstance(plain, dict)
    return plain


def read_exactly(sock: socket.socket, count: int) -> bytes | None:
    """``count`` bytes from ``sock``, or None if the peer hung up first."""
    data = b""
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def read_frame(sock: socket.socket) -> bytes | None:
    """One response frame (header and body) from ``sock``; None if the peer hung up."""
    prefix = read_exactly(sock, 4)
    if prefix is None:
        return None
    return read_exactly(sock, struct.unpack(">i", prefix)[0])


def call(sock: socket.socket, request: Any, client_id: str) -> bytes | None:
    """One request on ``sock``; its response frame, or None if the broker hung up."""
    sock.sendall(frame(request, client_id))
    return read_frame(sock)


class SaslSession:
    """A raw Kafka connection (plain or TLS ``sock``) that logs in with SCRAM-SHA-256 or
    -512 (SaslHandshake v1, SaslAuthenticate v1) and then sends decoded requests."""

    def __init__(self, sock: socket.socket, client_id: str) -> None:
        self.sock = sock
        self.client_id = client_id
        self.correlation_id = 0
        self.session_lifetime_ms = 0  # the last login's answer (KIP-368)

    def call(self, request: Any, response_class: Any) -> Any:
        """One request, its decoded response; ``ConnectionError`` if the broker hung up."""
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id, client_id=self.client_id)
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        answer = read_frame(self.sock)
        if answer is None:
            raise ConnectionError("the broker hung up")
        return response_class[request.version].decode(answer, header=True)

    def call_plain(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        """One request built by the listener's codec (``kio_frame``), its plain answer."""
        self.correlation_id += 1
        self.sock.sendall(kio_frame(api_key, version, body, self.client_id, self.correlation_id))
        answer = read_frame(self.sock)
        if answer is None:
            raise ConnectionError("the broker hung up")
        assert struct.unpack(">i", answer[:4])[0] == self.correlation_id
        return kio_answer(api_key, version, answer)

    def login(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> Any:
        """SCRAM from the handshake on; the last SaslAuthenticate answer (its
        ``error_code`` is 0 unless the server's last step refused)."""
        handshake = self.call(SaslHandshakeRequest[1](mechanism=mechanism), SaslHandshakeResponse)
        if handshake.error_code:
            return handshake
        digest = "sha256" if mechanism.endswith("256") else "sha512"
        nonce = base64.b64encode(os.urandom(18)).decode()
        first_bare = f"n={user},r={nonce}"
        first = self._authenticate(f"n,,{first_bare}".encode())
        if first.error_code:
            return first
        server_first = bytes(first.auth_bytes).decode()
        fields = dict(item.split("=", 1) for item in server_first.split(","))
        salted = hashlib.pbkdf2_hmac(
            digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
        )
        client_key = hmac.digest(salted, b"Client Key", digest)
        stored_key = hashlib.new(digest, client_key).digest()
        without_proof = f"c=biws,r={fields['r']}"
        message = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(stored_key, message, digest)
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
        final = self._authenticate(f"{without_proof},p={proof.decode()}".encode())
        self.session_lifetime_ms = final.session_lifetime_ms
        return final

    def _authenticate(self, token: bytes) -> Any:
        return self.call(SaslAuthenticateRequest[1](auth_bytes=token), SaslAuthenticateResponse)

    def close(self) -> None:
        self.sock.close()
