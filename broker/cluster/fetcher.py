"""Replica fetchers: followers copy their leaders' logs (Kafka's ``ReplicaFetcherThread``).

A follower fetches from its leader with the ordinary ``Fetch`` RPC, as a replica
(``replica_id`` = this broker's id): for each partition its log end offset as the fetch
offset, the epoch of its last batch (``last_fetched_epoch``) and the leader epoch it
follows (``current_leader_epoch``). The leader parks the fetch until it has something new
(``replica.fetch.wait.max.ms``), so an idle follower costs one waiting call per fetcher,
not a poll loop. The answer is applied here, partition by partition, through the
partition's ``Partition`` (``broker.core.partition``), which refuses each write unless
this broker still follows that leader at that epoch:

* records: appended unchanged (``Partition.append_as_follower``: the leader's offsets,
  epochs and sent/received times), then the follower's high watermark becomes the
  leader's, capped at its own log end, and its log start moves up to the leader's
  (DeleteRecords, retention), checkpointed; each fetch reports this log's start
  (``log_start_offset``), which the leader's DeleteRecords waits for;
* a divergence ``(epoch, end offset)``: the log is truncated where it stops agreeing with
  the leader's (``Partition.truncate_diverged``) and fetched again;
* ``OFFSET_OUT_OF_RANGE`` with the leader's log start above this log's end (retention on
  the leader deleted what this follower never fetched): the log is dropped and starts
  empty at the leader's log start (``Partition.start_over_at``), as Kafka's
  ``truncateFullyAndStartAt``;
* any other error (the leader moved, an epoch was fenced, the partition is gone): the
  partition pauses for ``replica.fetch.backoff.ms``; the metadata watcher gives it a new
  leader.

**Throttle** (``follower.replication.throttled.rate``, bytes per second, 0: none): the
partitions this broker is catching up on as an *adding* replica of a reassignment
(``FetchTarget.throttled``; Kafka throttles the replicas its reassignment tool lists in
``follower.replication.throttled.replicas``) share one budget per fetcher thread, a
token bucket: each append of N bytes to such a partition costs N / rate seconds, with up
to one second of credit, and once the cost runs ahead of the clock they wait until it
does not; each is asked for at most a quarter of a second's worth per fetch (at least
one batch comes anyway). A follower replicating less than the rate never waits, so it
can reach the log end and join the ISR. Other partitions are never slowed down.

**Incremental fetch sessions** (Kafka's KIP-227, ``broker.core.fetch_sessions``): each
fetcher opens a session with its leader by a full fetch (``session_epoch`` 0) and then
names only the partitions whose fetch offset, epochs, log start or size limit changed
(and the ones it stopped fetching as forgotten); the leader answers only the partitions
with news and skips reading the idle ones (``broker.core.fetch``). A session the leader
lost (restarted, evicted for want of slots: ``FETCH_SESSION_ID_NOT_FOUND``), a refused
epoch or a failed call ends it, and the next fetch opens a new one; a leader with no
slot free (or one without sessions) answers session id 0, and the fetcher goes on with
full fetches.

``num.replica.fetchers`` threads serve each source broker, a partition always the same
one. ``remove`` returns only once no answer for that partition is being applied, and the
partition's role check refuses a late one besides: once a broker becomes leader no
follower append can touch its log. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import grpc

from tidelog.broker.cluster.summed_log import SummedLog
from tidelog.broker.core.fetch_sessions import next_epoch
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.security_config import SecurityConfig
from tidelog.broker.tls import InterBrokerChannels
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import TidelogError, UnknownTopicOrPartitionError

__all__ = ["FetchTarget", "FetcherPool"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
_RPC_SLACK_S = 10.0  # the fetch call's deadline beyond the long poll
_REFUSED_LINES = 3  # an answer refusing more partitions with one error sums them up
_THROTTLE_BURST_S = 1.0  # the follower throttle lets this much of its rate through at once


@dataclass(frozen=True, slots=True)
class FetchTarget:
    """Follow ``topic``-``partition`` from broker ``leader`` at ``leader_epoch``."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    throttled: bool = False  # an adding replica of a reassignment: the follower throttle

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


class _Entry(NamedTuple):
    """One partition as a follower's fetch names it."""

    fetch_offset: int
    max_bytes: int
    leader_epoch: int
    last_epoch: int  # of its last batch (-1: empty)
    log_start_offset: int


