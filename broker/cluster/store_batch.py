"""The store's batched half: many znodes read, or many topics written, per round trip.

Issue #34 measured where topic creation's time went before this module: not in any
computation but in synchronous ZooKeeper round trips, one per znode. Each broker's
metadata watcher re-read every topic, config and partition state one ``get`` at a time
after every change (so a burst of N new topics cost each broker O(N^2) round trips:
10 topics of 4 partitions at RF=3 took 2.7 s one after another, one CreateTopics of 60
took 49 s), the controller created them one event, one transaction and one wait for the
view per topic, and its reconciliation read every state znode one at a time.

Here, as Kafka's ZooKeeper-era controller does with its ``ZooKeeperClient.
handleRequests`` (pipelined async requests, then wait for all answers), every read of
many znodes sends all the ``get``s with kazoo's asynchronous calls first and collects
the answers after (``_CHUNK`` at most in flight, to bound memory), and many topics are
created or deleted as one fenced ``transaction()`` (ZooKeeper's multi) per topic, all
committed asynchronously together: each topic stays all-or-nothing and gets its own
answer (one that exists fails alone, as in Kafka), and a deposed controller still
writes nothing (every transaction checks ``/controller_epoch``'s version first).

Reads are not retried here (kazoo's ``KazooRetry`` only wraps synchronous calls): a
lost connection is a ``StoreError`` and the caller reads again (the watcher's retry
loop, the controller's next event). ``watch`` sets a one-shot watch on each znode read
(ZooKeeper's own), which the metadata watcher uses to keep its image
(``broker.cluster.metadata``).

``ClusterStore`` (``broker.cluster.store``) inherits these methods; it is still the one
place that holds the kazoo session.

Thread-safe: kazoo's client is, and nothing else is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from tidelog.broker.cluster.errors import ControllerMovedError, StaleStateError, StoreError
from tidelog.broker.cluster.znodes import (
    BROKER_IDS,
    CONTROLLER,
    CONTROLLER_EPOCH,
    TOPICS,
    BrokerRegistration,
    PartitionState,
    TopicAssignment,
    broker_path,
    decode_broker,
    decode_controller,
    decode_partition_state,
    decode_topic,
    decode_topic_config,
    encode_partition_state,
    encode_topic,
    encode_topic_config,
    partition_state_path,
    partitions_path,
    topic_config_path,
    topic_path,
)

__all__ = [
    "BatchOps",
    "ClusterRead",
    "NewTopicWrite",
    "Roots",
    "StateWrite",
    "Watch",
    "raise_for_fenced",
    "stage_topic_creation",
]

_CHUNK = 2_000  # requests in flight at once
_TIMEOUT_S = 30.0  # one answer's wait (the session's own timeouts end it sooner)

# A one-shot ZooKeeper watch: called with kazoo's WatchedEvent on kazoo's thread.
Watch = Callable[[Any], None]

# What a new topic writes: its assignment, its config and its partitions' first states.
NewTopicWrite = tuple[TopicAssignment, Mapping[str, str], Mapping[int, PartitionState]]

# One partition's state to write: topic, partition, the state, the znode version read.
StateWrite = tuple[str, int, PartitionState, int]

_K = TypeVar("_K")  # what ``_commit_all`` answers per: a topic name, a partition


def raise_for_fenced(results: Sequence[object], what: str, *, exists_is_stale: bool) -> None:
    """Interpret a fenced transaction's results (the first op checks the epoch).

    Raises ``ControllerMovedError`` (the epoch moved on), ``StaleStateError`` (a znode
    moved on, went, or, with ``exists_is_stale``, exists) or ``StoreError``.
    """
    if not any(isinstance(r, Exception) for r in results):
        return
    if isinstance(results[0], BadVersionError):
        raise ControllerMovedError(f"{what}: the controller epoch moved on")
    failure = next(
        r for r in results if isinstance(r, Exception) and r.__class__.__name__ != "RolledBackError"
    )
    if isinstance(failure, (BadVersionError, NoNodeError)) or (
        exists_is_stale and isinstance(failure, NodeExistsError)
    ):
        raise StaleStateError(f"{what}: {failure!r}")
    raise StoreError(f"{what}: {failure!r}")


class BatchOps:
    """Batched reads and fenced topic writes over ``_client`` (``ClusterStore``'s)."""

    _client: KazooClient

    def _fenced(self, lease: Any) -> Any:  # a ControllerLease; kazoo's TransactionRequest
        transaction = self._client.transaction()
        transaction.check(CONTROLLER_EPOCH, lease.epoch_version)
        return transaction

    # --- reads -------------------------------------------------------------------------

    def get_many(
        self, paths: Iterable[str], watch: Watch | None = None
    ) -> dict[str, tuple[bytes, Any] | None]:
        """``(data, stat)`` of each path, None for one that does not exist; every ``get``
        sent before any answer is awaited. Raises ``StoreError``."""
        out: dict[str, tuple[bytes, Any] | None] = {}
        wanted = list(dict.fromkeys(paths))
        for start in range(0, len(wanted), _CHUNK):
            try:
                pending = [
                    (path, self._client.get_async(path, watch=watch))
                    for path in wanted[start : start + _CHUNK]
                ]
            except Exception as exc:
                raise StoreError(f"reading {len(wanted)} znodes: {exc}") from exc
            for path, answer in pending:
                try:
                    data, stat = answer.get(timeout=_TIMEOUT_S)
                except NoNodeError:
                    out[path] = None
                    continue
                except Exception as exc:
                    raise StoreError(f"reading {path}: {exc!r}") from exc
                out[path] = (bytes(data), stat)
        return out

    def read_roots(self) -> Roots:
        """The registrations (with their epochs), the topic list and the controller, in
        two pipelined rounds: the metadata watcher's fixed reads, which one at a time
        cost it about eight round trips per re-read. Raises ``StoreError``."""
        try:
            pending = (
                self._client.get_children_async(BROKER_IDS),
                self._client.get_children_async(TOPICS),
                self._client.get_async(CONTROLLER),
            )
        except Exception as exc:
            raise StoreError(f"reading the cluster's roots: {exc}") from exc
        answers: list[Any] = []
        for answer in pending:
            try:
                answers.append(answer.get(timeout=_TIMEOUT_S))
            except NoNodeError:
                answers.append(None)
            except Exception as exc:
                raise StoreError(f"reading the cluster's roots: {exc!r}") from exc
        ids, topics, controller = answers
        wanted = sorted(int(c) for c in ids or () if c.isdigit())
        found = self.get_many(broker_path(b) for b in wanted)
        registrations: dict[int, BrokerRegistration] = {}
        epochs: dict[int, int] = {}
        for broker_id in wanted:
            read = found[broker_path(broker_id)]
            if read is not None:  # it went while read
                registrations[broker_id] = decode_broker(broker_id, read[0])
                epochs[broker_id] = int(read[1].czxid)
        return Roots(
            registrations,
            epochs,
            sorted(topics or ()),
            None if controller is None else decode_controller(bytes(controller[0])),
        )

    def topic_names(self, watch: Watch | None = None) -> list[str]:
        """The children of ``/brokers/topics``, sorted; ``watch`` fires on a change."""
        try:
            return sorted(self._client.get_children(TOPICS, watch=watch))
        except NoNodeError:
            return []
        except Exception as exc:
            raise StoreError(f"listing {TOPICS}: {exc}") from exc

    def read_topics(
        self, names: Iterable[str], watch: Watch | None = None
    ) -> dict[str, tuple[TopicAssignment, int, int] | None]:
        """Each topic's ``(assignment, znode version, czxid)``, None if it is gone."""
        names = list(names)
        found = self.get_many([topic_path(n) for n in names], watch)
        out: dict[str, tuple[TopicAssignment, int, int] | None] = {}
        for name in names:
            read = found[topic_path(name)]
            out[name] = (
                None
                if read is None
                else (decode_topic(name, read[0]), int(read[1].version), int(read[1].czxid))
            )
        return out

    def read_topic_configs(
        self, names: Iterable[str], watch: Watch | None = None
    ) -> dict[str, dict[str, str]]:
        """Each topic's config (``{}`` without a config znode)."""
        names = list(names)
        found = self.get_many([topic_config_path(n) for n in names], watch)
        out: dict[str, dict[str, str]] = {}
        for name in names:
            read = found[topic_config_path(name)]
            out[name] = {} if read is None else decode_topic_config(name, read[0])
        return out

    def read_partition_states(
        self, keys: Iterable[tuple[str, int]], watch: Watch | None = None
    ) -> dict[tuple[str, int], tuple[PartitionState, int, int] | None]:
        """Each partition's ``(state, znode version, last write's zxid)`` (the fields of
        ``store.StateRead``), None for a partition without a state znode."""
        keys = list(keys)
        found = self.get_many([partition_state_path(t, p) for t, p in keys], watch)
        out: dict[tuple[str, int], tuple[PartitionState, int, int] | None] = {}
        for topic, partition in keys:
            path = partition_state_path(topic, partition)
            read = found[path]
            out[(topic, partition)] = (
                None
                if read is None
                else (
                    decode_partition_state(read[0], path, int(read[1].version)),
                    int(read[1].version),
                    int(read[1].mzxid),
                )
            )
        return out

    def read_cluster(self, names: Sequence[str] | None = None) -> ClusterRead:
        """Topics ``names`` (None: every topic) whole: the controller's reconciliation
        and elections read the cluster this way, three rounds instead of a round trip
        per znode."""
        if names is None:
            names = self.topic_names()
        found = self.read_topics(names)
        assignments = {n: got[0] for n, got in found.items() if got is not None}
        configs = self.read_topic_configs(assignments)
        keys = [(n, p) for n, a in assignments.items() for p in a.replicas]
        states = {k: got for k, got in self.read_partition_states(keys).items() if got is not None}
        return ClusterRead(assignments, configs, states)

    # --- fenced writes of many topics -----------------------------------------------------

    def create_topics(
        self, lease: Any, topics: Sequence[NewTopicWrite]
    ) -> dict[str, Exception | None]:
        """Create each topic (assignment, config, states) in its own fenced transaction,
        all committed together. Per topic None or ``StaleStateError`` (it exists) or
        ``StoreError``. Raises ``ControllerMovedError`` if the lease is no longer current
        (then nothing was written)."""
        transactions = []
        for assignment, config, states in topics:
            transaction = self._fenced(lease)
            stage_topic_creation(transaction, assignment, config, states)
            name = assignment.name
            transactions.append((f"creating topic {name}", name, transaction))
        return self._commit_all(transactions, exists_is_stale=True)

    def add_partitions_many(
        self,
        lease: Any,
        growths: Sequence[tuple[TopicAssignment, int, Mapping[int, PartitionState]]],
    ) -> dict[str, Exception | None]:
        """Grow each topic (its new assignment at the version read, its new partitions'
        states) in its own fenced transaction, all committed together; per topic None,
        ``StaleStateError`` (it changed meanwhile) or ``StoreError``. Raises
        ``ControllerMovedError``."""
        transactions = []
        for assignment, version, states in growths:
            name = assignment.name
            transaction = self._fenced(lease)
            transaction.set_data(topic_path(name), encode_topic(assignment), version=version)
            for partition, state in states.items():
                transaction.create(f"{partitions_path(name)}/{partition}", b"")
                transaction.create(
                    partition_state_path(name, partition), encode_partition_state(state)
                )
            transactions.append((f"growing topic {name}", name, transaction))
        return self._commit_all(transactions, exists_is_stale=True)

    def delete_topics(
        self, lease: Any, assignments: Sequence[TopicAssignment]
    ) -> dict[str, Exception | None]:
        """Remove each topic's znodes (states, partitions, assignment, config) in its own
        fenced transaction, all committed together; per topic None, ``StaleStateError``
        (it changed or went meanwhile) or ``StoreError``. Raises ``ControllerMovedError``."""
        transactions = []
        for assignment in assignments:
            name = assignment.name
            transaction = self._fenced(lease)
            for partition in assignment.replicas:
                transaction.delete(partition_state_path(name, partition))
                transaction.delete(f"{partitions_path(name)}/{partition}")
            transaction.delete(partitions_path(name))
            transaction.delete(topic_path(name))
            transaction.delete(topic_config_path(name))
            transactions.append((f"deleting topic {name}", name, transaction))
        return self._commit_all(transactions, exists_is_stale=False)

    # --- partition states of many partitions (elections, ISR changes) ---------------------

    def set_partition_states(
        self, lease: Any, writes: Sequence[StateWrite]
    ) -> dict[tuple[str, int], Exception | None]:
        """The controller's elections for many partitions (a broker failure, a controlled
        shutdown, a preferred election): each partition's state written at the version
        read in its own fenced transaction, all sent before any answer is awaited.

        Per partition None, ``StaleStateError`` (its znode moved on or went: only it is
        decided again) or ``StoreError``. Raises ``ControllerMovedError`` if the lease is
        no longer current (then nothing was written). Kafka's ``updateLeaderAndIsr``
        does the same (a pipelined multi of the epoch check and the ``setData`` per
        partition): one multi for all would let one stale partition fail every other,
        and would pass ``jute.maxbuffer`` (1 MB) at a few thousand partitions.
        """
        transactions = []
        for topic, partition, state, version in writes:
            transaction = self._fenced(lease)
            transaction.set_data(
                partition_state_path(topic, partition), encode_partition_state(state), version
            )
            transactions.append((f"electing {topic}-{partition}", (topic, partition), transaction))
        return self._commit_all(transactions, exists_is_stale=False)

    def update_isr_many(
        self, writes: Sequence[StateWrite]
    ) -> dict[tuple[str, int], Exception | int]:
        """Leaders' ISR changes for many partitions: each a compare-and-set of its state
        znode at the version read, all sent before any answer is awaited. Per partition
        the version written (its new partition epoch), ``StaleStateError`` (moved on or
        gone: its writer re-reads) or ``StoreError``. Not fenced: a leader is not the
        controller; the version read, which named it leader at its epoch, is its fence."""
        out: dict[tuple[str, int], Exception | int] = {}
        for start in range(0, len(writes), _CHUNK):
            pending = []
            for topic, partition, state, version in writes[start : start + _CHUNK]:
                path = partition_state_path(topic, partition)
                try:
                    answer = self._client.set_async(path, encode_partition_state(state), version)
                except Exception as exc:
                    out[(topic, partition)] = StoreError(f"writing {path}: {exc}")
                    continue
                pending.append((topic, partition, path, answer))
            for topic, partition, path, answer in pending:
                try:
                    stat = answer.get(timeout=_TIMEOUT_S)
                except (BadVersionError, NoNodeError) as exc:
                    out[(topic, partition)] = StaleStateError(f"{path} moved on: {exc!r}")
                except Exception as exc:
                    out[(topic, partition)] = StoreError(f"writing {path}: {exc!r}")
                else:
                    out[(topic, partition)] = int(stat.version)
        return out

    def _commit_all(
        self, transactions: Sequence[tuple[str, _K, Any]], *, exists_is_stale: bool
    ) -> dict[_K, Exception | None]:
        out: dict[_K, Exception | None] = {}
        moved: ControllerMovedError | None = None
        pending = []
        for what, name, transaction in transactions:
            try:
                pending.append((what, name, transaction.commit_async()))
            except Exception as exc:
                out[name] = StoreError(f"{what}: {exc}")
        for what, name, answer in pending:
            try:
                results = list(answer.get(timeout=_TIMEOUT_S))
                raise_for_fenced(results, what, exists_is_stale=exists_is_stale)
            except ControllerMovedError as exc:
                moved = exc
            except (StaleStateError, StoreError) as exc:
                out[name] = exc
            except Exception as exc:
                out[name] = StoreError(f"{what}: {exc}")
            else:
                out[name] = None
        if moved is not None:
            raise moved
        return out


class Roots(NamedTuple):
    """``BatchOps.read_roots``: live registrations and their epochs (czxid), the topics
    listed, the controller's id (None: none now)."""

    registrations: dict[int, BrokerRegistration]
    epochs: dict[int, int]
    topics: list[str]
    controller_id: int | None


class ClusterRead(NamedTuple):
    """Every topic's assignment, config and partition states, read in three pipelined
    rounds (``BatchOps.read_cluster``); a topic that went while read is left out."""

    assignments: dict[str, TopicAssignment]
    configs: dict[str, dict[str, str]]
    states: dict[tuple[str, int], tuple[PartitionState, int, int]]


def stage_topic_creation(
    transaction: Any,
    assignment: TopicAssignment,
    config: Mapping[str, str],
    states: Mapping[int, PartitionState],
) -> None:
    """Add a topic's creation to a (fenced) ZooKeeper transaction: its assignment, its
    partitions' znodes and states, its config."""
    name = assignment.name
    transaction.create(topic_path(name), encode_topic(assignment))
    transaction.create(partitions_path(name), b"")
    for partition in assignment.replicas:
        transaction.create(f"{partitions_path(name)}/{partition}", b"")
        transaction.create(
            partition_state_path(name, partition), encode_partition_state(states[partition])
        )
    transaction.create(topic_config_path(name), encode_topic_config(config))
