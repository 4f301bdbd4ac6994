"""Where a share partition's state is read and written (issue #32 step 2b): at its share
coordinator, the leader of the key's ``__share_group_state`` partition, as Kafka's share
partition leader does through its persister.

Decided (docs/share-groups.md "Cluster"):

* **Always through the coordinator of the key.** ``RoutedShareState`` is the
  ``ShareStateStore`` the share-partition manager writes through: when this broker leads
  the key's state partition it serves the call itself (``serve``: the coordinator's
  checks, then the local ``ShareStateLog``); otherwise it sends it to that partition's
  leader in this broker's view (``GrpcSharePeers``; the other broker runs the same
  ``serve``). The two sides of the check are one function, so a call is served the same
  way whoever sends it. Co-locating the two leaderships instead would tie every topic
  partition's leadership to an internal topic's, which elections and reassignments do
  not know about; Kafka does not either.
* **The coordinator's checks** (``ShareOps.serve_state``): this broker leads the state
  partition (else ``NOT_COORDINATOR``), its load at the current leader epoch is
  replicated (else ``COORDINATOR_LOAD_IN_PROGRESS``), then the store's leader-epoch fence
  (``FENCED_LEADER_EPOCH``). All are retriable for the client; the share partition's
  operation fails whole, nothing is handed out or acknowledged.
* **No coordinator known** (the state partition has no leader, or no peers: the broker
  is still joining): ``COORDINATOR_NOT_AVAILABLE``.
* **A single node** has no peers and leads every state partition: every call is local.
* **The admin's calls** (``broker.core.share_admin``): ``summaries`` (one state
  partition's share partitions of a group: ReadShareGroupStateSummary), ``delete``
  (DeleteShareGroupState) and ``initialize`` with a newer ``state_epoch`` (an admin's
  reset) go to the coordinator the same way; the local side of ``summaries`` is the
  ``summarize`` callable (``ShareOps.serve_summaries``: the same checks).
  ``state_epoch`` on a write is the leader's loaded one (``FENCED_STATE_EPOCH`` after a
  reset or delete: ``broker.share.state_log``).
* **Transactional writes** (a dead-letter transaction's archiving,
  ``broker.share.dead_letter``) go the same way: the inter-broker WriteShareGroupState
  carries the producer id and epoch, and the coordinator holds the write pending until
  the transaction's marker reaches its state partition (the partition joined the
  transaction before, at the id's transaction coordinator).

Thread-safe: holds nothing but its collaborators.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tidelog.broker.cluster.share_peers import ShareStateSummary, summary_of
from tidelog.broker.share.records import ShareSnapshot, ShareStateKey, StateBatch
from tidelog.broker.share.state_log import SHARE_STATE_TOPIC, PendingWrite, ShareStateLog
from tidelog.storage.errors import CoordinatorNotAvailableError

__all__ = ["RoutedShareState", "SharePeers", "StateCall"]

# One of the coordinator's calls on its local store (read, initialize or write).
StateCall = Callable[[ShareStateLog], ShareSnapshot | None]


class SharePeers(Protocol):
    """The calls to another broker's share coordinator (``broker.cluster.share_peers``)."""

    def read_state(
        self, coordinator: int, key: ShareStateKey, leader_epoch: int
    ) -> ShareSnapshot | None: ...

    def initialize(
        self,
        coordinator: int,
        key: ShareStateKey,
        start_offset: int,
        leader_epoch: int,
        state_epoch: int | None = None,
    ) -> ShareSnapshot: ...

    def write(
        self,
        coordinator: int,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
        *,
        transaction: tuple[int, int] | None = None,
    ) -> ShareSnapshot | None:
        """``transaction`` (producer id, epoch): a transactional write, answered None."""
        ...

    def read_summaries(
        self, coordinator: int, group_id: str, state_partition: int
    ) -> list[ShareStateSummary]: ...

    def delete_state(self, coordinator: int, key: ShareStateKey) -> None: ...


