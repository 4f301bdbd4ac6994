"""A correct client that produces and consumes while the broker is under attack.

One thread: the real ``Producer`` (``acks="all"``, idempotent) sends numbered values to
one partition, the real ``Consumer`` reads them back. ``stop`` returns what went wrong:
nothing, when every acknowledged value was read back once, in order.
"""

from __future__ import annotations

import threading
import time

import grpc

from tidelog.client import Consumer, Producer, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

CANARY_TOPIC = "canary"


class Canary:
    """Thread-safe to ``start`` and ``stop`` from the test's thread."""

    def __init__(self, address: str, *, topic: str = CANARY_TOPIC, pause_s: float = 0.02) -> None:
        """Creates ``topic`` (one partition) unless it exists."""
        self._address = address
        self._topic = topic
        with grpc.insecure_channel(address) as channel:
            try:
                pb_grpc.BrokerStub(channel).CreateTopic(
                    pb.CreateTopicRequest(name=topic, partitions=1), timeout=30
                )
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
        self._pause_s = pause_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="canary", daemon=True)
        self.errors: list[str] = []
        self.acknowledged: list[bytes] = []
        self.consumed: list[bytes] = []
        self.slowest_ack_s = 0.0

    def start(self) -> Canary:
        self._thread.start()
        return self

    def _run(self) -> None:
        tp = TopicPartition(self._topic, 0)
        try:
            with (
                Producer(self._address, client_id="canary", linger_ms=0) as producer,
                Consumer(
                    self._address, client_id="canary", auto_offset_reset="earliest"
                ) as consumer,
            ):
                consumer.assign([tp])
                n = 0
                while not self._stop.is_set():
                    value = f"canary-{n}".encode()
                    started = time.monotonic()
                    try:
                        producer.send(self._topic, value, partition=0).result(timeout=30)
                    except Exception as exc:
                        self.errors.append(f"produce {value!r}: {exc!r}")
                        return
                    self.slowest_ack_s = max(self.slowest_ack_s, time.monotonic() - started)
                    self.acknowledged.append(value)
                    n += 1
                    self.consumed += [r.value or b"" for r in consumer.poll(timeout_ms=0)]
                    time.sleep(self._pause_s)
                deadline = time.monotonic() + 20
                while len(self.consumed) < len(self.acknowledged) and time.monotonic() < deadline:
                    self.consumed += [r.value or b"" for r in consumer.poll(timeout_ms=500)]
        except Exception as exc:
            self.errors.append(f"canary client failed: {exc!r}")

    def stop(self) -> list[str]:
        """Stop and check: the problems found (empty: the client was served throughout)."""
        self._stop.set()
        self._thread.join(60)
        problems = list(self.errors)
        if self._thread.is_alive():
            problems.append("the canary thread did not stop")
        if not self.acknowledged:
            problems.append("the canary never got an acknowledgement")
        if self.consumed != self.acknowledged:
            problems.append(
                f"consumed {len(self.consumed)} values, acknowledged {len(self.acknowledged)};"
                f" first difference at {_first_difference(self.consumed, self.acknowledged)}"
            )
        return problems


def _first_difference(a: list[bytes], b: list[bytes]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