class _Fetcher:
    """One thread fetching a set of partitions from one leader."""

    def __init__(self, pool: FetcherPool, leader: int, index: int) -> None:
        self._pool = pool
        self.leader = leader
        self._targets: dict[TopicPartition, FetchTarget] = {}
        self._paused: dict[TopicPartition, float] = {}
        self._throttled_until = 0.0  # throttled partitions wait until then (pool.clock)
        self._cond = threading.Condition()
        self.applying = threading.Lock()  # held while an answer is applied
        self._stopped = False
        self._channel: grpc.Channel | None = None
        self._address: str | None = None
        # The incremental fetch session with the leader (KIP-227): its id (0: none), the
        # next fetch's epoch (0: open one with a full fetch) and what the leader's session
        # holds of each partition (``_Entry``), as last sent.
        self._session_id = 0
        self._session_epoch = 0
        self._sent: dict[TopicPartition, _Entry] = {}
        self._thread = threading.Thread(
            target=self._run, name=f"tidelog-replica-fetcher-{leader}-{index}", daemon=True
        )
        self._thread.start()

    def add(self, target: FetchTarget) -> None:
        with self._cond:
            self._targets[target.key] = target
            self._paused.pop(target.key, None)
            self._cond.notify_all()

    def rethrottle(self) -> None:
        """The throttle's rate changed: a fresh budget (the wait run up at the old rate
        is not owed at the new one), fetching at once."""
        with self._cond:
            self._throttled_until = 0.0
            self._cond.notify_all()

    def remove(self, key: TopicPartition) -> bool:
        return self.remove_many((key,))

    def remove_many(self, keys: Iterable[TopicPartition]) -> bool:
        """Stop fetching ``keys``; once, wait out an answer being applied right now."""
        found = False
        with self._cond:
            for key in keys:
                found = self._targets.pop(key, None) is not None or found
                self._paused.pop(key, None)
        if found:
            with self.applying:
                pass
        return found

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        channel = self._channel
        if channel is not None:
            channel.close()  # cancels a fetch in flight
        self._thread.join(self._pool.wait_s + _RPC_SLACK_S)

    def _wanted(self) -> list[FetchTarget] | None:
        """The partitions to fetch now (None: stopped); waits while there are none."""
        clock = self._pool.clock
        with self._cond:
            while not self._stopped:
                now = clock()
                throttled_until = self._throttled_until
                ready = [
                    t
                    for k, t in self._targets.items()
                    if self._paused.get(k, 0) <= now and not (t.throttled and throttled_until > now)
                ]
                if ready:
                    return ready
                pauses = [p - now for p in self._paused.values() if p > now]
                if throttled_until > now and any(t.throttled for t in self._targets.values()):
                    pauses.append(throttled_until - now)
                self._cond.wait(min(pauses) if pauses else None)
            return None

    def _stub(self) -> pb_grpc.BrokerStub | None:
        address = self._pool.address_of(self.leader)
        if address is None:
            return None
        if address != self._address or self._channel is None:
            if self._channel is not None:
                self._channel.close()
            self._channel = self._pool.channels.channel(
                address,
                options=[
                    ("grpc.max_receive_message_length", 2**31 - 1),
                    ("grpc.enable_retries", 0),
                ],
            )
            self._address = address
        return pb_grpc.BrokerStub(self._channel)

    def _run(self) -> None:
        pool = self._pool
        while True:
            targets = self._wanted()
            if targets is None:
                return
            stub = self._stub()
            if stub is None:
                self._pause([t.key for t in targets])
                continue
            entries = self._entries(targets)
            if not entries:
                self._pause([t.key for t in targets])
                continue
            try:
                response = stub.Fetch(self._request(entries), timeout=pool.wait_s + _RPC_SLACK_S)
            except (grpc.RpcError, ValueError) as exc:
                # ValueError: ``stop`` closed the channel after ``_wanted`` returned (grpc
                # refuses a call on a closed channel); the next ``_wanted`` returns None.
                log.debug("fetch from broker %d failed: %s", self.leader, exc)
                self._end_session()
                self._pause([t.key for t in targets])
                continue
            if response.error_code:
                # The leader lost the session (restarted, evicted it) or the epochs
                # disagree: a full fetch opens a new one, at once.
                log.debug("fetch session with broker %d: %s", self.leader, response.error_message)
                self._end_session()
                continue
            if response.session_id:
                opened = response.session_id != self._session_id
                self._session_epoch = 1 if opened else next_epoch(self._session_epoch)
                self._session_id = response.session_id
                self._sent = entries
            else:
                self._end_session()  # the leader keeps none (no slot): full fetches
            # The partitions the leader refused, by error (a failover's new epochs are
            # refused for thousands at once until the leader took them).
            refused = SummedLog(log, _REFUSED_LINES)
            with self.applying:
                for result in response.results:
                    self._apply(result, refused)
            refused.flush()

    def _end_session(self) -> None:
        self._session_id = self._session_epoch = 0
        self._sent = {}

    def _entries(self, targets: list[FetchTarget]) -> dict[TopicPartition, _Entry]:
        """What each partition's fetch names now (the hosted ones)."""
        pool = self._pool
        entries = {}
        for target in targets:
            try:
                plog = pool.partitions.get(target.topic, target.partition).log
            except UnknownTopicOrPartitionError:
                continue
            max_bytes = pool.fetch_max_bytes
            if target.throttled and pool.throttle_rate_bytes > 0:
                max_bytes = max(min(max_bytes, pool.throttle_rate_bytes // 4), 1)
            # Kafka's LogStartOffset: the leader's DeleteRecords waits for it.
            entries[target.key] = _Entry(
                plog.log_end_offset,
                max_bytes,
                target.leader_epoch,
                plog.latest_epoch,
                plog.log_start_offset,
            )
        return entries

    def _request(self, entries: dict[TopicPartition, _Entry]) -> pb.FetchRequest:
        """A full fetch opening a session (epoch 0), or an incremental one naming only
        the partitions whose entry changed since the leader's session took it, and the
        ones it holds that are no longer fetched as forgotten."""
        pool = self._pool
        sent = self._sent  # empty without a session
        partitions = []
        for (topic, partition), entry in entries.items():
            if sent.get((topic, partition)) == entry:
                continue
            part = pb.FetchPartition(
                topic=topic,
                partition=partition,
                fetch_offset=entry.fetch_offset,
                partition_max_bytes=entry.max_bytes,
                current_leader_epoch=entry.leader_epoch,
                log_start_offset=entry.log_start_offset,
            )
            if entry.last_epoch >= 0:
                part.last_fetched_epoch = entry.last_epoch
            partitions.append(part)
        forgotten: dict[str, list[int]] = {}
        for topic, partition in sent.keys() - entries.keys():
            forgotten.setdefault(topic, []).append(partition)
        return pb.FetchRequest(
            replica_id=pool.broker_id,
            max_wait_ms=pool.wait_ms,
            min_bytes=1,
            max_bytes=max(pool.fetch_max_bytes, 1),
            partitions=partitions,
            session_id=self._session_id,
            session_epoch=self._session_epoch,
            forgotten=[pb.TopicPartitions(topic=t, partitions=p) for t, p in forgotten.items()],
        )

    def _apply(self, result: pb.FetchPartitionResult, refused: SummedLog) -> None:
        key = (result.topic, result.partition)
        with self._cond:
            target = self._targets.get(key)
        if target is None:
            return  # removed while the fetch was out: no longer ours to write
        # Every write goes through the Partition, which refuses it unless this broker still
        # follows this leader at this epoch (broker.core.partition).
        leader, epoch = self.leader, target.leader_epoch
        pool = self._pool
        try:
            partition = pool.partitions.get(*key)
            if (
                result.error_code == "OFFSET_OUT_OF_RANGE"
                and result.log_start_offset > partition.log.log_end_offset
            ):
                # The leader's retention removed what this log would need next: nothing
                # fetched could ever join it. Start over, empty, at the leader's log start.
                end = partition.start_over_at(leader, epoch, result.log_start_offset)
                if end is not None:
                    log.warning(
                        "%s-%d: log end %d is below leader %d's log start %d; started over there",
                        *key,
                        end,
                        leader,
                        result.log_start_offset,
                    )
                return
            if result.error_code:
                refused.add(
                    f"leader {self.leader} answered {result.error_code}, paused",
                    f"{key[0]}-{key[1]}: leader {self.leader} answered {result.error_code}: "
                    f"{result.error_message}",
                )
                self._pause([key])
                return
            if result.HasField("diverging_epoch"):
                diverging = result.diverging_epoch
                cut = partition.truncate_diverged(
                    leader, epoch, diverging.epoch, diverging.end_offset
                )
                if cut is not None:
                    # Nothing cut (an empty log whose epochs the leader no longer has, after
                    # a restart): only the epoch cache changed, not worth a warning each.
                    log.log(
                        logging.WARNING if cut[0] != cut[1] else logging.DEBUG,
                        "%s-%d: log diverged from leader %d at epoch %d; truncated %d -> %d",
                        *key,
                        leader,
                        diverging.epoch,
                        *cut,
                    )
                return
            if partition.append_as_follower(
                leader,
                epoch,
                result.records,
                result.batch_times,
                result.high_watermark,
                result.log_start_offset,
            ):
                pool.on_replicated(*key)
                if target.throttled and pool.throttle_rate_bytes > 0 and result.records:
                    delay = len(result.records) / pool.throttle_rate_bytes
                    with self._cond:
                        # Up to _THROTTLE_BURST_S of credit: a follower fetching below
                        # the rate never waits (a pause after every fetch would keep it
                        # behind a partition still written to, out of the ISR for good).
                        floor = pool.clock() - _THROTTLE_BURST_S
                        self._throttled_until = max(self._throttled_until, floor) + delay
        except TidelogError as exc:
            log.warning("%s-%d: replicating from broker %d failed: %s", *key, self.leader, exc)
            self._pause([key])
        except Exception:
            log.exception("%s-%d: replicating from broker %d failed", *key, self.leader)
            self._pause([key])

    def _pause(self, keys: list[TopicPartition]) -> None:
        until = self._pool.clock() + self._pool.backoff_s
        with self._cond:
            for key in keys:
                if key in self._targets:
                    self._paused[key] = until
            self._cond.notify_all()


class FetcherPool:
    """The replica fetcher threads of one broker, created per source broker on demand."""

    def __init__(
        self,
        broker_id: int,
        partitions: PartitionRegistry,
        address_of: Callable[[int], str | None],
        *,
        num_fetchers: int = 1,
        wait_ms: int = 500,
        fetch_max_bytes: int = 1024 * 1024,
        backoff_ms: int = 1_000,
        on_replicated: Callable[[str, int], None] = lambda _t, _p: None,
        clock: Callable[[], float] | None = None,
        channels: InterBrokerChannels | None = None,
        throttle_rate_bytes: int = 0,
    ) -> None:
        self.broker_id = broker_id
        # How channels to leaders are opened (plaintext, TLS, SASL: broker.tls).
        self.channels = channels or InterBrokerChannels(SecurityConfig())
        self.partitions = partitions
        self.address_of = address_of
        self.wait_ms = wait_ms
        self.wait_s = wait_ms / 1000
        self.fetch_max_bytes = fetch_max_bytes
        self.backoff_s = backoff_ms / 1000
        self.on_replicated = on_replicated
        # follower.replication.throttled.rate (0: off); dynamic, ``set_throttle_rate``.
        self.throttle_rate_bytes = throttle_rate_bytes
        self.clock = clock or time.monotonic
        self._num = max(num_fetchers, 1)
        self._lock = threading.Lock()
        self._fetchers: dict[tuple[int, int], _Fetcher] = {}
        self._owner: dict[TopicPartition, _Fetcher] = {}
        self._stopped = False

    def set_throttle_rate(self, rate_bytes: int) -> None:
        """A new ``follower.replication.throttled.rate`` (0: off), applied from each
        fetcher's next fetch with a fresh budget (a dynamic broker config,
        ``broker.core.configs``)."""
        rate_bytes = max(rate_bytes, 0)
        with self._lock:
            if rate_bytes == self.throttle_rate_bytes:
                return
            self.throttle_rate_bytes = rate_bytes
            fetchers = list(self._fetchers.values())
        for fetcher in fetchers:
            fetcher.rethrottle()

    def _index(self, key: TopicPartition) -> int:
        return zlib.crc32(f"{key[0]}-{key[1]}".encode()) % self._num

    def add(self, target: FetchTarget) -> None:
        """Fetch ``target`` from its leader (moving it off a previous leader's fetcher)."""
        slot = (target.leader, self._index(target.key))
        with self._lock:
            if self._stopped:
                return
            previous = self._owner.get(target.key)
            fetcher = self._fetchers.get(slot)
            if fetcher is None:
                fetcher = self._fetchers[slot] = _Fetcher(self, target.leader, slot[1])
            self._owner[target.key] = fetcher
        if previous is not None and previous is not fetcher:
            previous.remove(target.key)
        fetcher.add(target)

    def remove(self, key: TopicPartition) -> None:
        """Stop fetching ``key``; returns once no answer for it is being applied."""
        self.remove_many((key,))

    def remove_many(self, keys: Iterable[TopicPartition]) -> None:
        """Stop fetching every key of ``keys``; returns once no answer for any of them is
        being applied. One wait per fetcher thread, not one per partition: a fetcher
        applies one answer for all its partitions under its ``applying`` lock, and a
        broker stopping or cut off (``ReplicaManager.resign_all``) with 9,000 followed
        partitions waited for up to one whole answer per partition (issue #34: minutes)."""
        owned: dict[_Fetcher, list[TopicPartition]] = {}
        with self._lock:
            for key in keys:
                fetcher = self._owner.pop(key, None)
                if fetcher is not None:
                    owned.setdefault(fetcher, []).append(key)
        for fetcher, its_keys in owned.items():
            fetcher.remove_many(its_keys)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._owner.clear()
        for fetcher in fetchers:
            fetcher.stop()