class RoutedShareState:
    """A ``ShareStateStore`` that calls the coordinator of each key (module docstring)."""

    def __init__(
        self,
        store: ShareStateLog,
        broker_id: int,
        leader_of: Callable[[str, int], int],
        serve: Callable[[ShareStateKey, StateCall], ShareSnapshot | None],
        peers: SharePeers | None,
        *,
        summarize: Callable[[str, int], list[ShareStateSummary]] | None = None,
    ) -> None:
        """``leader_of``: a partition's leader in this broker's view (-1: none);
        ``serve``: the coordinator's side, run here when this broker leads the key's state
        partition; ``peers``: None on a single node (every call is served here);
        ``summarize``: the coordinator's side of ``summaries`` (None: unchecked, from the
        store)."""
        self._store = store
        self._broker_id = broker_id
        self._leader_of = leader_of
        self._serve = serve
        self._peers = peers
        self._summarize = summarize

    def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareSnapshot | None:
        coordinator = self._coordinator(key)
        if coordinator is None:
            return self._serve(key, lambda s: s.read_state(key, leader_epoch))
        assert self._peers is not None
        return self._peers.read_state(coordinator, key, leader_epoch)

    def initialize(
        self,
        key: ShareStateKey,
        start_offset: int,
        leader_epoch: int,
        state_epoch: int | None = None,
    ) -> ShareSnapshot:
        coordinator = self._coordinator(key)
        if coordinator is None:
            return _found(
                self._serve(
                    key, lambda s: s.initialize(key, start_offset, leader_epoch, state_epoch)
                )
            )
        assert self._peers is not None
        return self._peers.initialize(coordinator, key, start_offset, leader_epoch, state_epoch)

    def write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> ShareSnapshot:
        coordinator = self._coordinator(key)
        if coordinator is None:
            return _found(
                self._serve(
                    key,
                    lambda s: s.write(
                        key, leader_epoch, start_offset, batches, state_epoch=state_epoch
                    ),
                )
            )
        assert self._peers is not None
        return _found(
            self._peers.write(coordinator, key, leader_epoch, start_offset, batches, state_epoch)
        )

    def begin_write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> PendingWrite:
        """``write`` in two halves (``ShareStateLog.begin_write``) when this broker is the
        key's coordinator: appended now, durable in ``wait``, so the writers of one state
        partition share an fsync and a replication wait. At another broker's coordinator
        the call is made whole now (``wait`` has nothing left to do): one
        WriteShareGroupState per change, each served as a group commit there."""
        coordinator = self._coordinator(key)
        if coordinator is None:
            begun: list[PendingWrite] = []

            def begin(store: ShareStateLog) -> ShareSnapshot:
                begun.append(
                    store.begin_write(key, leader_epoch, start_offset, batches, state_epoch)
                )
                return begun[0].state

            self._serve(key, begin)
            return begun[0]
        assert self._peers is not None
        state = _found(
            self._peers.write(coordinator, key, leader_epoch, start_offset, batches, state_epoch)
        )
        return PendingWrite(state, _done)

    def write_transactional(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int],
        state_epoch: int | None = None,
    ) -> None:
        """``start_offset`` and ``batches`` written as a record of ``transaction``
        (producer id, epoch), pending at the coordinator until its marker
        (``ShareStateLog.write``), wherever the coordinator is."""
        coordinator = self._coordinator(key)
        if coordinator is None:
            self._serve(
                key,
                lambda s: s.write(
                    key, leader_epoch, start_offset, batches, transaction, state_epoch
                ),
            )
            return
        assert self._peers is not None
        self._peers.write(
            coordinator,
            key,
            leader_epoch,
            start_offset,
            batches,
            state_epoch,
            transaction=transaction,
        )

    def summaries(self, group_id: str, state_partition: int) -> list[ShareStateSummary]:
        """ReadShareGroupStateSummary: ``group_id``'s share partitions whose state
        ``state_partition`` holds, at its share coordinator."""
        coordinator = self._coordinator_of(state_partition, f"group {group_id}")
        if coordinator is None:
            if self._summarize is None:
                return [
                    summary_of(k, s) for k, s in self._store.group_states(group_id, state_partition)
                ]
            return self._summarize(group_id, state_partition)
        assert self._peers is not None
        return self._peers.read_summaries(coordinator, group_id, state_partition)

    def delete(self, key: ShareStateKey) -> None:
        """DeleteShareGroupState: ``key``'s state forgotten at its share coordinator."""
        coordinator = self._coordinator(key)
        if coordinator is None:

            def delete(store: ShareStateLog) -> None:
                store.delete(key)

            self._serve(key, delete)
            return
        assert self._peers is not None
        self._peers.delete_state(coordinator, key)

    def state_partition(self, key: ShareStateKey) -> int:
        """The ``__share_group_state`` partition of ``key``."""
        return self._store.partition_for(key)

    def _coordinator(self, key: ShareStateKey) -> int | None:
        """The broker to call, None: this one."""
        return self._coordinator_of(
            self._store.partition_for(key),
            f"share partition {key.group_id}:{key.topic_id}:{key.partition}",
        )

    def _coordinator_of(self, state_partition: int, what: str) -> int | None:
        if self._peers is None:
            return None
        leader = self._leader_of(SHARE_STATE_TOPIC, state_partition)
        if leader == self._broker_id:
            return None
        if leader < 0:
            raise CoordinatorNotAvailableError(
                f"{what}: its {SHARE_STATE_TOPIC} partition has no leader"
            )
        return leader


def _done() -> None:
    """A ``PendingWrite``'s wait for a write already durable."""


def _found(state: ShareSnapshot | None) -> ShareSnapshot:
    if state is None:  # initialize and write always return the state they wrote
        raise AssertionError("the share state store returned no state for a write")
    return state
