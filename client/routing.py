"""Routing: which broker each call goes to, and following it when it moves.

``ClusterConnections`` owns one ``Connection`` per broker (opened on first use, by
``HOST:PORT``), the bootstrap list and a ``client.cluster.MetadataCache``. It answers:

- ``metadata()``: the cluster's metadata, refreshed when due (asked of the brokers it
  knows, then of the bootstrap list, the first that answers; brokers that failed are
  asked last, see below);
- ``leader(tp)``, ``coordinator(group_id)``, ``controller()``, ``any_broker()``: the
  connection to use;
- ``run_on_every_broker(call)``: a call every live broker must answer (listing groups,
  setting quotas), asked again of the brokers that missed it until its timeout;
- ``run(route, call)``: make a call through a route and follow the target when it moves.
  ``NOT_LEADER_OR_FOLLOWER``, ``LEADER_NOT_AVAILABLE``, ``NOT_COORDINATOR``,
  ``NOT_CONTROLLER`` and an unreachable broker mark the metadata stale (and forget the
  group's coordinator) and the call is tried again, backing off 100 ms -> 1 s, until its
  timeout; then the last error is raised, so an offline partition fails clearly with a
  retriable ``LeaderNotAvailableError`` instead of hanging. The error raised then says
  how long the call was tried and what its first failure was.

Which broker to ask (``client.cluster.BrokerAvoidance``): a broker whose connection
failed is avoided, for calls any broker answers and for metadata, while its backoff
(1 s doubling to 10 s) runs; after a routing error (``NOT_LEADER_OR_FOLLOWER``, a
metadata answer without a leader, ...) the broker whose metadata routed the call and the
broker that refused it are suspected, so the next refresh is asked of another broker,
rotating through the known brokers and the bootstrap list (issue #33): a broker cut off
from the cluster (its ZooKeeper session lost) is not asked again and again, and a dead
bootstrap broker does not keep every administrative call waiting (issue #25). Kafka's
clients pick the least loaded node for metadata, which has the same effect.

A metadata refresh that no broker answers says for how long no broker has answered
(since the first failed refresh, not the last slice of the caller's deadline) and the
first failure's cause.

A single node answers ``Metadata`` as a one-broker cluster (broker 0 leads everything),
so the same code serves it with one connection.

Thread-safe: ``_lock`` guards the cache and the connection tables; calls to brokers are
made outside it. Time is injected (``monotonic_ms``, ``sleep_ms``) so tests drive the
backoff with a manual clock.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from tidelog.client.cluster import (
    BrokerAvoidance,
    BrokerNode,
    ClusterMetadata,
    MetadataCache,
    parse_bootstrap_list,
)
from tidelog.client.connection import Connection, ConnectionFactory
from tidelog.client.errors import ClosedError
from tidelog.client.types import TopicPartition
from tidelog.storage.errors import (
    BrokerUnavailableError,
    CoordinatorLoadInProgressError,
    FencedLeaderEpochError,
    InternalError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotControllerError,
    NotCoordinatorError,
    NotLeaderOrFollowerError,
    OffsetNotAvailableError,
    TidelogError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
)

__all__ = ["ROUTING_ERRORS", "ClusterConnections"]

log = logging.getLogger(__name__)

T = TypeVar("T")
V = TypeVar("V")
R = TypeVar("R")

ROUTING_ERRORS: tuple[type[TidelogError], ...] = (
    NotLeaderOrFollowerError,
    LeaderNotAvailableError,
    FencedLeaderEpochError,
    UnknownLeaderEpochError,
    NotCoordinatorError,
    CoordinatorLoadInProgressError,
    NotControllerError,
    BrokerUnavailableError,
)
"""Errors that mean "ask someone else": refresh the metadata and try again."""

_LATER_ERRORS: tuple[type[TidelogError], ...] = (OffsetNotAvailableError,)
"""Per-partition answers that mean "ask the same leader again soon": a new leader whose
high watermark is not established yet (Kafka's admin and consumer retry
``OFFSET_NOT_AVAILABLE`` the same way). Not the broker's fault: it is not reported."""

# Refusals that say the refusing broker's view, or the view of the broker whose metadata
# routed the call, is wrong: both are asked for metadata after the others next time.
_SUSPECT_ERRORS: tuple[type[TidelogError], ...] = (
    NotLeaderOrFollowerError,
    LeaderNotAvailableError,
    UnknownLeaderEpochError,
    NotControllerError,
)

