"""What the console shows, gathered through the public client API only.

``ClusterView`` is one console user's window on the cluster: an ``AdminClient`` (and, when
first needed, a ``Producer`` and a ``Consumer`` for the record browser) built with that
user's credentials, so every page shows and does exactly what that principal may. It turns
the admin answers into the plain rows the templates render (``BrokerRow``, ``TopicRow``,
``RecordRow``...) and feeds the charts' ``History``.

Brokers: ``describe_cluster`` lists the live brokers only; a broker the view has seen
before, or that a partition names as a replica, and that is missing now is shown down.
A partition without a leader is offline; one whose ISR is smaller than its replicas is
under-replicated.

Thread-safe: the admin client is; the producer and the consumer (not thread-safe) are
each used under a lock of their own, and the cached topic descriptions under another.
"""

from __future__ import annotations

import binascii
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidelog.client.acls import AclBinding, AclFilter
from tidelog.client.admin import AdminClient
from tidelog.client.consumer import Consumer
from tidelog.client.producer import Producer
from tidelog.client.share_admin import ShareGroupDescription, ShareOffset
from tidelog.client.types import (
    ConsumerRecord,
    GroupDescription,
    GroupSummary,
    TopicDescription,
    TopicPartition,
)
from tidelog.storage.errors import (
    NotAuthorizedError,
    SecurityDisabledError,
    TidelogError,
)

from .history import History
from .sampler import Sampler

__all__ = [
    "BrokerRow",
    "ClusterView",
    "Overview",
    "RecordPage",
    "RecordRow",
    "SecurityState",
    "TopicRow",
    "render_bytes",
]

_DESCRIBE_CACHE_MS = 1_000  # several requests of one page refresh share one look
_BROWSE_FETCH_WAIT_MS = 20  # the record browser's consumer: no long poll


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class BrokerRow:
    """A broker as the overview shows it."""

    broker_id: int
    address: str
    controller: bool
    up: bool


@dataclass(frozen=True, slots=True)
class TopicRow:
    """One line of the topics table. ``error`` set: the topic could not be described."""

    name: str
    partitions: int
    replication_factor: int
    size_bytes: int
    retention_ms: str
    rate: float | None
    under_replicated: int
    offline: int
    messages: int
    internal: bool = False
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Overview:
    """The overview page: brokers and totals."""

    cluster_id: str
    brokers: tuple[BrokerRow, ...]
    topics: int
    partitions: int
    under_replicated: int
    offline: int
    errors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecordRow:
    """One record of the record browser, its key and value already rendered as text."""

    partition: int
    offset: int
    key: str
    key_kind: str
    value: str
    value_kind: str
    headers: tuple[tuple[str, str], ...]
    timestamp_ms: int
    sent_timestamp_ms: int | None
    received_timestamp_ms: int | None
    corrected_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class RecordPage:
    """A page of the record browser and where the neighbouring pages start."""

    partition: int
    start_offset: int
    log_start_offset: int
    log_end_offset: int
    records: tuple[RecordRow, ...]
    previous_offset: int | None
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class SecurityState:
    """The security page: what is enabled, what the principal may see and change."""

    users: dict[str, dict[str, int]] | None
    users_error: str | None
    acls: tuple[AclBinding, ...] | None
    acls_error: str | None
    authorizer_enabled: bool
    may_alter: bool


def describe_error(error: BaseException) -> str:
    """One line for a page: the message and, for Tidelog errors, the stable code."""
    if isinstance(error, TidelogError):
        return f"{error} [{error.code}]"
    return str(error) or type(error).__name__


