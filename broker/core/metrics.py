"""Prometheus metrics of one broker, in a registry of its own, and the HTTP endpoint.

Every broker owns a ``CollectorRegistry`` (never the global one), so several in-process
brokers can coexist in one test process. Names (Prometheus conventions: seconds and
``_total``; label ``topic`` on the data-path counters):

=====================================  =========  =============================================
name                                   type       meaning
=====================================  =========  =============================================
``tidelog_bytes_in_total``             counter    batch bytes appended, by topic
``tidelog_records_in_total``           counter    records appended, by topic
``tidelog_bytes_out_total``            counter    batch bytes answered to fetches, by topic
``tidelog_records_out_total``          counter    records in those batches, by topic
``tidelog_produce_errors_total``       counter    partition appends refused, by error code
``tidelog_requests_total``             counter    RPCs finished, by method and code (OK or the
                                                  error code)
``tidelog_request_duration_seconds``   histogram  RPC latency, by method (a stream message
                                                  counts as one request of its method)
``tidelog_operations_total``          counter    requests of every listener finished, by
                                                  neutral operation (``broker.core.operations``),
                                                  listener (grpc, kafka) and outcome (OK or
                                                  the error code that failed the request)
``tidelog_operation_duration_seconds`` histogram  their latency, by operation and listener
``tidelog_flush_wait_seconds``         histogram  how long ``acks=all`` waited for fsync
``tidelog_fetch_waiting``              gauge      long-poll fetches waiting right now
``tidelog_log_start_offset``           gauge      by topic and partition
``tidelog_log_end_offset``             gauge      by topic and partition
``tidelog_high_watermark``             gauge      by topic and partition
``tidelog_log_size_bytes``             gauge      by topic and partition
``tidelog_log_segments``               gauge      open segments, by topic and partition
``tidelog_consumer_group_lag``         gauge      log end offset - committed offset (log end
                                                  - log start when nothing is committed), by
                                                  group, topic and partition
``tidelog_consumer_group_committed_offset`` gauge committed offset (-1: none), same labels
``tidelog_consumer_group_members``     gauge      members, by group
``tidelog_isr_shrinks_total``          counter    followers this broker (as leader) dropped from
                                                  an ISR (cluster mode)
``tidelog_isr_expands_total``          counter    followers it added back
``tidelog_under_replicated_partitions`` gauge     partitions it leads whose ISR is smaller than
                                                  their replica set
``tidelog_offline_partitions``         gauge      partitions without a leader (reported by the
                                                  controller; 0 on the others)
``tidelog_leader_partitions``          gauge      partitions this broker leads
``tidelog_follower_lag_records``       gauge      leader side: how far each follower is behind
                                                  the log end, by topic, partition, follower
=====================================  =========  =============================================

The per-partition and per-group gauges are read at scrape time (custom collectors), so a
deleted topic or group disappears from the next scrape instead of leaving stale series.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["BrokerMetrics", "GroupLagGauges", "MetricsServer", "PartitionGauges"]

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PartitionGauges:
    """One partition's numbers at scrape time."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    segments: int


@dataclass(frozen=True, slots=True)
class GroupLagGauges:
    """One partition of one consumer group at scrape time."""

    group_id: str
    topic: str
    partition: int
    committed_offset: int
    lag: int


class _GroupCollector(Collector):
    """Reads consumer-group gauges at scrape time from callables the broker provides."""

    def __init__(
        self,
        lags: Callable[[], Iterable[GroupLagGauges]],
        members: Callable[[], Iterable[tuple[str, int]]],
    ) -> None:
        self._lags = lags
        self._members = members

    def collect(self) -> Iterator[Metric]:
        labels = ["group", "topic", "partition"]
        lag = GaugeMetricFamily(
            "tidelog_consumer_group_lag", "Log end offset minus committed offset", labels=labels
        )
        committed = GaugeMetricFamily(
            "tidelog_consumer_group_committed_offset",
            "Committed offset (-1: none)",
            labels=labels,
        )
        members = GaugeMetricFamily(
            "tidelog_consumer_group_members", "Members of the group", labels=["group"]
        )
        try:
            for g in self._lags():
                values = [g.group_id, g.topic, str(g.partition)]
                lag.add_metric(values, g.lag)
                committed.add_metric(values, g.committed_offset)
            for group_id, count in self._members():
                members.add_metric([group_id], count)
        except Exception:
            # A scrape must never take the broker down; the endpoint answers what it can.
            log.exception("metrics: could not read consumer group state")
        yield lag
        yield committed
        yield members