_INITIAL_BACKOFF_MS = 100
_MAX_BACKOFF_MS = 1_000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _sleep_ms(duration_ms: int) -> None:
    time.sleep(duration_ms / 1000)


def _causes(first: TidelogError | None, last: TidelogError | None) -> str:
    """`` (first error: ...; last error: ...)`` for a message; the last only if it differs."""
    if first is None:
        return "" if last is None else f" ({last})"
    if last is None or str(last) == str(first):
        return f" (first error: {first})"
    return f" (first error: {first}; last error: {last})"


def _gave_up(what: str, waited_ms: int, first: TidelogError, last: TidelogError) -> TidelogError:
    """A copy of ``last`` (same class and attributes: callers catch by class) whose message
    names the whole time the call was tried and the first cause."""
    message = f"{what}: gave up after {waited_ms} ms"
    # The same error again, or one that names its own first cause already (a metadata
    # refresh that no broker answered): said once.
    if str(first) in str(last) or "(first error: " in str(last):
        message = f"{message}: {last}"
    else:
        message = f"{message}; first error: {first}; last error: {last}"
    error = copy.copy(last)
    error.args = (message,)
    return error


class ClusterConnections:
    """Connections per broker and the metadata that routes calls. Thread-safe.

    Args:
        bootstrap_servers: ``"h1:p1,h2:p2"``; any one live broker is enough.
        connect: opens a ``Connection`` to an address (gRPC, or an in-memory fake).
        request_timeout_ms: the default timeout of a routed call.
        metadata_max_age_ms: refresh metadata this often even when nothing moved.
        monotonic_ms, sleep_ms: the clock (tests pass a manual one).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        connect: ConnectionFactory,
        *,
        request_timeout_ms: int,
        metadata_max_age_ms: int = 300_000,
        monotonic_ms: Callable[[], int] = _monotonic_ms,
        sleep_ms: Callable[[int], None] = _sleep_ms,
    ) -> None:
        self.bootstrap = parse_bootstrap_list(bootstrap_servers)
        self.request_timeout_ms = request_timeout_ms
        self._connect = connect
        self._monotonic_ms = monotonic_ms
        self._sleep_ms = sleep_ms
        self._lock = threading.Lock()
        self._cache = MetadataCache(metadata_max_age_ms)  # guarded by _lock
        self._by_address: dict[str, Connection] = {}  # guarded by _lock
        self._coordinators: dict[str, BrokerNode] = {}  # group id -> node; guarded by _lock
        # broker id -> the address its metadata answer came through; guarded by _lock.
        self._answered_by: dict[int, str] = {}
        self._avoidance = BrokerAvoidance()  # guarded by _lock
        self._metadata_from: str | None = None  # the last metadata answer's; guarded by _lock
        # Since when no metadata refresh got an answer, and why the first failed (None:
        # the last one was answered); guarded by _lock.
        self._unanswered_since_ms: int | None = None
        self._first_unanswered: TidelogError | None = None
        self._closed = False

    # --- connections ----------------------------------------------------------------------

    def connection_to(self, address: str) -> Connection:
        """The connection to ``address``, opened on first use."""
        with self._lock:
            if self._closed:
                raise ClosedError("the client is closed")
            connection = self._by_address.get(address)
            if connection is None:
                connection = self._connect(address)
                self._by_address[address] = connection
            return connection

    def address_of(self, node: BrokerNode) -> str:
        """Where to reach ``node``: the address it answered metadata through, if it did,
        else the address it advertises.

        A broker reached through a proxy, a tunnel or NAT advertises an address the client
        may not reach; the address that got its answer certainly does. (Kafka's clients
        always use the advertised one; a single node behind a proxy then works only with
        ``advertised.listeners`` set to the proxy.)
        """
        with self._lock:
            return self._answered_by.get(node.id, node.address)

    def bootstrap_connection(self) -> Connection:
        """A connection to the first bootstrap address."""
        return self.connection_to(self.bootstrap[0])

    def report_failure(self, address: str | None, error: TidelogError) -> None:
        """A call to ``address`` (None: no broker was reached) failed with ``error``.

        An unreachable broker backs off; a broker refusing with a routing error (its view
        or the caller's is wrong) is asked for metadata after the others. Other errors
        change nothing. The caller still marks the metadata stale (``mark_stale``).
        """
        if address is None:
            return
        now = self._monotonic_ms()
        with self._lock:
            if isinstance(error, BrokerUnavailableError):
                self._avoidance.unreachable(address, now)
            elif isinstance(error, _SUSPECT_ERRORS):
                self._avoidance.suspect(address)

    def report_success(self, address: str) -> None:
        """``address`` answered a call: it is reachable and in good standing."""
        with self._lock:
            self._avoidance.reachable(address)
            self._avoidance.trusted(address)

    def broker(self, broker_id: int, timeout_ms: int | None = None) -> Connection:
        """The connection to broker ``broker_id``; ``BrokerUnavailableError`` if unknown."""
        node = self.metadata(timeout_ms=timeout_ms).brokers.get(broker_id)
        if node is None:
            self.mark_stale()
            raise BrokerUnavailableError(f"broker {broker_id} is not in the cluster's metadata")
        return self.connection_to(self.address_of(node))

    def time_left(self, timeout_ms: int | None) -> Callable[[], int]:
        """A budget for a call made of several steps: a function giving the ms left of
        ``timeout_ms`` (None: ``request_timeout_ms``) from now, at least 1 (a step started
        after the deadline gets 1 ms, so it fails at once with its timeout)."""
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = self._monotonic_ms() + timeout
        return lambda: max(deadline - self._monotonic_ms(), 1)

    # --- metadata -------------------------------------------------------------------------

    def mark_stale(self) -> None:
        """The metadata is wrong somewhere: the next ``metadata()`` refreshes it, asking
        another broker than the one whose answer this was first."""
        with self._lock:
            self._cache.mark_stale()
            if self._metadata_from is not None:
                self._avoidance.suspect(self._metadata_from)

    def metadata(self, *, timeout_ms: int | None = None, force: bool = False) -> ClusterMetadata:
        """The cluster's metadata, fetched if due (``force``: unless it is backing off).

        The brokers are asked in ``BrokerAvoidance`` order: the one that answered last,
        the others it knows, the bootstrap list; unreachable and suspected ones last.

        Raises ``BrokerUnavailableError`` when no broker answered, naming how long no
        refresh has been answered and the first cause (the last error of the last broker
        tried otherwise).
        """
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        now = self._monotonic_ms()
        with self._lock:
            current = self._cache.current
            if force:
                self._cache.mark_stale()
            if current is not None and not self._cache.refresh_due(now):
                return current
            self._cache.attempted(now)
            known = [] if self._metadata_from is None else [self._metadata_from]
            known += self._answered_by.values()
            if current is not None:
                known += [self._answered_by.get(b.id, b.address) for b in current.brokers.values()]
            addresses = self._avoidance.order([*known, *self.bootstrap], now)
        deadline = now + timeout
        error: TidelogError | None = None
        first_error: TidelogError | None = None
        for index, address in enumerate(addresses):
            remaining = deadline - self._monotonic_ms()
            if remaining <= 0:
                break
            # Share what is left among the addresses not tried yet: one dead broker must
            # not eat the whole timeout while another would answer at once.
            share = max(remaining // (len(addresses) - index), 1)
            try:
                answer = self.connection_to(address).metadata(
                    include_internal=True, timeout_ms=share
                )
            except ClosedError:
                raise
            except TidelogError as exc:
                log.info("no metadata from %s: %s", address, exc)
                error = exc
                first_error = first_error or exc
                self.report_failure(address, exc)
                continue
            with self._lock:
                self._cache.update(answer, self._monotonic_ms())
                self._answered_by[answer.broker_id] = address
                self._metadata_from = address
                self._avoidance.reachable(address)
                self._unanswered_since_ms = None
                self._first_unanswered = None
            return answer
        with self._lock:
            current = self._cache.current
            # The caller may ask again and again with what is left of its own deadline:
            # the error names the whole time without an answer and the first cause, not
            # this attempt's slice (issue #25).
            if self._unanswered_since_ms is None:
                self._unanswered_since_ms = now
                self._first_unanswered = first_error
            since_ms = self._unanswered_since_ms
            first = self._first_unanswered or first_error
        if current is not None and not force:
            return current  # old, but the best there is; the next call tries again
        if isinstance(error, (BrokerUnavailableError, KafkaTimeoutError)) or error is None:
            waited = self._monotonic_ms() - since_ms
            raise BrokerUnavailableError(
                f"no broker of {','.join(addresses)} answered a metadata request"
                f" for {waited} ms" + _causes(first, error)
            )
        raise error

    def refresh_in_ms(self) -> int:
        """How long until a metadata refresh may go out (0: now)."""
        now = self._monotonic_ms()
        with self._lock:
            return max(self._cache.next_refresh_ms() - now, 0)

    def confirmed(self) -> None:
        """A routed call succeeded: the metadata backoff starts over at 100 ms, and the
        broker whose metadata routed it is in good standing."""
        with self._lock:
            self._cache.confirmed()
            if self._metadata_from is not None:
                self._avoidance.trusted(self._metadata_from)

    # --- routes ---------------------------------------------------------------------------

    def leader(self, tp: TopicPartition, timeout_ms: int | None = None) -> Connection:
        """The connection to ``tp``'s leader.

        Raises ``UnknownTopicOrPartitionError`` if the cluster does not know ``tp``,
        ``LeaderNotAvailableError`` (retriable) if it is offline.
        """
        metadata = self.metadata(timeout_ms=timeout_ms)
        if metadata.partition(tp) is None:
            metadata = self.metadata(timeout_ms=timeout_ms, force=True)
        partition = metadata.partition(tp)
        if partition is None:
            count = metadata.partition_count(tp.topic)
            if count is None:
                raise UnknownTopicOrPartitionError(f"{tp}: unknown topic {tp.topic!r}")
            raise UnknownTopicOrPartitionError(
                f"{tp}: topic {tp.topic!r} has {count} partition(s), no partition {tp.partition}"
            )
        node = metadata.leader_for(tp)
        if node is None:
            self.mark_stale()
            raise LeaderNotAvailableError(
                f"{tp} is offline: no broker leads it (leader {partition.leader})"
            )
        return self.connection_to(self.address_of(node))

    def coordinator(self, group_id: str, timeout_ms: int | None = None) -> Connection:
        """The connection to ``group_id``'s coordinator (found once, then remembered)."""
        with self._lock:
            node = self._coordinators.get(group_id)
        if node is None:
            connection = self.any_broker(timeout_ms)
            try:
                node = connection.find_coordinator(group_id, timeout_ms=timeout_ms)
            except TidelogError as exc:
                self.report_failure(connection.address, exc)
                raise
            with self._lock:
                self._coordinators[group_id] = node
        return self.connection_to(self.address_of(node))

    def forget_coordinator(self, group_id: str) -> None:
        """The coordinator moved or is gone: find it again next time."""
        with self._lock:
            self._coordinators.pop(group_id, None)

    def controller(self, timeout_ms: int | None = None) -> Connection:
        """The connection to the controller; ``NotControllerError`` while there is none."""
        metadata = self.metadata(timeout_ms=timeout_ms)
        node = metadata.controller
        if node is None:
            self.mark_stale()
            raise NotControllerError("the cluster has no controller at the moment")
        return self.connection_to(self.address_of(node))

    def bootstrap_or_any(self) -> Connection:
        """A connection for a call any broker answers, from the metadata at hand: the
        broker that answered it last, else another broker it lists, else a bootstrap
        address; a broker that failed to connect or is suspected comes last."""
        now = self._monotonic_ms()
        with self._lock:
            current = self._cache.current
            candidates: list[str] = []
            if current is not None:
                node = current.brokers.get(current.broker_id)
                if node is not None:
                    candidates.append(self._answered_by.get(node.id, node.address))
                candidates += [
                    self._answered_by.get(b.id, b.address) for b in current.brokers.values()
                ]
            address = self._avoidance.order([*candidates, *self.bootstrap], now)[0]
        return self.connection_to(address)

    def any_broker(self, timeout_ms: int | None = None) -> Connection:
        """As ``bootstrap_or_any``, with the metadata refreshed first when it is due (stale
        after a failure): a dead broker's place is taken by a live one it names."""
        self.metadata(timeout_ms=timeout_ms)
        return self.bootstrap_or_any()

    # --- calls that follow their target ---------------------------------------------------

    def run(
        self,
        route: Callable[[int], Connection],
        call: Callable[[Connection, int], T],
        *,
        what: str,
        timeout_ms: int | None = None,
        group_id: str | None = None,
    ) -> T:
        """``call(route(t), t)`` again until it succeeds or ``timeout_ms`` passes.

        ``t`` is the time left in ms. A routing error (``ROUTING_ERRORS``) marks the
        metadata stale (and forgets ``group_id``'s coordinator), waits 100 ms doubling
        to 1 s, and tries again; at the timeout it is raised (also when the deadline
        cuts the attempt after it short: a ``KafkaTimeoutError`` then stands only for a
        call that never got an answer), its message naming the whole time tried and the
        first error. Any other error is raised at once. The broker that failed is
        reported (``report_failure``): unreachable, it backs off; refusing, it is asked
        for metadata after the others.
        """
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        started = self._monotonic_ms()
        deadline = started + timeout
        backoff = _INITIAL_BACKOFF_MS
        refused: TidelogError | None = None
        first: TidelogError | None = None
        while True:
            remaining = max(deadline - self._monotonic_ms(), 1)
            connection: Connection | None = None
            try:
                connection = route(remaining)
                result = call(connection, remaining)
            except KafkaTimeoutError as exc:
                # The deadline cut a retry short: what kept the call from succeeding is
                # the refusal before it, not the last attempt's want of time.
                if refused is None or first is None or self._monotonic_ms() < deadline:
                    raise
                raise _gave_up(what, self._monotonic_ms() - started, first, refused) from exc
            except ROUTING_ERRORS as exc:
                refused = exc
                first = first or exc
                self.report_failure(None if connection is None else connection.address, exc)
                self.mark_stale()
                if group_id is not None:
                    self.forget_coordinator(group_id)
                remaining = deadline - self._monotonic_ms()
                if remaining <= 0:
                    raise _gave_up(what, self._monotonic_ms() - started, first, exc) from exc
                log.info("%s: %s; asking again in %d ms", what, exc, min(backoff, remaining))
                self._sleep_ms(min(backoff, remaining))
                backoff = min(backoff * 2, _MAX_BACKOFF_MS)
                continue
            self.report_success(connection.address)
            self.confirmed()
            return result

    def run_per_leader(
        self,
        items: Mapping[TopicPartition, V],
        call: Callable[
            [Connection, dict[TopicPartition, V], int], Mapping[TopicPartition, R | TidelogError]
        ],
        *,
        what: str,
        timeout_ms: int | None = None,
        known: bool = False,
        offline: Callable[[TopicPartition], R] | None = None,
    ) -> dict[TopicPartition, R]:
        """One ``call`` per leader with its partitions' ``items``, until every one answered.

        ``call`` returns a value per partition, or for a partition that failed its
        ``TidelogError``. Partitions whose leader moved or is offline (a routing error,
        theirs or the call's) are sent again to their new leader after a backoff until
        ``timeout_ms``; then their error is raised. So are partitions answered
        ``OFFSET_NOT_AVAILABLE`` (``_LATER_ERRORS``: a new leader's high watermark is
        not known yet). Any other error is raised at once.
        ``known``: the partitions exist (a broker described them), so metadata that
        lacks one comes from a broker whose view is behind (a topic created a moment
        ago): asked again like an offline partition, not raised as unknown.
        ``offline``: the answer for a partition the metadata shows without a live leader
        (a describe reports it as it is, as Kafka's ``describeTopics`` does), instead of
        asking again until the timeout for a leader to come back.
        """
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        started = self._monotonic_ms()
        deadline = started + timeout
        backoff = _INITIAL_BACKOFF_MS
        pending = dict(items)
        out: dict[TopicPartition, R] = {}
        first: TidelogError | None = None
        while True:
            remaining = max(deadline - self._monotonic_ms(), 1)
            failed: dict[TopicPartition, TidelogError] = {}
            by_leader: dict[str, tuple[Connection, dict[TopicPartition, V]]] = {}
            for tp, item in pending.items():
                try:
                    connection = self.leader(tp, remaining)
                except LeaderNotAvailableError as exc:
                    if offline is not None:
                        out[tp] = offline(tp)
                    else:
                        failed[tp] = exc
                    continue
                except ROUTING_ERRORS as exc:
                    failed[tp] = exc
                    continue
                except UnknownTopicOrPartitionError as exc:
                    if not known:
                        raise
                    failed[tp] = LeaderNotAvailableError(f"{tp}: the metadata is behind ({exc})")
                    continue
                by_leader.setdefault(connection.address, (connection, {}))[1][tp] = item
            for connection, batch in by_leader.values():
                try:
                    answers = call(connection, batch, remaining)
                except ROUTING_ERRORS as exc:
                    self.report_failure(connection.address, exc)
                    failed.update(dict.fromkeys(batch, exc))
                    continue
                except _LATER_ERRORS as exc:
                    failed.update(dict.fromkeys(batch, exc))
                    continue
                for tp in batch:
                    if tp not in answers:
                        raise InternalError(f"{what}: the broker did not answer for {tp}")
                    answer = answers[tp]
                    if isinstance(answer, ROUTING_ERRORS):
                        self.report_failure(connection.address, answer)
                        failed[tp] = answer
                    elif isinstance(answer, _LATER_ERRORS):
                        failed[tp] = answer
                    elif isinstance(answer, TidelogError):
                        raise answer
                    else:
                        out[tp] = answer
            if not failed:
                self.confirmed()
                return out
            if not all(isinstance(e, _LATER_ERRORS) for e in failed.values()):
                self.mark_stale()  # a leader moved; not for "same leader, later"
            pending = {tp: pending[tp] for tp in failed}
            last = next(iter(failed.values()))
            first = first or last
            remaining = deadline - self._monotonic_ms()
            if remaining <= 0:
                raise _gave_up(what, self._monotonic_ms() - started, first, last) from last
            log.info(
                "%s: %d partition(s) to ask again in %d ms (%s)",
                what,
                len(failed),
                min(backoff, remaining),
                next(iter(failed.values())),
            )
            self._sleep_ms(min(backoff, remaining))
            backoff = min(backoff * 2, _MAX_BACKOFF_MS)

    def run_on_every_broker(
        self,
        call: Callable[[Connection, int], T],
        *,
        what: str,
        timeout_ms: int | None = None,
    ) -> dict[int, T]:
        """``call(connection, t)`` on every live broker; the answers by broker id.

        The live brokers are those of the cluster's metadata. A broker that cannot be
        reached (or answers a routing error) marks the metadata stale; after a backoff
        (100 ms doubling to 1 s) the brokers of the fresh metadata that have not answered
        yet are asked, until all have or ``timeout_ms`` passes (then the last error is
        raised). A broker that left the cluster meanwhile is no longer waited for, and
        its answer, if it gave one, is dropped. Any other error is raised at once.
        """
        timeout = self.request_timeout_ms if timeout_ms is None else timeout_ms
        started = self._monotonic_ms()
        deadline = started + timeout
        backoff = _INITIAL_BACKOFF_MS
        answers: dict[int, T] = {}
        force = False
        first: TidelogError | None = None
        while True:
            metadata = self.metadata(
                timeout_ms=max(deadline - self._monotonic_ms(), 1), force=force
            )
            failed: TidelogError | None = None
            pending = [(i, b) for i, b in sorted(metadata.brokers.items()) if i not in answers]
            for index, (broker_id, node) in enumerate(pending):
                # Share what is left among the brokers not asked yet plus one more round:
                # a dead broker (one whose ZooKeeper session has not expired yet; the
                # transport waits for an unreachable broker until its deadline) must not
                # eat the whole timeout, even when it is asked last; after a refresh it is
                # asked again, or dropped if it left the cluster.
                left = deadline - self._monotonic_ms()
                remaining = max(left // (len(pending) - index + 1), 1)
                address = self.address_of(node)
                try:
                    answers[broker_id] = call(self.connection_to(address), remaining)
                except ROUTING_ERRORS as exc:
                    log.info("%s: broker %d: %s", what, broker_id, exc)
                    self.report_failure(address, exc)
                    failed = exc
                    first = first or exc
            if failed is None:
                self.confirmed()
                return {i: answer for i, answer in answers.items() if i in metadata.brokers}
            self.mark_stale()
            force = True
            remaining = deadline - self._monotonic_ms()
            if remaining <= 0:
                assert first is not None
                raise _gave_up(what, self._monotonic_ms() - started, first, failed) from failed
            self._sleep_ms(min(backoff, remaining))
            backoff = min(backoff * 2, _MAX_BACKOFF_MS)

    def route_leader(self, tp: TopicPartition) -> Callable[[int], Connection]:
        return lambda timeout_ms: self.leader(tp, timeout_ms)

    def route_coordinator(self, group_id: str) -> Callable[[int], Connection]:
        return lambda timeout_ms: self.coordinator(group_id, timeout_ms)

    def route_controller(self) -> Callable[[int], Connection]:
        return lambda timeout_ms: self.controller(timeout_ms)

    def route_any(self) -> Callable[[int], Connection]:
        return lambda timeout_ms: self.any_broker(timeout_ms)

    # --- life cycle -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close every connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            connections = list(self._by_address.values())
            self._by_address.clear()
        for connection in connections:
            connection.close()

    def connections(self) -> Sequence[Connection]:
        """The connections opened so far (for tests and diagnostics)."""
        with self._lock:
            return list(self._by_address.values())
