"""``Consumer``: reads records of assigned (or subscribed) partitions from a broker.

::

    consumer = Consumer("127.0.0.1:7410", auto_offset_reset="earliest")
    consumer.subscribe(["events"])             # every partition of "events"
    for record in consumer:                    # ConsumerRecord(topic, partition, offset, ...)
        ...
    consumer.assign([TopicPartition("events", 0)]); consumer.seek_to_beginning()
    consumer.poll(timeout_ms=500)              # -> list[ConsumerRecord]

    member = Consumer("127.0.0.1:7410", group_id="billing")
    member.subscribe(["events"], on_assign=..., on_revoke=...)   # the group's share

Data path: ``client.fetch_session`` (one ``FetchStream`` with a fetch always in flight,
bounded prefetch; records decoded in ``poll`` on the caller's thread).

Positions: a partition without a position gets one before it is fetched: the group's
committed offset (with ``group_id``), else ``auto_offset_reset`` (ListOffsets earliest or
latest; ``none`` raises ``OffsetOutOfRangeError``). ``OFFSET_OUT_OF_RANGE`` from a fetch
resets the same way. ``seek_to_beginning``/``seek_to_end`` are resolved lazily. The
lookups and the validation below are ``client.positions``'s.

Leader epochs (KIP-320, as Kafka's consumer): a commit stores, with each position, the
leader epoch of the batch the last consumed record came from. A position taken from a
committed offset with an epoch, or held when the partition gets a new leader, is
validated before it is fetched: ``OffsetForLeaderEpoch`` asks the leader where that
epoch ends (``client.fetcher.check_position``). If the log was truncated under the
position, the consumer goes back to the first offset that may differ (or, if the leader
cannot tell, resets by ``auto_offset_reset``); with ``auto_offset_reset='none'``,
``poll``/``position`` raise ``LogTruncationError`` (its ``divergent_offsets`` say where
to ``seek``) until the application seeks.

Groups (``docs/groups.md``): ``group_id`` enables ``commit``/``committed`` and
auto-commit. ``subscribe`` with a ``group_id`` joins the group: ``client.coordinator``
heartbeats on its own thread (``client.group_member`` decides what to say and what to do
with the answers) and queues rebalance steps, which ``poll`` runs on the caller's thread:
assign (positions from the committed offsets, ``on_assign``), revoke (commit with
auto-commit, ``on_revoke``, then report the partitions released) and lose (fenced or
expired: ``on_lost``, nothing committed). ``assign`` (and ``subscribe`` without a group)
reads outside any membership; its commits carry no member id, which the broker accepts
only while the group has no members.

Not thread-safe, as Kafka's consumer: use it from one thread (the reader and heartbeat
threads it owns are internal). ``poll`` never raises for a broker that is down: it
returns no records once its timeout passes (and logs); calls that need an answer
(``position``, ``committed``, ``offsets_for_times``...) raise ``BrokerUnavailableError``
after their timeout.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType

from tidelog.client.config import (
    DEFAULT_BOOTSTRAP,
    ISOLATION_LEVELS,
    ConsumerConfig,
    resolve_config,
)
from tidelog.client.connection import ConnectionFactory
from tidelog.client.coordinator import ConsumerCoordinator
from tidelog.client.errors import ClosedError
from tidelog.client.fetch_session import FetchSession
from tidelog.client.fetcher import SubscriptionState
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.offsets import (
    commit_offsets,
    list_offsets,
    partitions_of,
)
from tidelog.client.positions import (
    EARLIEST,
    LATEST,
    MISSING_TOPIC_RECHECK_MS,
    PositionLookups,
    monotonic_ms,
)
from tidelog.client.rebalance import GroupSubscription, PartitionsCallback
from tidelog.client.routing import ClusterConnections
from tidelog.client.security import ClientSecurity
from tidelog.client.types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndTimestamp,
    TopicPartition,
)
from tidelog.storage.columns import ColumnBuilder
from tidelog.storage.errors import (
    InvalidRequestError,
    StaleMemberEpochError,
    TidelogError,
    UnknownTopicOrPartitionError,
)

__all__ = ["Consumer", "PartitionsCallback"]

log = logging.getLogger(__name__)

_MIN_LOOKUP_MS = 200


class Consumer:
    """Reads records from one broker. Not thread-safe; ``close`` when done.

    Args:
        bootstrap_servers: ``HOST:PORT[,HOST:PORT...]``: any live broker of the cluster.
        config: a whole ``ConsumerConfig`` instead of keyword settings.
        connection_factory: how to reach a broker (default gRPC); tests pass
            ``client.testing.InMemoryCluster.connect``.
        **settings: ``ConsumerConfig`` fields (``group_id``, ``auto_offset_reset``, ...).

    Raises ``ValueError`` for unknown or invalid settings.
    """

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP,
        *,
        config: ConsumerConfig | None = None,
        connection_factory: ConnectionFactory | None = None,
        **settings: object,
    ) -> None:
        config = resolve_config(ConsumerConfig.from_mapping, bootstrap_servers, config, settings)
        self.config = config
        # Fetches go to each partition's leader, offsets and commits to the leaders and
        # the group's coordinator, each following its target when it moves.
        self._connections = ClusterConnections(
            config.bootstrap_servers,
            connection_factory
            or grpc_connections(
                client_id=config.client_id,
                request_timeout_ms=config.request_timeout_ms,
                reconnect_backoff_max_ms=config.reconnect_backoff_max_ms,
                security=ClientSecurity.of(config),
            ),
            request_timeout_ms=config.request_timeout_ms,
            metadata_max_age_ms=config.metadata_max_age_ms,
        )
        self._lock = threading.Lock()
        self._data_ready = threading.Condition(self._lock)
        self._subscriptions = SubscriptionState()
        self._fetches = FetchSession(
            config, self._connections, self._subscriptions, self._lock, self._data_ready
        )
        self._metadata_checked_ms = 0
        self._missing_topics: set[str] = set()
        self._positions = PositionLookups(
            config, self._connections, self._subscriptions, self._lock
        )
        self._next_auto_commit_ms = monotonic_ms() + config.auto_commit_interval_ms
        self._auto_commit = config.enable_auto_commit and config.group_id is not None
        self._iter_buffer: deque[ConsumerRecord] = deque()
        self._closed = False
        self._group: GroupSubscription | None = None  # while a group member

    # --- assignment -----------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replaces any subscription). Empty: none."""
        tps = list(partitions)
        for tp in tps:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"assign() takes TopicPartitions, got {tp!r}")
        self._check_open()
        self._leave_group(self.config.request_timeout_ms)
        with self._lock:
            self._subscriptions.subscription = None
            self._assign_locked(tps)

    def subscribe(
        self,
        topics: Iterable[str] | str,
        *,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
        on_lost: PartitionsCallback | None = None,
    ) -> None:
        """Read the partitions of ``topics``: with ``group_id``, the group's share.

        Without a group: every partition, resolved by the next ``poll`` (no network call
        here); new partitions are picked up every ``metadata_max_age_ms``, a missing
        topic is looked for again until it exists.

        With ``group_id``: joins the group (a heartbeat thread starts; ``docs/groups.md``)
        and reads what the broker assigns. The callbacks run on the calling thread inside
        ``poll`` (and ``close``/``unsubscribe``), with a sorted list of partitions:
        ``on_assign`` after partitions are granted, before they are fetched (it may
        ``seek``); ``on_revoke`` when partitions are taken away, after their positions
        were committed (with auto-commit) and before the broker hears they are released
        (it may ``commit``); ``on_lost`` when the membership was lost (fenced, no
        heartbeat answered for the session timeout, or no ``poll`` for
        ``max_poll_interval_ms``): the partitions are someone else's, so nothing is
        committed; without ``on_lost``, ``on_revoke`` is called, as
        Kafka's default does. An exception from a callback is raised from ``poll`` after
        the step it belongs to is finished. Subscribing again changes the topics and
        keeps the membership.
        """
        names = (topics,) if isinstance(topics, str) else tuple(dict.fromkeys(topics))
        if not names or not all(isinstance(t, str) and t for t in names):
            raise ValueError(f"subscribe() takes topic names, got {topics!r}")
        self._check_open()
        group_id = self.config.group_id
        if group_id is not None:
            with self._lock:
                if self._subscriptions.subscription is None:
                    self._assign_locked(())  # drop an assign()ed set
                self._subscriptions.subscription = names
            if self._group is not None:
                self._group.on_assign, self._group.on_revoke = on_assign, on_revoke
                self._group.on_lost = on_lost
                self._group.coordinator.set_subscription(names)
                return
            config = self.config
            coordinator = ConsumerCoordinator(
                self._connections,
                group_id=group_id,
                client_id=config.client_id,
                subscription=names,
                session_timeout_ms=config.session_timeout_ms,
                rebalance_timeout_ms=config.max_poll_interval_ms,
                max_poll_interval_ms=config.max_poll_interval_ms,
                request_timeout_ms=config.request_timeout_ms,
                retry_backoff_ms=config.retry_backoff_ms,
                wakeup=self._wakeup,
                group_instance_id=config.group_instance_id,
            )
            self._group = GroupSubscription(
                coordinator, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost
            )
            coordinator.start()
            return
        with self._lock:
            self._subscriptions.subscription = names
            self._assign_locked(tp for tp in self._subscriptions.partitions if tp.topic in names)
            self._metadata_checked_ms = 0  # resolved by the next poll, as Kafka's

    def unsubscribe(self, timeout_ms: int | None = None) -> None:
        """Drop the subscription or assignment: nothing is read until the next one.

        A group member leaves the group as ``close`` does (commit, ``on_revoke``, leave),
        waiting at most ``timeout_ms`` (default ``request_timeout_ms``).
        """
        self._leave_group(self._timeout(timeout_ms))
        with self._lock:
            self._subscriptions.subscription = None
            self._assign_locked(())

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer reads now."""
        with self._lock:
            return set(self._subscriptions.partitions)

    def subscription(self) -> set[str] | None:
        """The subscribed topics, or None after ``assign``/without one."""
        names = self._subscriptions.subscription
        return None if names is None else set(names)

    def _refresh_subscription(self, *, force: bool = False, timeout_ms: int | None = None) -> None:
        names = self._subscriptions.subscription
        if names is None or self._group is not None:
            return  # a group member reads what the group assigns
        now = monotonic_ms()
        interval = (
            MISSING_TOPIC_RECHECK_MS if self._missing_topics else self.config.metadata_max_age_ms
        )
        if not force and now - self._metadata_checked_ms < interval:
            return
        self._metadata_checked_ms = now
        try:
            wanted = self._assignment_for_subscription(names, timeout_ms)
        except TidelogError as exc:
            if not exc.retriable:
                raise
            log.warning("could not look up the partitions of %s: %s", ", ".join(names), exc)
            # Ask again soon, not a whole metadata.max.age.ms later: nothing is read
            # until the lookup succeeds.
            self._metadata_checked_ms = now - interval + MISSING_TOPIC_RECHECK_MS
            return
        with self._lock:
            if self._subscriptions.subscription == names:
                current = list(self._subscriptions.partitions)
                if set(current) != set(wanted):
                    self._assign_locked(wanted)
                    log.info("assigned %s", ", ".join(str(tp) for tp in wanted) or "nothing")

    def _assignment_for_subscription(
        self, topics: tuple[str, ...], timeout_ms: int | None
    ) -> list[TopicPartition]:
        """The partitions to read for ``topics`` without a group: every partition of every
        existing topic. (A group member's come from the group: ``client.rebalance``.)
        """
        wanted: list[TopicPartition] = []
        missing: set[str] = set()
        for topic in topics:
            try:
                wanted += [
                    TopicPartition(topic, p)
                    for p in partitions_of(self._connections, topic, timeout_ms)
                ]
            except UnknownTopicOrPartitionError:
                missing.add(topic)
        if missing - self._missing_topics:
            log.warning("subscribed topic(s) not found (yet): %s", ", ".join(sorted(missing)))
        self._missing_topics = missing
        return wanted

    # --- positions ------------------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` at the next ``poll``."""
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"offset must be a non-negative int, got {offset!r}")
        with self._lock:
            self._subscriptions.seek(partition, offset)
            self._fetches.drop_current_of_locked({partition})

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Read these partitions (default: all assigned) from their log start offset."""
        self._request_reset(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Read only records appended from now on to these partitions (default: all)."""
        self._request_reset(partitions, "latest")

    def _request_reset(self, partitions: tuple[TopicPartition, ...], strategy: str) -> None:
        with self._lock:
            for tp in partitions or tuple(self._subscriptions.partitions):
                self._subscriptions.request_reset(tp, strategy)
                self._fetches.drop_current_of_locked({tp})

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record ``poll`` returns for ``partition``.

        Looks it up first if needed. Raises ``KeyError`` if not assigned,
        ``BrokerUnavailableError``/``KafkaTimeoutError`` after ``timeout_ms`` (default
        ``request_timeout_ms``), ``OffsetOutOfRangeError`` with ``auto_offset_reset='none'``
        and no committed offset.
        """
        self._check_open()
        deadline = self._deadline(timeout_ms)
        while True:
            with self._lock:
                state = self._subscriptions.state(partition)
                position, checking = state.position, state.awaiting_validation
            if position is not None and not checking:
                return position
            if position is None:
                self._positions.update(deadline, raise_retriable=True)
            else:
                self._positions.validate(deadline, raise_retriable=True)

    def highwater(self, partition: TopicPartition) -> int | None:
        """The high watermark the last fetch of ``partition`` saw, None before one."""
        with self._lock:
            value = self._subscriptions.state(partition).high_watermark
        return None if value < 0 else value

    def current_lag(self, partition: TopicPartition) -> int | None:
        """How many offsets ``partition``'s position is behind the end the last fetch saw
        (Kafka's ``currentLag``, KIP-695): the high watermark, or under read_committed the
        last stable offset, as Kafka's consumer lag. No network call; None before a fetch
        answered or while the position is unknown. Offsets, not records: markers and
        aborted records count until the position passes them."""
        with self._lock:
            state = self._subscriptions.state(partition)
            end = (
                state.last_stable_offset
                if self.config.isolation_level == "read_committed"
                else state.high_watermark
            )
            if end < 0 or state.position is None:
                return None
            return max(end - state.position, 0)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these partitions until ``resume``; positions are kept."""
        with self._lock:
            for tp in partitions:
                self._subscriptions.state(tp).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        with self._lock:
            for tp in partitions:
                self._subscriptions.state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        with self._lock:
            return {tp for tp, s in self._subscriptions.partitions.items() if s.paused}

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return self._positions.list_offsets(
            dict.fromkeys(partitions, EARLIEST), self._timeout(timeout_ms)
        )

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        """The end of each partition as this consumer reads it: the high watermark (the
        offset the next record will get), or under read_committed the last stable offset
        (where the first undecided transaction starts), as Kafka's ``endOffsets``."""
        return self._positions.list_offsets(
            dict.fromkeys(partitions, LATEST), self._timeout(timeout_ms)
        )

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose timestamp is >= the given one (ms).

        None for a partition with no such record. Raises ``ValueError`` for a negative
        timestamp, the broker's error for an unknown partition.
        """
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"timestamp for {tp} must be a non-negative int, got {ts!r}")
        answers = list_offsets(
            self._connections,
            dict(timestamps),
            self._timeout(timeout_ms),
            isolation_level=ISOLATION_LEVELS[self.config.isolation_level],
        )
        return {
            tp: None if offset < 0 else OffsetAndTimestamp(offset, timestamp)
            for tp, (offset, timestamp) in answers.items()
        }

    def partitions_for_topic(self, topic: str, timeout_ms: int | None = None) -> set[int]:
        """The partition numbers of ``topic``. ``UnknownTopicOrPartitionError`` if none."""
        return set(partitions_of(self._connections, topic, self._timeout(timeout_ms)))

    # --- committed offsets (consumer groups) ------------------------------------------------

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What a transactional producer sends with this consumer's offsets
        (``Producer.send_offsets_to_transaction``, KIP-447): the group, and the member's
        id and epoch (its generation) as they are now; a consumer outside a group
        (``assign``) has member id "" and generation -1. ``ValueError`` without a
        ``group_id``."""
        group_id = self._require_group("group_metadata")
        coordinator = None if self._group is None else self._group.coordinator
        member_id, member_epoch = ("", -1) if coordinator is None else coordinator.member()
        return ConsumerGroupMetadata(
            group_id, member_epoch, member_id, self.config.group_instance_id
        )

    def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None, timeout_ms: int | None = None
    ) -> None:
        """Commit ``offsets`` (each the next offset to read), default the current positions.

        Needs ``group_id`` (``ValueError`` without). A group member commits with its member
        id and epoch; if the epoch moved meanwhile (``StaleMemberEpochError``) it retries
        once after the next heartbeat, for the partitions it still holds. Raises the
        broker's error: ``StaleMemberEpochError`` for a partition this member no longer
        holds (the others are committed), ``UnknownMemberIdError`` after the membership
        was lost, ``GroupNotEmptyError`` for a consumer without membership (``assign``)
        while the group has members, ``InvalidRequestError`` from a broker without groups.
        Raises ``FencedMemberEpochError`` without sending anything once the heartbeat
        thread lost the membership (fenced, expired) until ``poll`` has run ``on_lost``:
        the positions are of partitions that are someone else's now, even if the member
        already rejoined and got them back.
        """
        group_id = self._require_group("commit")
        if self._group is not None:
            self._group.check_not_lost()
        if offsets is None:
            offsets = self._consumed_positions(None)
        for tp, offset in offsets.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"commit offset for {tp} must be a non-negative int")
        if not offsets:
            return
        epochs = self._leader_epochs_of(offsets)
        deadline = self._deadline(timeout_ms)
        coordinator = None if self._group is None else self._group.coordinator
        member_id, member_epoch = ("", -1) if coordinator is None else coordinator.member()
        try:
            failed = commit_offsets(
                self._connections,
                group_id,
                offsets,
                member_id=member_id,
                member_epoch=member_epoch,
                timeout_ms=max(deadline - monotonic_ms(), 1),
                leader_epochs=epochs,
            )
        except StaleMemberEpochError:
            if coordinator is None:
                raise
            # The epoch moved since we read it: retry once with the next heartbeat's.
            coordinator.wait_for_heartbeat(max(deadline - monotonic_ms(), 1))
            if self._group is not None:
                self._group.check_not_lost()  # moved because the membership was lost
            held = coordinator.owned()
            offsets = {tp: offset for tp, offset in offsets.items() if tp in held}
            if not offsets:
                return
            member_id, member_epoch = coordinator.member()
            failed = commit_offsets(
                self._connections,
                group_id,
                offsets,
                member_id=member_id,
                member_epoch=member_epoch,
                timeout_ms=max(deadline - monotonic_ms(), 1),
                leader_epochs=epochs,
            )
        if failed:
            raise next(iter(failed.values()))

    def committed(self, partition: TopicPartition, timeout_ms: int | None = None) -> int | None:
        """The group's committed offset for ``partition``, None if it has none."""
        self._require_group("committed")
        found = self._positions.fetch_committed([partition], self._timeout(timeout_ms))
        return found[partition].offset if partition in found else None

    def _leader_epochs_of(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The committed leader epoch for each of ``offsets`` (KIP-320): the epoch of the
        batch the record before it came from, known when the offset is the partition's
        position (the last record ``poll`` handed out); others commit without one."""
        with self._lock:
            states = self._subscriptions.partitions
            out: dict[TopicPartition, int] = {}
            for tp, offset in offsets.items():
                state = states.get(tp)
                if state is not None and state.position == offset and state.position_epoch >= 0:
                    out[tp] = state.position_epoch
            return out

    def _consumed_positions(
        self, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, int]:
        """Positions of ``partitions`` (None: all) that have one: what ``commit()`` commits.

        Records that ``poll`` returned to the iterator but it did not hand out yet are
        not consumed: a partition's position is then its first such record's offset, so
        a commit never skips records the application has not seen (at-least-once).
        """
        pending: dict[TopicPartition, int] = {}
        for record in self._iter_buffer:
            pending.setdefault(TopicPartition(record.topic, record.partition), record.offset)
        with self._lock:
            states = self._subscriptions.partitions
            wanted = list(states) if partitions is None else partitions
            out: dict[TopicPartition, int] = {}
            for tp in wanted:
                state = states.get(tp)
                if state is not None and state.position is not None:
                    out[tp] = pending.get(tp, state.position)
            return out

    def _require_group(self, what: str) -> str:
        if self.config.group_id is None:
            raise ValueError(f"{what}() needs a consumer created with group_id")
        return self.config.group_id

    def _maybe_auto_commit(self, now: int, timeout_ms: int) -> None:
        """Commit the positions if the interval passed, waiting at most ``timeout_ms``.

        Called from ``poll`` with what is left of its timeout (at least a short round
        trip's worth): ``poll`` never blocks for ``request_timeout_ms`` on a broker that
        is down. A commit that fails is tried again at the next interval.
        """
        if not self._auto_commit or now < self._next_auto_commit_ms:
            return
        self._next_auto_commit_ms = now + self.config.auto_commit_interval_ms
        try:
            self.commit(timeout_ms=timeout_ms)
        except InvalidRequestError as exc:
            log.warning("auto-commit turned off: %s", exc)
            self._auto_commit = False
        except TidelogError as exc:
            log.warning("auto-commit failed (will retry): %s", exc)

    # --- group membership: the rebalance steps, run on the application thread -------------

    def _wakeup(self) -> None:
        """Wake a ``poll`` waiting for records (the heartbeat thread queued events)."""
        with self._lock:
            self._data_ready.notify_all()

    def _run_group_events(self) -> None:
        if self._group is not None:
            self._group.coordinator.polled()
            self._group.run_events(self, auto_commit=self._auto_commit)

    def _leave_group(self, timeout_ms: int, *, autocommit: bool = True) -> None:
        group = self._group
        if group is None:
            return
        try:  # still a member (self._group set) while it commits what it holds
            group.leave(self, timeout_ms, auto_commit=autocommit and self._auto_commit)
        finally:
            self._group = None

    # The ConsumerHooks of client.rebalance (private: not part of the Consumer's API).

    def _add_partitions(self, partitions: list[TopicPartition]) -> None:
        with self._lock:  # no position yet: looked up (committed offset) before fetching
            self._assign_locked([*self._subscriptions.partitions, *partitions])

    def _drop_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        gone = set(partitions)
        if self._iter_buffer:  # records of these the iterator has not handed out yet
            self._iter_buffer = deque(
                r for r in self._iter_buffer if TopicPartition(r.topic, r.partition) not in gone
            )
        with self._lock:
            self._assign_locked(tp for tp in self._subscriptions.partitions if tp not in gone)

    def _assign_locked(self, tps: Iterable[TopicPartition]) -> None:
        """Make ``tps`` the assignment; what leaves it loses its fetched data (lock held)."""
        self._fetches.forget_locked(set(self._subscriptions.assign(tps)))

    def _held_partitions(self) -> list[TopicPartition]:
        with self._lock:
            return sorted(self._subscriptions.partitions)

    def _commit_positions(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> None:
        offsets = self._consumed_positions(partitions)
        try:
            self.commit(offsets, timeout_ms=timeout_ms)
        except TidelogError as exc:
            log.warning("commit of %s failed: %s", ", ".join(map(str, offsets)) or "-", exc)

    # --- polling --------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records fetched since the last poll, waiting up to ``timeout_ms`` for some.

        At most ``max_records`` (default ``max_poll_records``), in offset order per
        partition. Returns an empty list when none arrived in time (a broker that is down
        included). Raises ``OffsetOutOfRangeError`` when a position is outside the log and
        ``auto_offset_reset`` is ``none`` (its subclass ``LogTruncationError`` when the log
        was truncated under a position, see the module docstring), ``CorruptRecordError``
        for bytes that do not decode, ``TopicAuthorizationFailedError`` for an assigned or
        subscribed topic the principal may not describe, ``InvalidTopicError`` for an
        illegal topic name, ``ClosedError`` after ``close``.
        """
        self._check_open()
        if max_records is None:
            max_records = self.config.max_poll_records
        elif max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        records: list[ConsumerRecord] = []

        def collect() -> int:
            records.extend(self._fetches.collect(max_records))
            return len(records)

        self._poll_with(timeout_ms, collect)
        return records

    def _poll_with(self, timeout_ms: int, collect: Callable[[], int]) -> int:
        """The loop of ``poll``: run the consumer's chores and ``collect`` until it got some.

        ``collect`` returns how many records it gathered (0: none yet); so does this,
        after ``timeout_ms`` at the latest.
        """
        deadline = monotonic_ms() + max(timeout_ms, 0)
        while True:
            now = monotonic_ms()
            # Lookups get what is left of the timeout, at least a short round trip's worth.
            lookup_ms = min(max(deadline - now, _MIN_LOOKUP_MS), self.config.request_timeout_ms)
            self._run_group_events()
            self._maybe_auto_commit(now, lookup_ms)
            self._refresh_subscription(timeout_ms=lookup_ms)
            self._positions.check_assigned_topics(now, lookup_ms)
            if now >= self._positions.retry_at:
                self._positions.update(now + lookup_ms, raise_retriable=False)
                self._positions.validate(now + lookup_ms, raise_retriable=False)
            collected = collect()
            self._fetches.maybe_fetch(lookup_ms)
            if collected:
                return collected
            now = monotonic_ms()
            if now >= deadline:
                return 0
            with self._lock:
                # Checked under the lock ``_wakeup`` takes: events queued since this poll
                # ran them (a callback, a position lookup) either show here or notify
                # after the wait began; none waits for the timeout.
                group = self._group
                if not self._fetches.has_data_locked() and (
                    group is None or not group.coordinator.has_news()
                ):
                    self._data_ready.wait(min(deadline - now, self._wait_hint_ms(now)) / 1000)

    def poll_columns(
        self,
        builder: ColumnBuilder,
        timeout_ms: int = 0,
        max_records: int | None = None,
        *,
        batch_times: list[tuple[int, int | None, int | None]] | None = None,
    ) -> int:
        """``poll``, with the records decoded straight into ``builder``'s columns.

        For readers that want columns, not objects (the Spark source): no Python object
        per record. Whole batches go in, so a call may add up to one batch more than
        ``max_records`` (default ``max_poll_records``). Returns the number of rows added;
        errors as ``poll``. ``client.columns`` makes builders and reads them out.
        ``batch_times`` gets ``(rows, sent_ms, received_ms)`` per batch added, in order:
        the sent and received times of the rows (``ConsumerRecord``'s, per batch).
        """
        self._check_open()
        if max_records is None:
            max_records = self.config.max_poll_records
        elif max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        return self._poll_with(
            timeout_ms, lambda: self._fetches.collect_columns(builder, max_records, batch_times)
        )

    def _wait_hint_ms(self, now: int) -> int:
        """How long poll may sleep before it has something to do besides waiting."""
        wait = self._fetches.wait_hint_ms(now)
        if self._subscriptions.needs_position() or self._subscriptions.needs_validation():
            wait = min(wait, max(self._positions.retry_at - now, 1))
        if self._auto_commit:
            wait = min(wait, max(self._next_auto_commit_ms - now, 1))
        if self._group is not None:  # a poll waiting for records still counts as polling
            wait = min(wait, self.config.max_poll_interval_ms // 2)
        if self._subscriptions.subscription is not None and self._missing_topics:
            wait = min(wait, MISSING_TOPIC_RECHECK_MS)
        return max(wait, 1)

    # --- iteration and closing --------------------------------------------------------------

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        """The next record; ``StopIteration`` after ``consumer_timeout_ms`` without one."""
        if self._iter_buffer:
            return self._iter_buffer.popleft()
        limit = self.config.consumer_timeout_ms
        deadline = None if limit is None else monotonic_ms() + limit
        while True:
            wait = 1_000 if deadline is None else max(deadline - monotonic_ms(), 0)
            records = self.poll(timeout_ms=min(wait, 1_000))
            if records:
                self._iter_buffer.extend(records)
                return self._iter_buffer.popleft()
            if deadline is not None and monotonic_ms() >= deadline:
                raise StopIteration

    def close(self, timeout_ms: int | None = None, autocommit: bool = True) -> None:
        """Commit positions (with auto-commit), stop fetching, close the connection.

        A group member then calls ``on_revoke`` for what it holds and leaves the group
        (a heartbeat with epoch -1), so the others take its partitions over at once.
        Idempotent. The commit and the leave wait at most ``timeout_ms`` each (default
        ``request_timeout_ms``); failures (callbacks' included) are logged, not raised.
        """
        if self._closed:
            return
        if self._group is not None:
            self._leave_group(self._timeout(timeout_ms), autocommit=autocommit)
        elif autocommit and self._auto_commit:
            try:
                self.commit(timeout_ms=self._timeout(timeout_ms))
            except TidelogError as exc:
                log.warning("commit on close failed: %s", exc)
        self._closed = True
        self._fetches.close()
        self._connections.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the consumer is closed")

    def _timeout(self, timeout_ms: int | None) -> int:
        return self.config.request_timeout_ms if timeout_ms is None else max(timeout_ms, 1)

    def _deadline(self, timeout_ms: int | None) -> int:
        return monotonic_ms() + self._timeout(timeout_ms)
