"""Where change units go: the ``ChangeSink`` seam, its at-least-once implementation, and
reading positions back.

One PostgreSQL transaction is one ``ChangeUnit`` (``client.cdc.events``). The connector
hands units to a sink in commit order with ``write`` and asks ``durable_lsn`` which
position is safely stored; it confirms that LSN to PostgreSQL (the slot's
``confirmed_flush_lsn``) and never one beyond it, so PostgreSQL keeps every change the
sink could still lose.

``ProducerSink`` (at least once): the unit's records go out through Tidelog's idempotent
``Producer`` (``acks="all"``); once every record of a unit *and of all units before it*
is acknowledged, the latest such unit's position is written to the compacted offsets
topic (key = the connector's name, value = ``encode_position``), and once that write is
acknowledged the position is durable. Records of one partition are stored in send order
(idempotence), so a restart from the recorded position can repeat the units after it but
never skip one: duplicates, no gaps.

The exactly-once sink is ``client.cdc.txn_sink.TransactionalSink`` (the connector's
default): batches of whole units and the position in one Tidelog transaction.

Positions are read back read_committed (``read_positions``, ``live_keys``): a position
or a row in a transaction that is open or aborted is never taken for stored; for the
at-least-once sink, which writes no transactions, that reads the same as read_uncommitted.

Not thread-safe: one connector thread calls every method.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from tidelog.client.admin import AdminClient
from tidelog.client.cdc.events import ChangeUnit, Position, format_lsn, parse_lsn
from tidelog.client.consumer import Consumer
from tidelog.client.producer import Producer
from tidelog.client.types import RecordMetadata, TopicPartition
from tidelog.storage.errors import TopicAlreadyExistsError

__all__ = [
    "ChangeSink",
    "ProducerSink",
    "StoredPosition",
    "decode_position",
    "encode_position",
    "ensure_compacted_topic",
    "live_keys",
    "read_position",
    "read_positions",
]

log = logging.getLogger(__name__)


class ChangeSink(Protocol):
    """Stores change units durably, in order.

    Two optional methods, looked up by the connector: ``drained()``, called instead of
    ``flush`` when the replication stream is drained, asks the sink to store what it has
    without waiting (``durable_lsn`` follows); ``wakeup_fd()`` a file descriptor that
    becomes readable when ``durable_lsn`` moves, which the connector waits on beside the
    replication socket (``TransactionalSink`` has both)."""

    def write(self, unit: ChangeUnit) -> None:
        """Take the next unit (commit order). May return before it is durable."""
        ...

    def durable_lsn(self) -> int | None:
        """The LSN of the latest position durably stored with every unit before it,
        or None if none yet. Raises the storing error if a unit failed."""
        ...

    def flush(self, timeout_ms: int) -> int | None:
        """Make everything written durable now and wait for it; returns
        ``durable_lsn()``. The connector calls it whenever the replication stream is
        drained (so it is the transactional sink's commit point) and before it stops."""
        ...

    def close(self) -> None: ...


def encode_position(name: str, position: Position, server_wal_end: int, now_ms: int) -> bytes:
    """The offsets topic's value for ``position``: JSON, LSNs in PostgreSQL's spelling.

    ``server_wal_end`` and ``now_ms`` are for ``tidelog cdc status`` (the lag when the
    position was written)."""
    return json.dumps(
        {
            "connector": name,
            "lsn": format_lsn(position.lsn),
            "snapshot_done": position.snapshot_done,
            "commit_ts_ms": position.commit_ts_ms,
            "server_wal_end": format_lsn(max(server_wal_end, position.lsn)),
            "written_ms": now_ms,
        }
    ).encode()


@dataclass(frozen=True, slots=True)
class StoredPosition:
    position: Position
    server_wal_end: int
    written_ms: int


def decode_position(value: bytes) -> StoredPosition:
    """Read what ``encode_position`` wrote. Raises ``ValueError`` on anything else."""
    try:
        data = json.loads(value)
        position = Position(
            parse_lsn(data["lsn"]), bool(data["snapshot_done"]), int(data["commit_ts_ms"])
        )
        return StoredPosition(position, parse_lsn(data["server_wal_end"]), int(data["written_ms"]))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a CDC position: {value!r}") from exc


def ensure_compacted_topic(admin: AdminClient, name: str, partitions: int) -> None:
    """Create ``name`` as a compacted topic unless it exists (whatever its config)."""
    try:
        admin.create_topic(name, partitions, {"cleanup.policy": "compact"})
    except TopicAlreadyExistsError:
        pass


def read_position(
    bootstrap: str, offsets_topic: str, name: str, security: Mapping[str, Any], timeout_ms: int
) -> StoredPosition | None:
    """The connector ``name``'s last position in ``offsets_topic`` (None if none)."""
    return read_positions(bootstrap, offsets_topic, security, timeout_ms).get(name)


def live_keys(
    bootstrap: str, topic: str, security: Mapping[str, Any], timeout_ms: int
) -> set[bytes]:
    """The keys whose latest committed record in ``topic`` (every partition, start to the
    last stable offset) is not a tombstone: the rows a previous run left there."""
    keys: set[bytes] = set()
    with Consumer(
        bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **security,
    ) as consumer:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic, timeout_ms)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps, timeout_ms=timeout_ms)
        consumer.seek_to_beginning(*tps)
        while any(consumer.position(tp, timeout_ms=timeout_ms) < ends[tp] for tp in tps):
            for record in consumer.poll(timeout_ms=min(timeout_ms, 1_000)):
                tp = TopicPartition(record.topic, record.partition)
                if record.key is None or record.offset >= ends[tp]:
                    continue
                if record.value is None:
                    keys.discard(record.key)
                else:
                    keys.add(record.key)
    return keys