class _PartitionCollector(Collector):
    """Reads partition gauges at scrape time from a callable the broker provides."""

    def __init__(
        self, partitions: Callable[[], Iterable[PartitionGauges]], waiting: Callable[[], int]
    ) -> None:
        self._partitions = partitions
        self._waiting = waiting

    def collect(self) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        families = {
            "log_start_offset": GaugeMetricFamily(
                "tidelog_log_start_offset", "First readable offset", labels=labels
            ),
            "log_end_offset": GaugeMetricFamily(
                "tidelog_log_end_offset", "Offset the next record gets", labels=labels
            ),
            "high_watermark": GaugeMetricFamily(
                "tidelog_high_watermark", "Offset below which consumers may read", labels=labels
            ),
            "size_bytes": GaugeMetricFamily(
                "tidelog_log_size_bytes", "Bytes of all segments", labels=labels
            ),
            "segments": GaugeMetricFamily("tidelog_log_segments", "Open segments", labels=labels),
        }
        try:
            partitions = list(self._partitions())
        except Exception:
            # A scrape must never take the broker down; the endpoint answers what it can.
            log.exception("metrics: could not read partition state")
            partitions = []
        for p in partitions:
            values = [p.topic, str(p.partition)]
            families["log_start_offset"].add_metric(values, p.log_start_offset)
            families["log_end_offset"].add_metric(values, p.log_end_offset)
            families["high_watermark"].add_metric(values, p.high_watermark)
            families["size_bytes"].add_metric(values, p.size_bytes)
            families["segments"].add_metric(values, p.segments)
        yield from families.values()
        yield GaugeMetricFamily(
            "tidelog_fetch_waiting", "Long-poll fetches waiting now", value=self._waiting()
        )


class _ReplicationCollector(Collector):
    """Replication gauges read at scrape time (cluster mode)."""

    def __init__(
        self,
        counts: Callable[[], tuple[int, int, int]],
        follower_lag: Callable[[], Mapping[tuple[str, int, int], int]],
    ) -> None:
        self._counts = counts
        self._follower_lag = follower_lag

    def collect(self) -> Iterator[Metric]:
        try:
            under, offline, led = self._counts()
            lags = dict(self._follower_lag())
        except Exception:
            log.exception("metrics: could not read replication state")
            return
        yield GaugeMetricFamily(
            "tidelog_under_replicated_partitions",
            "Led partitions whose ISR is smaller than their replicas",
            value=under,
        )
        yield GaugeMetricFamily(
            "tidelog_offline_partitions", "Partitions without a leader", value=offline
        )
        yield GaugeMetricFamily("tidelog_leader_partitions", "Partitions led here", value=led)
        lag = GaugeMetricFamily(
            "tidelog_follower_lag_records",
            "Records a follower is behind the leader's log end",
            labels=["topic", "partition", "follower"],
        )
        for (topic, partition, follower), records in sorted(lags.items()):
            lag.add_metric([topic, str(partition), str(follower)], records)
        yield lag


