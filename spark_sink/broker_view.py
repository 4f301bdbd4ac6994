"""What the driver asks the broker: which partitions a query reads, and their offsets.

``BrokerView`` resolves ``subscribe`` / ``subscribePattern`` / ``assign`` into
topic-partitions with their log start offset, readable end and timestamp type, and
resolves starting timestamps. The readable end is the high watermark, or under
``isolation.level=read_committed`` the last stable offset (ListOffsets latest at that
level): a micro-batch never ends inside an undecided transaction, so a batch's records
are the same whenever it is read (re-run after a failure included), as Spark's Kafka
source under read_committed. It runs on the driver only (inside the
stream reader's planning calls); its ``AdminClient`` opens on first use, never in a
constructor, and is dropped when the object is pickled.

Not thread-safe (Spark calls a stream reader from one thread).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from tidelog.client import UnknownTopicOrPartitionError
from tidelog.client.admin import AdminClient
from tidelog.client.types import TopicPartition
from tidelog.spark_sink.options import ReadOptions

__all__ = ["BrokerView", "PartitionInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as the broker describes it now."""

    log_start_offset: int
    high_watermark: int  # the readable end: the last stable offset under read_committed
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime (Spark's timestampType column)


class BrokerView:
    """Driver-side lookups for one query. Not thread-safe; ``close`` when done."""

    def __init__(self, options: ReadOptions) -> None:
        self._options = options
        self._admin: AdminClient | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"options": self._options}

    def __setstate__(self, state: dict[str, object]) -> None:
        options = state["options"]
        assert isinstance(options, ReadOptions)
        self._options = options
        self._admin = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                self._options.bootstrap_servers,
                request_timeout_ms=self._options.request_timeout_ms,
                **self._options.security_settings,
            )
        return self._admin

    def topics(self) -> list[str]:
        """The topics the options select, as they exist now (sorted)."""
        options = self._options
        if options.assign:
            return sorted({tp.topic for tp in options.assign})
        if options.subscribe:
            return sorted(set(options.subscribe))
        assert options.subscribe_pattern is not None
        pattern = re.compile(options.subscribe_pattern)
        return [t.name for t in self.admin.list_topics() if pattern.fullmatch(t.name)]

    def partitions(self, *, strict: bool = True) -> dict[TopicPartition, PartitionInfo]:
        """Every partition the query reads now, with its offsets.

        A subscribed topic that does not exist (yet, or any more) has no partitions; an
        assigned partition that does not exist raises ``UnknownTopicOrPartitionError``
        when ``strict`` (where a query starts), and is left out otherwise (a running
        query: the caller treats a partition that vanished as data loss, which
        ``failOnDataLoss`` decides).
        """
        found: dict[TopicPartition, int] = {}  # partition -> timestamp type
        for topic in self.topics():
            try:
                description = self.admin.describe_topic(topic)
            except UnknownTopicOrPartitionError:
                if self._options.assign and strict:
                    raise
                log.info("topic %s does not exist (yet): no partitions", topic)
                continue
            kind = description.config.get("message.timestamp.type", "CreateTime")
            timestamp_type = 1 if kind == "LogAppendTime" else 0
            for p in description.partitions:
                found[TopicPartition(topic, p.partition)] = timestamp_type
        # Offsets from each partition's leader (ListOffsets is routed there): in a cluster
        # only the leader knows a partition's log start and high watermark, and a batch's
        # end must never pass the high watermark the leader reported.
        earliest = self.admin.list_offsets(dict.fromkeys(found, "earliest"))
        latest = self.admin.list_offsets(
            dict.fromkeys(found, "latest"), isolation_level=self._options.isolation_level
        )
        out: dict[TopicPartition, PartitionInfo] = {}
        for tp, timestamp_type in found.items():
            start, end = earliest.get(tp), latest.get(tp)
            out[tp] = PartitionInfo(
                -1 if start is None else start.offset,
                -1 if end is None else end.offset,
                timestamp_type,
            )
        if self._options.assign:
            missing = [tp for tp in self._options.assign if tp not in out]
            if missing and strict:
                raise UnknownTopicOrPartitionError(f"assigned partitions do not exist: {missing}")
            out = {tp: out[tp] for tp in self._options.assign if tp in out}
        return out

    def offsets_for_timestamp(
        self, partitions: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """First offset with a timestamp >= ``timestamp_ms`` per partition (None if none)."""
        found = self.admin.list_offsets(dict.fromkeys(partitions, timestamp_ms))
        return {tp: (None if answer is None else answer.offset) for tp, answer in found.items()}

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