def read_positions(
    bootstrap: str, offsets_topic: str, security: Mapping[str, Any], timeout_ms: int
) -> dict[str, StoredPosition]:
    """Every connector's last committed position in ``offsets_topic``: the topic read
    read_committed from its start to its last stable offset, the last value of each key
    winning (values that are not positions are skipped with a warning)."""
    tp = TopicPartition(offsets_topic, 0)
    found: dict[str, bytes] = {}
    with Consumer(
        bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **security,
    ) as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=timeout_ms)[tp]
        consumer.seek_to_beginning(tp)
        while consumer.position(tp, timeout_ms=timeout_ms) < end:
            for record in consumer.poll(timeout_ms=min(timeout_ms, 1_000)):
                if record.key is None or record.offset >= end:
                    continue
                if record.value is None:
                    found.pop(record.key.decode(), None)
                else:
                    found[record.key.decode()] = record.value
    positions = {}
    for name, value in found.items():
        try:
            positions[name] = decode_position(value)
        except ValueError:
            log.warning("offsets topic %s: key %r holds no CDC position", offsets_topic, name)
    return positions


class ProducerSink:
    """At-least-once: records through an idempotent producer, then the position.

    Args:
        bootstrap: the brokers.
        name: the connector's name, the offsets topic's key.
        offsets_topic: the compacted topic of positions (created by the connector).
        security: producer security settings (kafka-python's names).
        now_ms: the wall clock for ``written_ms`` (injected).
    """

    def __init__(
        self,
        bootstrap: str,
        name: str,
        offsets_topic: str,
        security: Mapping[str, Any],
        now_ms: Callable[[], int],
    ) -> None:
        self._name = name
        self._offsets_topic = offsets_topic
        self._clock = now_ms
        self._producer = Producer(
            bootstrap, acks="all", enable_idempotence=True, linger_ms=5, **security
        )
        # Units sent, oldest first: (their record futures, the position to record after).
        self._sent: deque[tuple[list[Future[RecordMetadata]], Position | None]] = deque()
        self._settled = 0  # how many of the oldest unit's futures are known done
        # Position writes in flight, oldest first.
        self._positions: deque[tuple[Future[RecordMetadata], Position]] = deque()
        self._durable: int | None = None
        self.server_wal_end = 0  # the connector's latest view, written with positions

    def write(self, unit: ChangeUnit) -> None:
        send = self._producer.send
        futures = [send(r.topic, value=r.value, key=r.key) for r in unit.records]
        self._sent.append((futures, unit.position))
        self._advance()

    def durable_lsn(self) -> int | None:
        self._advance()
        return self._durable

    def flush(self, timeout_ms: int) -> int | None:
        self._producer.flush(timeout_ms=timeout_ms)
        self._advance()  # may send the last position
        self._producer.flush(timeout_ms=timeout_ms)
        self._advance()
        return self._durable

    def close(self) -> None:
        self._producer.close()

    def _advance(self) -> None:
        """Move acknowledged units into a position write, acknowledged positions into
        ``_durable``. A failed record or position write raises (the connector stops;
        a restart repeats from the last durable position).

        Decision (issue #30's benchmark, cProfile): this runs on every ``write``, so each
        future is asked ``done()`` (a lock) once it is done and not again: ``_settled``
        keeps how far into the oldest unit the futures are done; and a done future's
        error is read with ``exception()``, which builds no ``RecordMetadata``."""
        latest: Position | None = None
        sent = self._sent
        while sent:
            futures, position = sent[0]
            settled = self._settled
            count = len(futures)
            while settled < count and futures[settled].done():
                settled += 1
            if settled < count:
                self._settled = settled
                break
            sent.popleft()
            self._settled = 0
            for future in futures:
                error = future.exception()
                if error is not None:
                    raise error  # the delivery error
            if position is not None:
                latest = position
        if latest is not None:
            value = encode_position(self._name, latest, self.server_wal_end, self._now())
            future = self._producer.send(self._offsets_topic, value=value, key=self._name.encode())
            self._positions.append((future, latest))
        while self._positions and self._positions[0][0].done():
            future, position = self._positions.popleft()
            future.result()
            self._durable = position.lsn
            log.debug("CDC position %s durable", format_lsn(position.lsn))

    def _now(self) -> int:
        return self._clock()