class BrokerMetrics:
    """The counters and histograms of one broker. Thread-safe (prometheus-client is)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The children of the per-request series, looked up once: ``labels`` costs a few
        # microseconds, and a single-record produce asked for four (issue #31). A topic's
        # go with ``forget_topic``; a race with it loses at most that deleted topic's
        # last increments, as ``labels`` racing with ``remove`` did.
        self._topic_in: dict[str, tuple[Any, Any]] = {}
        self._operation_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self.bytes_in = Counter("tidelog_bytes_in", "Batch bytes appended", ["topic"], registry=r)
        self.records_in = Counter("tidelog_records_in", "Records appended", ["topic"], registry=r)
        self.bytes_out = Counter(
            "tidelog_bytes_out", "Batch bytes answered to fetches", ["topic"], registry=r
        )
        self.records_out = Counter(
            "tidelog_records_out", "Records in batches answered to fetches", ["topic"], registry=r
        )
        # By code only: a topic label would let clients mint series with made-up names.
        self.produce_errors = Counter(
            "tidelog_produce_errors", "Partition appends refused", ["code"], registry=r
        )
        self.requests = Counter("tidelog_requests", "RPCs finished", ["method", "code"], registry=r)
        self.operations = Counter(
            "tidelog_operations",
            "Requests finished, by neutral operation, listener and outcome",
            ["operation", "listener", "outcome"],
            registry=r,
        )
        self.operation_duration = Histogram(
            "tidelog_operation_duration_seconds",
            "Request latency, by neutral operation and listener",
            ["operation", "listener"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "tidelog_request_duration_seconds",
            "RPC latency",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.isr_shrinks = Counter(
            "tidelog_isr_shrinks", "Followers dropped from an ISR by this leader", registry=r
        )
        self.isr_expands = Counter(
            "tidelog_isr_expands", "Followers added to an ISR by this leader", registry=r
        )
        self.flush_wait = Histogram(
            "tidelog_flush_wait_seconds",
            "Time acks=all waited for fsync",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def observe_request(self, method: str, code: str, seconds: float) -> None:
        """Count one finished request and its latency."""
        self.requests.labels(method, code).inc()
        self.request_duration.labels(method).observe(seconds)

    def observe_operation(
        self, listener: str, operation: str, outcome: str, seconds: float
    ) -> None:
        """Count one finished request of any listener (``broker.core.operations.observe``)."""
        key = (operation, listener, outcome)
        children = self._operation_children.get(key)
        if children is None:
            children = (
                self.operations.labels(operation, listener, outcome),
                self.operation_duration.labels(operation, listener),
            )
            self._operation_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def count_in(self, topic: str, size_bytes: int, records: int) -> None:
        """Count an append of ``records`` records in ``size_bytes`` batch bytes to ``topic``."""
        children = self._topic_in.get(topic)
        if children is None:
            children = (self.bytes_in.labels(topic), self.records_in.labels(topic))
            self._topic_in[topic] = children
        children[0].inc(size_bytes)
        children[1].inc(records)

    def forget_topic(self, topic: str) -> None:
        """Drop a deleted topic's series so that topic churn does not grow the registry."""
        self._topic_in.pop(topic, None)
        for counter in (self.bytes_in, self.records_in, self.bytes_out, self.records_out):
            try:
                counter.remove(topic)
            except KeyError:
                pass  # never had a sample

    def add_partition_collector(
        self, partitions: Callable[[], Iterable[PartitionGauges]], waiting: Callable[[], int]
    ) -> None:
        """Expose per-partition gauges read at scrape time from ``partitions``."""
        self.registry.register(_PartitionCollector(partitions, waiting))

    def add_replication_collector(
        self,
        counts: Callable[[], tuple[int, int, int]],
        follower_lag: Callable[[], Mapping[tuple[str, int, int], int]],
    ) -> None:
        """Cluster mode: ``counts`` gives (under-replicated, offline, led) partitions and
        ``follower_lag`` each follower's lag in records, read at scrape time."""
        self.registry.register(_ReplicationCollector(counts, follower_lag))

    def add_group_collector(
        self,
        lags: Callable[[], Iterable[GroupLagGauges]],
        members: Callable[[], Iterable[tuple[str, int]]],
    ) -> None:
        """Expose consumer-group lag, committed offsets and member counts read at scrape
        time from ``lags`` and ``members`` ((group id, member count) pairs)."""
        self.registry.register(_GroupCollector(lags, members))


class MetricsServer:
    """The HTTP endpoint serving one registry at ``/metrics``. Not thread-safe (one owner)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @classmethod
    def start(
        cls,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> MetricsServer:
        """Serve ``registry`` on ``host:port`` (port 0: any free port) in a daemon thread.

        Raises:
            OSError: the address cannot be bound.
        """
        server, thread = start_http_server(
            port, addr=host, registry=registry, certfile=certfile, keyfile=keyfile
        )
        scheme = "https" if certfile else "http"
        log.info("metrics on %s://%s:%d/metrics", scheme, host, server.server_port)
        return cls(server, thread)

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self._server.server_port)

    def stop(self, timeout_ms: int = 5_000) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout_ms / 1000.0)