def render_bytes(data: bytes | None, mode: str = "auto") -> tuple[str, str]:
    """``data`` as text and the form chosen: ``null``, ``json``, ``utf-8`` or ``hex``.

    ``mode`` ``auto`` picks pretty JSON when the bytes parse as a JSON object or array,
    UTF-8 when they decode, hex otherwise; ``json`` falls back to UTF-8 then hex, ``utf-8``
    to hex (invalid bytes are never silently replaced).
    """
    if data is None:
        return "null", "null"
    if mode == "hex":
        return binascii.hexlify(data, " ").decode(), "hex"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return binascii.hexlify(data, " ").decode(), "hex"
    if mode in ("auto", "json"):
        stripped = text.lstrip()
        if mode == "json" or stripped[:1] in ("{", "["):
            try:
                return json.dumps(json.loads(text), indent=2, ensure_ascii=False), "json"
            except ValueError:
                pass
    return text, "utf-8"


@dataclass
class _Cache:
    time_ms: int = -_DESCRIBE_CACHE_MS
    topics: dict[str, TopicDescription | str] = field(default_factory=dict)


class ClusterView:
    """One user's window on the cluster. Thread-safe; ``close`` when done.

    Args:
        bootstrap_servers: ``HOST:PORT[,...]``.
        client_settings: client settings (security, ``request_timeout_ms``) passed to
            every client this view makes.
        principal: the user name shown (None: no authentication).
        history: where the charts' samples go.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        client_settings: Mapping[str, object],
        *,
        principal: str | None = None,
        history: History | None = None,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.principal = principal
        self.history = history or History()
        self._settings: dict[str, Any] = dict(client_settings)
        self._clock_ms = clock_ms
        self.admin = AdminClient(bootstrap_servers, client_id="tidelog-console", **self._settings)
        self._producer: Producer | None = None
        self._producer_lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._consumer_lock = threading.Lock()
        self._cache = _Cache()
        self._cache_lock = threading.Lock()
        self._seen_brokers: dict[int, str] = {}
        self._seen_lock = threading.Lock()
        self._sampler: Sampler | None = None
        self._sampler_lock = threading.Lock()
        self._closed = False

    def start_sampling(self, interval_ms: int) -> None:
        """Sample the cluster every ``interval_ms`` in the background (``Sampler``) until
        ``close``, so the charts have history while no page is open. Idempotent."""
        with self._sampler_lock:
            if self._sampler is None and not self._closed:
                who = self.principal or "shared"
                self._sampler = Sampler(
                    self.sample, interval_ms=interval_ms, name=f"console-sampler-{who}"
                ).start()

    @property
    def sampler(self) -> Sampler | None:
        """The background sampler, once ``start_sampling`` has run (None before)."""
        return self._sampler

    def sample(self) -> None:
        """One look for the charts: every topic's log end offsets (the produce rate),
        every group's committed offsets and lag (the consume rate, the lag charts)."""
        if self._closed:
            return
        self.describe_all(fresh=True)
        self._sample_groups()

    def close(self) -> None:
        """Stop the sampler and close every client of this view. Idempotent."""
        with self._sampler_lock:
            self._closed = True
            sampler, self._sampler = self._sampler, None
        if sampler is not None:
            # A look in progress usually ends at once; one stuck on a dead broker is not
            # waited for long: the thread is a daemon, and its calls on closed clients
            # fail quietly (the sampler logs errors after ``stop`` at DEBUG only).
            sampler.stop(timeout_s=2.0)
        with self._producer_lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None
        with self._consumer_lock:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None
        self.admin.close()

    # --- topics -----------------------------------------------------------------------

    def describe_all(self, *, fresh: bool = False) -> dict[str, TopicDescription | str]:
        """Every topic (internal ones included) described, or the error it gave, by name.

        Answers are shared for a second, so one page and its charts cost one look.
        """
        now = self._clock_ms()
        with self._cache_lock:
            if not fresh and now - self._cache.time_ms < _DESCRIBE_CACHE_MS:
                return dict(self._cache.topics)
        topics: dict[str, TopicDescription | str] = {}
        for summary in self.admin.list_topics(include_internal=True):
            try:
                topics[summary.name] = self.admin.describe_topic(summary.name)
            except TidelogError as exc:
                topics[summary.name] = describe_error(exc)
        self.history.record(
            now,
            topic_end_offsets={
                name: sum(p.log_end_offset for p in d.partitions if p.log_end_offset >= 0)
                for name, d in topics.items()
                if not isinstance(d, str) and not d.internal
            },
        )
        with self._cache_lock:
            self._cache = _Cache(now, topics)
        return dict(topics)

    def topic_rows(self) -> list[TopicRow]:
        """The topics table, by name, internal topics included (flagged)."""
        rates = self.history.topic_rates()
        rows = []
        for name, description in sorted(self.describe_all().items()):
            if isinstance(description, str):
                rows.append(TopicRow(name, 0, 0, 0, "", None, 0, 0, 0, error=description))
                continue
            parts = description.partitions
            rows.append(
                TopicRow(
                    name=name,
                    partitions=len(parts),
                    replication_factor=max((len(p.replicas) for p in parts), default=0),
                    size_bytes=sum(p.size_bytes for p in parts if p.size_bytes > 0),
                    retention_ms=description.config.get("retention.ms", ""),
                    rate=rates.get(name),
                    under_replicated=sum(1 for p in parts if len(p.isr) < len(p.replicas)),
                    offline=sum(1 for p in parts if p.leader < 0),
                    messages=sum(
                        p.log_end_offset - p.log_start_offset
                        for p in parts
                        if p.log_end_offset >= 0 and p.log_start_offset >= 0
                    ),
                    internal=description.internal,
                )
            )
        return rows

    def topic(self, name: str) -> TopicDescription:
        """One topic, described now. Raises ``UnknownTopicOrPartitionError``."""
        return self.admin.describe_topic(name)

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        replication_factor: int | None,
        config: Mapping[str, str],
    ) -> None:
        """Create a topic (the broker's defaults where None)."""
        self.admin.create_topic(
            name, partitions, dict(config), replication_factor=replication_factor
        )
        self._forget()

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its records."""
        self.admin.delete_topic(name)
        self._forget()

    def alter_topic_config(
        self, name: str, config: Mapping[str, str], delete: Sequence[str]
    ) -> None:
        """Set some configs of a topic and return others to the broker's defaults."""
        self.admin.alter_topic_config(name, dict(config), list(delete))
        self._forget()

    def _forget(self) -> None:
        with self._cache_lock:
            self._cache = _Cache()

    # --- the cluster ------------------------------------------------------------------

    def overview(self) -> Overview:
        """Brokers (live ones, and those seen before or named as replicas: down) and
        totals over every topic."""
        errors: list[str] = []
        cluster = self.admin.describe_cluster()
        topics = self.describe_all()
        live = {b.id: b.address for b in cluster.brokers}
        named: set[int] = set()
        partitions = under = offline = 0
        user_topics = 0
        for name, description in topics.items():
            if isinstance(description, str):
                errors.append(f"{name}: {description}")
                continue
            user_topics += 0 if description.internal else 1
            for p in description.partitions:
                # Totals count every partition, the offsets topic's included: its
                # partitions go offline and under-replicated like any other.
                partitions += 1
                named.update(p.replicas)
                under += len(p.isr) < len(p.replicas)
                offline += p.leader < 0
        with self._seen_lock:
            self._seen_brokers.update(live)
            known = dict(self._seen_brokers)
        for broker_id in named:
            known.setdefault(broker_id, "")
        rows = tuple(
            BrokerRow(
                broker_id=broker_id,
                address=live.get(broker_id, known[broker_id]),
                controller=broker_id == cluster.controller_id,
                up=broker_id in live,
            )
            for broker_id in sorted(known)
        )
        self._sample_groups()
        return Overview(
            cluster_id=cluster.cluster_id,
            brokers=rows,
            topics=user_topics,
            partitions=partitions,
            under_replicated=under,
            offline=offline,
            errors=tuple(errors),
        )

    # --- the record browser -----------------------------------------------------------

    def browse(
        self,
        topic: str,
        partition: int,
        *,
        offset: int | None = None,
        timestamp_ms: int | None = None,
        limit: int = 20,
        mode: str = "auto",
        timeout_ms: int = 5_000,
    ) -> RecordPage:
        """Up to ``limit`` records of one partition from ``offset`` (or from the first
        record at or after ``timestamp_ms``; neither: the last ``limit`` records).

        The start is clamped into [log start, log end]. Reads stop at the log end, or
        when ``timeout_ms`` passes (fewer records then).
        """
        if limit < 1:
            raise ValueError("limit must be positive")
        tp = TopicPartition(topic, partition)
        bounds = (
            self.admin.list_offsets({tp: "earliest"})[tp],
            self.admin.list_offsets({tp: "latest"})[tp],
        )
        log_start = bounds[0].offset if bounds[0] is not None else 0
        log_end = bounds[1].offset if bounds[1] is not None else 0
        if timestamp_ms is not None:
            found = self.admin.list_offsets({tp: timestamp_ms})[tp]
            start = found.offset if found is not None else log_end
        elif offset is not None:
            start = offset
        else:
            start = log_end - limit
        start = max(log_start, min(start, log_end))
        records: list[ConsumerRecord] = []
        if start < log_end:
            records = self._read(tp, start, min(log_end, start + limit), timeout_ms)
        rows = tuple(self._record_row(r, mode) for r in records[:limit])
        next_offset = rows[-1].offset + 1 if rows else start
        return RecordPage(
            partition=partition,
            start_offset=start,
            log_start_offset=log_start,
            log_end_offset=log_end,
            records=rows,
            previous_offset=max(log_start, start - limit) if start > log_start else None,
            next_offset=next_offset if next_offset < log_end else None,
        )

    def _read(
        self, tp: TopicPartition, start: int, stop: int, timeout_ms: int
    ) -> list[ConsumerRecord]:
        deadline = time.monotonic() + timeout_ms / 1000
        with self._consumer_lock:
            if self._consumer is None:
                self._consumer = Consumer(
                    self.bootstrap_servers,
                    client_id="tidelog-console",
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    # Pages read what is stored; a long poll left parked at the log end
                    # by the last page would hold the next page's fetch behind it.
                    fetch_max_wait_ms=_BROWSE_FETCH_WAIT_MS,
                    **self._settings,
                )
            consumer = self._consumer
            consumer.assign([tp])
            consumer.seek(tp, start)
            records: list[ConsumerRecord] = []
            while time.monotonic() < deadline:
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                for record in consumer.poll(timeout_ms=min(left_ms, 500)):
                    if start <= record.offset < stop:
                        records.append(record)
                if records and records[-1].offset >= stop - 1:
                    break
            consumer.assign([])
        return records

    @staticmethod
    def _record_row(record: ConsumerRecord, mode: str) -> RecordRow:
        key, key_kind = render_bytes(record.key, "auto" if mode == "json" else mode)
        value, value_kind = render_bytes(record.value, mode)
        return RecordRow(
            partition=record.partition,
            offset=record.offset,
            key=key,
            key_kind=key_kind,
            value=value,
            value_kind=value_kind,
            headers=tuple((name, render_bytes(v, "auto")[0]) for name, v in record.headers),
            timestamp_ms=record.timestamp_ms,
            sent_timestamp_ms=record.sent_timestamp_ms,
            received_timestamp_ms=record.received_timestamp_ms,
            corrected_timestamp_ms=record.corrected_timestamp_ms,
        )

    def produce(
        self,
        topic: str,
        *,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        timeout_ms: int = 10_000,
    ) -> tuple[int, int]:
        """Send one record and wait for it; returns (partition, offset)."""
        with self._producer_lock:
            if self._producer is None:
                self._producer = Producer(
                    self.bootstrap_servers,
                    client_id="tidelog-console",
                    linger_ms=0,
                    max_block_ms=timeout_ms,
                    delivery_timeout_ms=max(timeout_ms, 1_000),
                    **self._settings,
                )
            future = self._producer.send(
                topic, value=value, key=key, partition=partition, headers=list(headers)
            )
            self._producer.flush()
        metadata = future.result(timeout=timeout_ms / 1000)
        self._forget()
        return metadata.partition, metadata.offset

    # --- groups -----------------------------------------------------------------------

    def groups(self) -> list[GroupSummary]:
        """Every group (consumer, classic, share), by id."""
        return self.admin.list_groups()

    def is_share_group(self, group_id: str) -> bool:
        """Whether ``group_id`` is a share group (issue #32), from the listing."""
        return any(g.group_id == group_id and g.group_type == "share" for g in self.groups())

    def share_group(
        self, group_id: str
    ) -> tuple[ShareGroupDescription, dict[TopicPartition, ShareOffset]]:
        """A share group: members, per-partition statistics, and its start offsets with
        their lag."""
        return (
            self.admin.describe_share_group(group_id),
            self.admin.list_share_group_offsets(group_id),
        )

    def group(self, group_id: str) -> GroupDescription:
        """One group: members, assignment, committed offsets and lag. Sampled for the
        lag chart."""
        description = self.admin.describe_group(group_id)
        self.history.record(self._clock_ms(), group_lag={group_id: total_lag(description)})
        return description

    def _sample_groups(self) -> None:
        """Sum every group's committed offsets (the consume rate) and lags, for charts."""
        committed = 0
        lags: dict[str, int] = {}
        try:
            for summary in self.admin.list_groups():
                if summary.group_type == "share":
                    continue  # no committed offsets: its lag is on its own page
                try:
                    description = self.admin.describe_group(summary.group_id)
                except TidelogError:
                    continue
                committed += sum(p.committed_offset or 0 for p in description.partitions)
                lags[summary.group_id] = total_lag(description)
        except TidelogError:
            return
        self.history.record(self._clock_ms(), committed_total=committed, group_lag=lags)

    def reset_group(
        self,
        group_id: str,
        topic: str | None,
        target: str,
        value: int | None,
    ) -> dict[TopicPartition, int]:
        """Reset an empty group's offsets (``target``: earliest, latest, timestamp or
        offset) of one topic or of every committed partition; the new offsets."""
        if target == "earliest":
            return self.admin.reset_group_offsets(group_id, topic, to_earliest=True)
        if target == "latest":
            return self.admin.reset_group_offsets(group_id, topic, to_latest=True)
        if target == "timestamp":
            return self.admin.reset_group_offsets(group_id, topic, to_timestamp_ms=value)
        if target == "offset":
            return self.admin.reset_group_offsets(group_id, topic, to_offset=value)
        raise ValueError(f"unknown reset target {target!r}")

    # --- security ---------------------------------------------------------------------

    def security(self) -> SecurityState:
        """Users and ACLs as far as the principal may see them, and whether it may alter
        them (probed with an empty ``create_acls``: refused without ALTER on the cluster,
        and changing nothing otherwise)."""
        users: dict[str, dict[str, int]] | None = None
        users_error = acls_error = None
        acls: tuple[AclBinding, ...] | None = None
        try:
            users = self.admin.list_users()
        except TidelogError as exc:
            users_error = describe_error(exc)
        authorizer = True
        try:
            acls = tuple(self.admin.describe_acls(AclFilter()))
        except SecurityDisabledError:
            authorizer = False
        except TidelogError as exc:
            acls_error = describe_error(exc)
        may_alter = False
        try:
            self.admin.create_acls([])
            may_alter = True
        except SecurityDisabledError:
            may_alter = True  # no authorizer: anyone may alter users
        except NotAuthorizedError:
            may_alter = False
        except TidelogError:
            may_alter = False
        return SecurityState(users, users_error, acls, acls_error, authorizer, may_alter)


def total_lag(description: GroupDescription) -> int:
    """A group's lag over the partitions whose lag is known."""
    return sum(p.lag for p in description.partitions if p.lag > 0)
