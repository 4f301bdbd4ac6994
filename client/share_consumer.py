"""``ShareConsumer``: a member of a share group (issue #32, KIP-932 "queues for Kafka").

::

    consumer = ShareConsumer("127.0.0.1:7410", "jobs")
    consumer.subscribe(["work"])
    while True:
        for record in consumer.poll(timeout_ms=1000):
            handle(record)              # implicit mode: accepted on the next poll/commit
    consumer.close()

    # explicit mode, from the first acknowledge() on:
    for record in consumer.poll(timeout_ms=1000):
        try:
            handle(record)
            consumer.acknowledge(record)                  # ACCEPT
        except Retryable:
            consumer.acknowledge(record, kind="release")  # to anyone, at once
        except Poison:
            consumer.acknowledge(record, kind="reject")   # never again
    consumer.commit_sync()

The shape of Kafka's ``KafkaShareConsumer``. Members of a share group read the same
partitions cooperatively: the broker hands each record to one member at a time under a
lock (``group.share.record.lock.duration.ms``), and redelivers what is released, whose
lock expired, or whose member left, up to ``group.share.delivery.count.limit`` deliveries
(``delivery_count(record)`` says which delivery this is).

**Acknowledgement modes, as Kafka's.** Implicit until ``acknowledge`` is first called:
every record of a ``poll`` is acknowledged as ACCEPT by the next ``poll``,
``commit_sync``, ``commit_async`` or ``close``. Explicit from then on: only what
``acknowledge`` names is acknowledged, and a record left unacknowledged stays locked to
this member until its lock expires (Kafka 4.1 refuses the next ``poll`` instead; Tidelog
lets the lock do its work). Acknowledgements travel with the next ``poll``'s fetch
or with a commit's request; ``commit_sync`` returns each partition's outcome.

**One stream per leader** (``client.share_links``, docs/share-groups.md "The share fetch
stream"): fetches and acknowledgements go as ``ShareFetch`` requests on one open
``ShareFetchStream`` to each leader, not as a unary call each (gRPC's price per call was
most of what the share group's acknowledgement cost); a request naming no partitions
only acknowledges. ``share_fetch_stream=False``, or a broker without the method, uses
the unary ``ShareFetch`` / ``ShareAcknowledge``.

**One poll ahead** (``fetch_ahead``, on by default; docs/share-groups.md): a commit's
request (and a ``poll``'s that hands out records fetched ahead with acknowledgements to
send) also acquires the next poll's records, at most ``max_poll_records`` less what is
already ahead, never with a RELEASE aboard (those records would come straight back);
``close`` gives back what it never handed out as RETURN, its delivery not counted.

**Membership.** A heartbeat thread keeps the member in the group (ShareGroupHeartbeat to
the coordinator, every ``heartbeat_interval_ms`` the broker dictates) and holds its
assignment; ``poll`` fetches the assigned partitions from their leaders (one ShareFetch
per leader, long-polling up to ``fetch_max_wait_ms`` when one leader serves them all).
A fenced or unknown member rejoins with its own member id (a UUID kept for its life).

**Close** accepts the last poll's records (implicit mode), sends what is pending, closes
the share session at every leader it fetched from (the broker releases whatever it still
holds at once, for the others), leaves the group, and stops the thread. A consumer that
dies without closing has its records redelivered when their locks expire.

**Acknowledgements that fail** (as Kafka's ``KafkaShareConsumer``): a retriable failure
(the leader unreachable or moved, a broker restarting, a state write that failed) keeps
them, and they go again with the next fetch or acknowledge of their partition;
``commit_sync`` retries them until its timeout. Whether the member still holds the records
is the broker's to say: one that no longer does (its lock expired, the leader changed and
reloaded the share partition, the member was fenced) answers with a non-retriable error
(``InvalidRecordStateError``...), and the acknowledgements are dropped then; if an
earlier request carrying them got no answer, that refusal is reported as
``AcknowledgementOutcomeUnknownError`` (they may have been applied: ``share_outcomes``).
Every outcome, success or failure, reaches the acknowledgement commit callback
(``acknowledgement_commit_callback`` / ``set_acknowledgement_commit_callback``: ``{partition:
offsets}`` and the error or None), run on the application's thread in ``poll``,
``commit_sync`` and ``close``, as Kafka's; ``commit_sync`` returns each partition's
outcome (a retriable error there means its acknowledgements are still kept); ``close``
reports what it could not send as failed.

Every blocking call takes a ``timeout_ms`` (default ``request_timeout_ms``). Not
thread-safe, as Kafka's: use it from one thread (the heartbeat thread is internal).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

from tidelog.client.config import DEFAULT_BOOTSTRAP
from tidelog.client.connection import Connection
from tidelog.client.errors import ClosedError
from tidelog.client.grpc_connection import grpc_connections
from tidelog.client.positions import monotonic_ms
from tidelog.client.routing import ROUTING_ERRORS, ClusterConnections
from tidelog.client.share_links import ShareLinks, share_call
from tidelog.client.share_outcomes import UnsureAcknowledgements
from tidelog.client.share_wire import (
    Pending,
    ack_messages,
    acquired_records,
    returns_of,
    topic_partitions,
    with_returns,
)
from tidelog.client.types import ConsumerRecord, TopicPartition
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.storage.errors import (
    ClientError,
    FencedMemberEpochError,
    TidelogError,
    UnknownMemberIdError,
    error_for_code,
)

__all__ = ["ACKNOWLEDGE_KINDS", "AcknowledgementCommitCallback", "ShareConsumer"]

log = logging.getLogger(__name__)

# Kafka's AcknowledgeType ids.
ACKNOWLEDGE_KINDS: Mapping[str, int] = {"accept": 1, "release": 2, "reject": 3}
_ACCEPT = 1
_RELEASE = 2
_JOIN_EPOCH = 0
_LEAVE_EPOCH = -1
_RETRY_BACKOFF_MS = 100
_POLL_SLICE_MS = 100

# Kafka's AcknowledgementCommitCallback.onComplete: the offsets of one partition whose
# acknowledgements completed, and their error (None: applied).
AcknowledgementCommitCallback = Callable[
    [dict[TopicPartition, set[int]], TidelogError | None], None
]


class ShareConsumer:
    """One member of a share group. Not thread-safe (module docstring).

    Args:
        bootstrap_servers: ``"host:port[,host:port]"``.
        group_id: the share group.
        client_id: how the broker names this client in descriptions and logs.
        max_poll_records: records one ``poll`` returns at most.
        fetch_max_wait_ms: how long a fetch waits at the broker for records.
        acknowledgement_mode: ``implicit`` (the default; explicit from the first
            ``acknowledge``) or ``explicit`` (Kafka 4.1's ``share.acknowledgement.mode``).
        request_timeout_ms: the default timeout of every blocking call.
        acknowledgement_commit_callback: told of every acknowledgement's outcome
            (module docstring).
        share_fetch_stream: fetch and acknowledge over one ``ShareFetchStream`` per
            leader (module docstring); False: unary ShareFetch / ShareAcknowledge calls.
        fetch_ahead: a commit's request also acquires the next poll's records ("One poll
            ahead" in the module docstring); on by default, False: every poll asks.
    """

    def __init__(
        self,
        bootstrap_servers: str = DEFAULT_BOOTSTRAP,
        group_id: str = "",
        *,
        client_id: str = "tidelog-share-consumer",
        max_poll_records: int = 500,
        fetch_max_wait_ms: int = 500,
        request_timeout_ms: int = 30_000,
        reconnect_backoff_max_ms: int = 1_000,
        acknowledgement_mode: str = "implicit",
        acknowledgement_commit_callback: AcknowledgementCommitCallback | None = None,
        share_fetch_stream: bool = True,
        fetch_ahead: bool = True,
    ) -> None:
        if not group_id:
            raise ValueError("a ShareConsumer needs a group_id")
        if max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError("acknowledgement_mode must be implicit or explicit")
        if fetch_max_wait_ms < 0 or request_timeout_ms < 1:
            raise ValueError("fetch_max_wait_ms must be >= 0 and request_timeout_ms >= 1")
        self.group_id = group_id
        self.member_id = str(uuid.uuid4())
        self.client_id = client_id
        self.max_poll_records = max_poll_records
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.request_timeout_ms = request_timeout_ms
        self._connections = ClusterConnections(
            bootstrap_servers,
            grpc_connections(
                client_id=client_id,
                request_timeout_ms=request_timeout_ms,
                reconnect_backoff_max_ms=reconnect_backoff_max_ms,
            ),
            request_timeout_ms=request_timeout_ms,
        )
        self._lock = threading.Condition()
        # Under _lock: membership as the heartbeat thread keeps it.
        self._subscription: frozenset[str] = frozenset()
        self._subscription_sent = False
        self._epoch = _JOIN_EPOCH
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._interval_ms = 1_000
        self._member_error: TidelogError | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # The application's side (one thread).
        self._explicit = acknowledgement_mode == "explicit"
        # (topic, partition, offset) -> delivery count: plain tuples, hashed in C (a
        # TopicPartition's hash is Python code, and this is a lookup a record).
        self._delivered: dict[tuple[str, int, int], int] = {}
        self._pending: Pending = {}
        self._unsure = UnsureAcknowledgements()  # under _async_lock
        # The last partition ``acknowledge`` wrote to: (topic, partition), the ``_pending``
        # it wrote into and that partition's offsets there (one dict lookup a batch).
        self._acking: tuple[tuple[str, int], Pending, dict[int, int]] | None = None
        self._leaders: set[str] = set()  # addresses fetched from (sessions to close)
        self._async: ThreadPoolExecutor | None = None
        self._async_lock = threading.Lock()  # one acknowledgement send at a time
        self._callback = acknowledgement_commit_callback
        # Outcomes for the callback, run on the application's thread (under _async_lock).
        self._completed: list[tuple[dict[TopicPartition, set[int]], TidelogError | None]] = []
        self._closed = False
        self._links = ShareLinks(streams=share_fetch_stream)
        self._fetch_ahead = fetch_ahead
        # Records acquired ahead by the last acknowledgement's request (``_prefetch``),
        # handed out by the next ``poll``: (record, delivery count).
        self._prefetched: list[tuple[ConsumerRecord, int]] = []

    # --- membership -----------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the group for ``topics`` (replaces the subscription; empty: leave)."""
        self._check_open()
        names = frozenset(topics)
        if not names:
            self.unsubscribe()
            return
        with self._lock:
            self._subscription = names
            self._subscription_sent = False
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._heartbeat_loop, name=f"share-heartbeat-{self.group_id}", daemon=True
            )
            self._thread.start()
        self._wake.set()

    def subscription(self) -> set[str]:
        with self._lock:
            return set(self._subscription)

    def assignment(self) -> set[TopicPartition]:
        """The partitions the coordinator gave this member (shared with others)."""
        with self._lock:
            return set(self._assignment)

    def unsubscribe(self, timeout_ms: int | None = None) -> None:
        """Leave the group (records still held are released by the broker)."""
        self._release_sessions(self._timeout(timeout_ms))
        self._stop_heartbeats(self._timeout(timeout_ms))
        with self._lock:
            self._subscription = frozenset()
            self._assignment = frozenset()
        self._stop = threading.Event()

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                epoch, topics, sent = self._epoch, self._subscription, self._subscription_sent
            try:
                answer = self._heartbeat(epoch, topics if not sent or epoch == 0 else None)
            except (UnknownMemberIdError, FencedMemberEpochError) as exc:
                log.warning("share group %s: %s; rejoining", self.group_id, exc)
                with self._lock:
                    self._epoch = _JOIN_EPOCH
                    self._assignment = frozenset()
                continue
            except ClosedError:
                return
            except TidelogError as exc:
                log.info("share group %s: heartbeat failed: %s", self.group_id, exc)
                with self._lock:
                    self._member_error = exc
                self._wake.wait(_RETRY_BACKOFF_MS / 1000)
                self._wake.clear()
                continue
            with self._lock:
                self._member_error = None
                self._epoch = answer.member_epoch
                if topics is not None and topics == self._subscription:
                    self._subscription_sent = True
                self._interval_ms = max(answer.heartbeat_interval_ms, 10)
                if answer.assignment_changed:
                    self._assignment = frozenset(
                        TopicPartition(t.topic, p) for t in answer.assignment for p in t.partitions
                    )
                self._lock.notify_all()
                interval = self._interval_ms
            self._wake.wait(interval / 1000)
            self._wake.clear()

    def _heartbeat(self, epoch: int, topics: frozenset[str] | None) -> Any:
        request = pb.ShareGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            subscribed_topic_names=sorted(topics or ()),
            client_id=self.client_id,
        )
        return self._connections.run(
            self._connections.route_coordinator(self.group_id),
            lambda c, t: share_call(c, "ShareGroupHeartbeat", request, t),
            what=f"share group {self.group_id} heartbeat",
            timeout_ms=self.request_timeout_ms,
            group_id=self.group_id,
        )

    def _stop_heartbeats(self, timeout_ms: int) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._wake.set()
        thread.join(timeout_ms / 1000)
        self._thread = None
        with self._lock:
            epoch = self._epoch
        if epoch > 0:
            try:
                self._connections.run(
                    self._connections.route_coordinator(self.group_id),
                    lambda c, t: share_call(
                        c,
                        "ShareGroupHeartbeat",
                        pb.ShareGroupHeartbeatRequest(
                            group_id=self.group_id,
                            member_id=self.member_id,
                            member_epoch=_LEAVE_EPOCH,
                        ),
                        t,
                    ),
                    what=f"share group {self.group_id} leave",
                    timeout_ms=timeout_ms,
                    group_id=self.group_id,
                )
            except TidelogError as exc:
                log.warning("share group %s: leaving failed: %s", self.group_id, exc)
        with self._lock:
            self._epoch = _JOIN_EPOCH

    # --- records --------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0) -> list[ConsumerRecord]:
        """Records acquired for this member (at most ``max_poll_records``), waiting up to
        ``timeout_ms`` for some. Implicit mode: the previous poll's records are accepted
        first. Never raises for a broker that is down: returns nothing at the timeout."""
        self._check_open()
        self._implicit_accept()
        self._run_callbacks()  # commit_async's, before anything else
        if self._prefetched:
            # Acquired ahead by the last acknowledgement's request: handed out now, and
            # what is pending goes with a request that may fetch the next poll's.
            records = self._hand_out(self._prefetched)
            self._prefetched = []
            if self._pending:
                self._send_pending(self.request_timeout_ms, prefetch=True)
            self._run_callbacks()
            return records
        deadline = monotonic_ms() + max(timeout_ms, 0)
        while True:
            records = self._fetch_once(max(deadline - monotonic_ms(), 0))
            if records or monotonic_ms() >= deadline:
                self._run_callbacks()  # the outcomes of the acknowledgements it carried
                return records

    def set_acknowledgement_commit_callback(
        self, callback: AcknowledgementCommitCallback | None
    ) -> None:
        """Kafka's ``setAcknowledgementCommitCallback`` (module docstring)."""
        self._callback = callback

    def _run_callbacks(self) -> None:
        with self._async_lock:
            completed, self._completed = self._completed, []
        if self._callback is None:
            return
        for offsets, error in completed:
            self._callback(offsets, error)

    def _settle(
        self,
        acks: Pending,
        outcomes: dict[TopicPartition, TidelogError | None],
        *,
        keep: bool = True,
        unanswered: Iterable[TopicPartition] = (),
    ) -> None:
        """Acknowledgements sent (``acks``) and their outcomes (a partition absent: applied):
        a retriable failure is kept to go again (``keep``), the rest go to the callback.
        ``unanswered``: partitions whose request got no answer (``share_outcomes``: a
        later refusal of them is reported unknown, in ``outcomes`` too)."""
        unsure = set(unanswered)
        for tp, offsets in acks.items():
            error = outcomes.get(tp)
            if tp in unsure and error is not None:
                with self._async_lock:
                    self._unsure.unanswered(tp, offsets, error)
            if error is not None and error.retriable and keep:
                log.info(
                    "share group %s: acknowledging %s failed (%s): sent again",
                    self.group_id,
                    tp,
                    error,
                )
                self._restore_pending({tp: offsets})
                continue
            with self._async_lock:
                error = self._unsure.outcome(tp, offsets, error)
                self._completed.append(({tp: set(offsets)}, error))
            if error is not None:
                outcomes[tp] = error
                log.warning("share group %s: acknowledging %s failed: %s", self.group_id, tp, error)

    def _fetch_once(self, budget_ms: int) -> list[ConsumerRecord]:
        with self._lock:
            assignment = sorted(self._assignment)
            if not assignment and budget_ms > 0:
                self._lock.wait(min(budget_ms, _POLL_SLICE_MS) / 1000)
                assignment = sorted(self._assignment)
        if not assignment:
            self._send_pending(self.request_timeout_ms)  # acknowledgements still count
            return []
        by_leader: dict[str, tuple[Connection, list[TopicPartition]]] = {}
        for tp in assignment:
            try:
                connection = self._connections.leader(tp, self.request_timeout_ms)
            except TidelogError as exc:
                log.info("share group %s: no leader for %s: %s", self.group_id, tp, exc)
                continue
            by_leader.setdefault(connection.address, (connection, []))[1].append(tp)
        if not by_leader:
            time.sleep(min(budget_ms, _RETRY_BACKOFF_MS) / 1000)
            return []
        wait_ms = min(budget_ms, self.fetch_max_wait_ms) if len(by_leader) == 1 else 0
        records: list[ConsumerRecord] = []
        pending = self._take_pending()
        for address, (connection, tps) in by_leader.items():
            acks = {tp: offsets for tp, offsets in pending.items() if tp in tps}
            for tp in acks:
                del pending[tp]
            room = self.max_poll_records - len(records)
            if room <= 0:
                self._restore_pending(acks)
                continue
            records.extend(self._fetch_from(address, connection, tps, acks, room, wait_ms))
        if pending:  # partitions no longer assigned or led by another broker now
            self._restore_pending(pending)
            self._send_pending(self.request_timeout_ms)
        if not records and len(by_leader) > 1 and budget_ms > 0:
            time.sleep(min(budget_ms, _RETRY_BACKOFF_MS) / 1000)
        return records

    def _fetch_from(
        self,
        address: str,
        connection: Connection,
        tps: list[TopicPartition],
        acks: Pending,
        room: int,
        wait_ms: int,
    ) -> list[ConsumerRecord]:
        request = pb.ShareFetchRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            partitions=topic_partitions(tps),
            acknowledgements=ack_messages(acks),
            max_records=room,
            max_wait_ms=wait_ms,
        )
        self._leaders.add(address)
        try:
            answer = self._links.fetch(connection, request, wait_ms + self.request_timeout_ms)
        except TidelogError as exc:
            log.info("share group %s: fetch from %s failed: %s", self.group_id, address, exc)
            self._connections.mark_stale()
            # Retriable: with the next request (unanswered: it may have been applied).
            self._settle(acks, dict.fromkeys(acks, exc), unanswered=acks)
            return []
        self._settle(
            acks,
            {
                TopicPartition(r.topic, r.partition): error_for_code(r.error_code, r.error_message)
                for r in answer.acknowledgements
                if r.error_code
            },
        )
        return self._hand_out(self._acquired(answer))

    def _acquired(self, answer: Any) -> list[tuple[ConsumerRecord, int]]:
        """The records a ShareFetch answer hands this member, with their delivery counts
        (a partition's error logged, and the leaders looked up again if it moved)."""
        out: list[tuple[ConsumerRecord, int]] = []
        for part in answer.partitions:
            if part.error_code:
                error = error_for_code(part.error_code, part.error_message)
                if isinstance(error, ROUTING_ERRORS):
                    self._connections.mark_stale()
                log.info(
                    "share group %s: %s-%d: %s", self.group_id, part.topic, part.partition, error
                )
                continue
            out.extend(acquired_records(part))
        return out

    def _hand_out(self, acquired: list[tuple[ConsumerRecord, int]]) -> list[ConsumerRecord]:
        """The records given to the application: held (``delivery_count``, ``acknowledge``,
        implicit acceptance) from now on."""
        delivered = self._delivered
        for record, count in acquired:
            delivered[(record.topic, record.partition, record.offset)] = count
        return [record for record, _ in acquired]

    def delivery_count(self, record: ConsumerRecord) -> int:
        """Which delivery of ``record`` this is (1 the first); 0 if it is not held."""
        return self._delivered.get((record.topic, record.partition, record.offset), 0)

    # --- acknowledgements -----------------------------------------------------------------

    def acknowledge(self, record: ConsumerRecord, kind: str = "accept") -> None:
        """Acknowledge one record of the last poll (switches to explicit mode): ``accept``
        (done), ``release`` (to any member, at once, its delivery counted) or ``reject``
        (never again). Sent with the next poll or commit. Raises ``ValueError`` for an
        unknown kind or a record this consumer does not hold."""
        self._check_open()
        code = ACKNOWLEDGE_KINDS.get(kind)
        if code is None:
            raise ValueError(f"kind must be one of {sorted(ACKNOWLEDGE_KINDS)}, not {kind!r}")
        key = (record.topic, record.partition)
        if self._delivered.pop((*key, record.offset), None) is None:
            tp = TopicPartition(*key)
            raise ValueError(f"{tp}@{record.offset} is not held by this consumer")
        self._explicit = True
        acking = self._acking
        if acking is None or acking[0] != key or acking[1] is not self._pending:
            pending = self._pending
            acking = (key, pending, pending.setdefault(TopicPartition(*key), {}))
            self._acking = acking
        acking[2][record.offset] = code

    def commit_sync(
        self, timeout_ms: int | None = None
    ) -> dict[TopicPartition, TidelogError | None]:
        """Send every pending acknowledgement now and wait for the answers: each
        partition's outcome (None: applied)."""
        self._check_open()
        self._implicit_accept()
        deadline = monotonic_ms() + self._timeout(timeout_ms)
        outcomes: dict[TopicPartition, TidelogError | None] = {}
        while True:
            outcomes.update(self._send_pending(max(deadline - monotonic_ms(), 1), prefetch=True))
            retry = [e for e in outcomes.values() if e is not None and e.retriable]
            remaining = deadline - monotonic_ms()
            if not retry or remaining <= 0:
                break
            time.sleep(min(remaining, _RETRY_BACKOFF_MS) / 1000)
        self._run_callbacks()
        return outcomes

    def commit_async(
        self,
        callback: Callable[[dict[TopicPartition, TidelogError | None]], None] | None = None,
    ) -> Future[dict[TopicPartition, TidelogError | None]]:
        """``commit_sync`` on a background thread; the future (and ``callback``) get its
        outcomes."""
        self._check_open()
        self._implicit_accept()
        pending = self._take_pending()
        if self._async is None:
            self._async = ThreadPoolExecutor(1, thread_name_prefix="share-commit")

        def send() -> dict[TopicPartition, TidelogError | None]:
            self._restore_pending(pending)
            result = self._send_pending(self.request_timeout_ms)
            if callback is not None:
                callback(result)
            return result

        return self._async.submit(send)

    def _implicit_accept(self) -> None:
        if self._explicit:
            return
        by_partition: dict[tuple[str, int], dict[int, int]] = {}
        for topic, partition, offset in self._delivered:
            by_partition.setdefault((topic, partition), {})[offset] = _ACCEPT
        for (topic, partition), offsets in by_partition.items():
            self._pending.setdefault(TopicPartition(topic, partition), {}).update(offsets)
        self._delivered.clear()

    def _take_pending(self) -> Pending:
        with self._async_lock:
            pending, self._pending = self._pending, {}
        return pending

    def _restore_pending(self, pending: Pending) -> None:
        """Put back acknowledgements taken and not applied; one acknowledged again since
        (a later delivery of the record) is newer and stays."""
        with self._async_lock:
            for tp, offsets in pending.items():
                kept = self._pending.setdefault(tp, {})
                for offset, kind in offsets.items():
                    kept.setdefault(offset, kind)

    def _send_pending(
        self,
        timeout_ms: int,
        *,
        close_session: bool = False,
        prefetch: bool = False,
        returns: Pending | None = None,
    ) -> dict[TopicPartition, TidelogError | None]:
        """Send every pending acknowledgement (to each leader: on its share fetch stream,
        or a ShareAcknowledge); each partition's outcome, settled (``_settle``: kept when
        retriable, unless closing). ``prefetch`` (the application's thread only): the
        requests also acquire the next poll's records (``_prefetch_request``).
        ``returns``: RETURNs of records never handed out, sent along, never reported to
        the application's callback (it never saw them)."""
        pending = self._take_pending()
        sent = with_returns(pending, returns)
        outcomes: dict[TopicPartition, TidelogError | None] = {}
        unanswered: set[TopicPartition] = set()
        try:
            self._send(sent, outcomes, unanswered, timeout_ms, close_session, prefetch)
        finally:
            self._settle(pending, outcomes, keep=not close_session, unanswered=unanswered)
        return {tp: outcomes.get(tp) for tp in pending} | outcomes

    def _send(
        self,
        pending: Pending,
        outcomes: dict[TopicPartition, TidelogError | None],
        unanswered: set[TopicPartition],
        timeout_ms: int,
        close_session: bool,
        prefetch: bool = False,
    ) -> None:
        by_leader: dict[str, tuple[Connection, Pending]] = {}
        for tp, offsets in pending.items():
            try:
                connection = self._connections.leader(tp, timeout_ms)
            except TidelogError as exc:
                outcomes[tp] = exc
                continue
            by_leader.setdefault(connection.address, (connection, {}))[1][tp] = offsets
        if close_session:
            for address in self._leaders:
                if address not in by_leader:
                    by_leader[address] = (self._connections.connection_to(address), {})
        for address, (connection, acks) in by_leader.items():
            if not close_session:
                self._send_on_stream(address, connection, acks, outcomes, timeout_ms, prefetch)
                unanswered.update(tp for tp in acks if isinstance(outcomes.get(tp), ClientError))
                continue
            request = pb.ShareAcknowledgeRequest(
                group_id=self.group_id,
                member_id=self.member_id,
                acknowledgements=ack_messages(acks),
                close_session=close_session,
            )
            try:
                # Not tried again on UNAVAILABLE: the outcome is then unknown (``share_call``).
                answer = share_call(
                    connection, "ShareAcknowledge", request, timeout_ms, retry=not acks
                )
            except TidelogError as exc:
                if isinstance(exc, ROUTING_ERRORS):
                    self._connections.mark_stale()
                outcomes.update(dict.fromkeys(acks, exc))
                unanswered.update(acks)
                continue
            for r in answer.results:
                tp = TopicPartition(r.topic, r.partition)
                outcomes[tp] = (
                    error_for_code(r.error_code, r.error_message) if r.error_code else None
                )

    def _send_on_stream(
        self,
        address: str,
        connection: Connection,
        acks: Pending,
        outcomes: dict[TopicPartition, TidelogError | None],
        timeout_ms: int,
        prefetch: bool,
    ) -> None:
        """``acks`` as a ShareFetch on the leader's stream (a ShareFetch naming no
        partitions only acknowledges), which may also fetch ahead (``_prefetch_request``);
        not tried again on ``UNAVAILABLE``, as a ShareAcknowledge."""
        request = pb.ShareFetchRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            acknowledgements=ack_messages(acks),
        )
        # Not with a RELEASE: released records go to the lowest offsets available, and
        # the request would hand them straight back to the member that gave them up.
        if (
            prefetch
            and self._fetch_ahead
            and not any(_RELEASE in offsets.values() for offsets in acks.values())
        ):
            self._prefetch_request(request, address, timeout_ms)
        try:
            answer = self._links.fetch(connection, request, timeout_ms, retry=False)
        except TidelogError as exc:
            if isinstance(exc, ROUTING_ERRORS):
                self._connections.mark_stale()
            outcomes.update(dict.fromkeys(acks, exc))
            return
        for r in answer.acknowledgements:
            tp = TopicPartition(r.topic, r.partition)
            outcomes[tp] = error_for_code(r.error_code, r.error_message) if r.error_code else None
        if request.partitions:
            self._prefetched.extend(self._acquired(answer))

    def _prefetch_request(
        self, request: pb.ShareFetchRequest, address: str, timeout_ms: int
    ) -> None:
        """Make ``request`` (acknowledgements to ``address``'s broker) also acquire the
        next poll's records from the assigned partitions it leads, without waiting: at
        most ``max_poll_records`` less what is already fetched ahead, so nothing is
        acquired more than one poll before the application can take it (the locks run
        from the acquisition, as Kafka's share consumer's fetched-ahead records' do)."""
        room = self.max_poll_records - len(self._prefetched)
        if room <= 0:
            return
        with self._lock:
            assignment = sorted(self._assignment)
        led = [tp for tp in assignment if self._leader_address(tp, timeout_ms) == address]
        if not led:
            return
        request.partitions.extend(topic_partitions(led))
        request.max_records = room
        request.max_wait_ms = 0
        self._leaders.add(address)

    def _leader_address(self, tp: TopicPartition, timeout_ms: int) -> str | None:
        try:
            return self._connections.leader(tp, timeout_ms).address
        except TidelogError:
            return None

    def _release_sessions(self, timeout_ms: int) -> None:
        """Send what is pending and close the share session at every leader fetched from
        (the broker releases what this member still holds there)."""
        self._implicit_accept()
        # Records fetched ahead and never handed out go back as RETURN: not a delivery,
        # their counts as before (the closed sessions would release them as delivered).
        returns = returns_of(self._prefetched)
        self._prefetched = []
        self._send_pending(timeout_ms, close_session=True, returns=returns)  # to the callback
        self._leaders.clear()
        self._delivered.clear()

    # --- lifecycle ------------------------------------------------------------------------

    def close(self, timeout_ms: int | None = None) -> None:
        """Acknowledge (implicit mode: accept the last poll's records), release what is
        still held, leave the group and stop. Idempotent."""
        if self._closed:
            return
        timeout = self._timeout(timeout_ms)
        try:
            if self._async is not None:
                self._async.shutdown(wait=True)  # its retriable failures: sent below
            self._release_sessions(timeout)
            self._stop_heartbeats(timeout)
            self._run_callbacks()
        finally:
            self._closed = True
            self._links.close()
            self._connections.close()

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the share consumer is closed")

    def _timeout(self, timeout_ms: int | None) -> int:
        return self.request_timeout_ms if timeout_ms is None else max(timeout_ms, 1)
