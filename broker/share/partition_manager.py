"""Every share partition this broker leads (Kafka's ``SharePartitionManager``, minus the
fetch sessions a later step adds): each one's state in memory, loaded from
``__share_group_state`` on first use, and every change written there before it is acted on.

For one share partition (group, topic, partition) an operation runs under that share
partition's lock: plan it (``SharePartition``), append what it changes
(``ShareStateLog.begin_write``), apply it; then, the lock released, it waits until the
change is durable and answers ("Group commit" below). A write that fails leaves the state as it was
and raises to the caller, who answers with the error: nothing was handed out or
acknowledged.

**First use.** A share partition with no stored state starts where the group's
``share.auto.offset.reset`` says: ``latest`` at the high watermark (the last stable
offset for read_committed), ``earliest`` at the log start. That start is written as a
snapshot at once, so a restart before anything is delivered keeps it (records produced
meanwhile are not skipped).

**Leadership.** State is memory only on the leader of the topic partition: ``unload``
forgets a share partition (this broker stopped leading it, or the state partition moved),
and the next use loads it from the store again: whatever was acquired comes back
Available, delivery counts kept, nothing acknowledged comes back. Every use compares the
leader epoch the share partition was loaded at with the topic partition's now
(``leader_epoch``, as Kafka's ``SharePartitionManager``): a broker that lost and regained
the leadership between two passes of the unloading timer reloads rather than serve its
stale memory (the leader between may have delivered and acknowledged records). The next
epoch, led by this broker too, is no change of leader (an ISR shrink: ``_continues``), so
the memory is kept and records under lock stay locked.

**The store** (``ShareStateStore``) is the share coordinator of each key: the local
``ShareStateLog`` on a single node; in a cluster the leader of the key's
``__share_group_state`` partition, wherever it is (``broker.core.share_state_routing``).
Every call names the leader epoch, so a deposed leader's writes are fenced there.

**Dead-letter topic** (``broker.share.dead_letter``): ``dead_letter_pass`` (the share
timer's) copies each loaded share partition's records to be dead-lettered to its group's
dead-letter topic and archives them, in one transaction through the ``DeadLetterSink``
given, under the share partition's lock (its acquisitions and acknowledgements wait for
the transaction: one local transaction is a few fsyncs). A load that finds a
dead-letter transaction still pending at the share coordinator fences its id (so an
open one aborts now) and fails retriably.

**State epochs** (an admin's reset or delete in a cluster, ``broker.core.share_admin``):
each share partition remembers the state epoch it loaded at and names it on every write;
the share coordinator refuses a write from memory that predates a reset or a delete
(``FencedStateEpochError``), and the share partition is dropped, so its next use reloads
(Kafka's behaviour). An acquisition so refused is retried once on the reloaded state (a
fetch right after a reset gets records, not an error); an acknowledgement is not (the
records it named were dropped by the reset: the member sees the error, the records come
again from the new start). A first use initializes at state epoch 0, which the
coordinator refuses if a state exists meanwhile (an admin's alter won): it reads that
instead.

**Group commit** (issue #32's throughput). An acquisition or an acknowledgement holds
the share partition's lock only to plan, append its change at the share coordinator
(``ShareStateStore.begin_write``: the checks and the append, in the order of the lock)
and apply it to memory; it waits for the fsync (and the replication) after releasing
the lock, and answers only then. The members of one share partition, and the share
partitions of one state partition, so share an fsync and a replication wait
(``PartitionLog.flush`` is a group commit: a writer that arrives while an fsync runs
joins the next one), as Kafka's persister batches the writes going to one coordinator.
Memory may therefore be ahead of what is durable, never of what is appended, and
nothing is answered from it before it is durable: an operation planned on another's
change that is not durable yet appends after it, so its own durability covers that
change. A wait that fails drops the share partition from memory (the next use reloads
what the coordinator holds, which may include the change: "a write that timed out may
have landed"); the caller answers the error. The dead-letter transaction, releases,
lock expiry and resets wait under the lock, as before. At another broker's share
coordinator a change is one WriteShareGroupState call made under the lock
(``RoutedShareState.begin_write``): the coordinator's group commit shares its fsync
among share partitions, not among one share partition's members (one call carrying
many share partitions' changes is to do).

Topic ids: ``__share_group_state`` keys name a topic by id, as Kafka's do; the caller
passes the function that gives a topic's id (the listener's ``kip848.topic_id``).

Thread-safe: one lock for the table, one per share partition.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tidelog.broker.share.dead_letter import (
    LOUD_AFTER_FAILURES,
    MAX_RECORDS_PER_TRANSACTION,
    Backoff,
    DeadLetter,
    DeadLetterBatch,
    DeadLetterSink,
    read_originals,
    reason_of,
    transactional_id,
)
from tidelog.broker.share.partition import (
    Acknowledgement,
    AcquiredRange,
    SharePartition,
    SharePartitionConfig,
    SharePartitionStats,
    Transition,
)
from tidelog.broker.share.partition_source import LogRecordSource
from tidelog.broker.share.records import ShareSnapshot, ShareStateKey, StateBatch
from tidelog.broker.share.state_log import PendingWrite
from tidelog.storage.errors import CoordinatorLoadInProgressError, FencedStateEpochError
from tidelog.storage.log_manager import LogManager

__all__ = ["SharePartitionManager", "ShareStateStore"]

log = logging.getLogger(__name__)


class ShareStateStore(Protocol):
    """The share coordinator's calls (Kafka's Read/Initialize/WriteShareGroupState), as
    ``ShareStateLog`` serves them. Each raises ``FencedLeaderEpochError`` for an epoch
    older than the state's, and what the store or the call to it raises."""

    def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareSnapshot | None: ...

    def initialize(
        self,
        key: ShareStateKey,
        start_offset: int,
        leader_epoch: int,
        state_epoch: int | None = None,
    ) -> ShareSnapshot: ...

    def write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> ShareSnapshot: ...

    def begin_write(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        state_epoch: int | None = None,
    ) -> PendingWrite:
        """``write`` whose checks and append happen now, in the order of the calls, and
        whose durability ``wait`` awaits (``ShareStateLog.begin_write``)."""
        ...

    def write_transactional(
        self,
        key: ShareStateKey,
        leader_epoch: int,
        start_offset: int,
        batches: tuple[StateBatch, ...],
        transaction: tuple[int, int],
        state_epoch: int | None = None,
    ) -> None:
        """``start_offset`` (-1: unchanged) and ``batches`` as a record of
        ``transaction`` (producer id, epoch), pending until its marker
        (``ShareStateLog.write``)."""
        ...

    def state_partition(self, key: ShareStateKey) -> int:
        """The ``__share_group_state`` partition of ``key``."""
        ...


@dataclass(slots=True, eq=False)
class _Held:
    """One loaded share partition and its lock."""

    partition: SharePartition
    source: LogRecordSource
    state_key: ShareStateKey
    leader_epoch: int
    state_epoch: int  # the state's when loaded (module docstring: state epochs)
    key: tuple[str, str, int]  # (group, topic, partition)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _already_durable() -> None:
    """The wait of a transition with nothing to write (or written whole already)."""


def _continues(held: _Held, epoch: int) -> bool:
    """Whether ``held``, loaded at its leader epoch, may serve at ``epoch``, the topic
    partition's leader epoch now with this broker its leader: the same epoch, or the next
    one, which this broker leads too, so no other broker led in between (the controller
    bumps the epoch by one when it takes a replica out of the ISR and leaves the leader as
    it was, as ZooKeeper-era Kafka's does). Its memory stays authoritative then, and its
    next write names the new epoch; reloading would hand out at once the records it has
    under lock. Any other epoch: reload."""
    if epoch == held.leader_epoch:
        return True
    if epoch == held.leader_epoch + 1:
        held.leader_epoch = epoch
        return True
    return False


class SharePartitionManager:
    """The share partitions this broker leads. Thread-safe."""

    def __init__(
        self,
        logs: LogManager,
        store: ShareStateStore,
        *,
        topic_id: Callable[[str], uuid.UUID],
        group_config: Callable[[str], SharePartitionConfig],
        leader_epoch: Callable[[str, int], int | None] | None = None,
        dead_letters: DeadLetterSink | None = None,
    ) -> None:
        """``group_config``: a share group's settings (its ``share.*`` group configs over
        the broker's defaults). ``leader_epoch``: the epoch this broker leads a topic
        partition at now (None: not known, the log's latest epoch is used: a single
        node). ``dead_letters``: runs dead-letter transactions (None: records to be
        dead-lettered wait)."""
        self._logs = logs
        self._dead_letters = dead_letters
        self._store = store
        self._topic_id = topic_id
        self._group_config = group_config
        self._leader_epoch = leader_epoch or (lambda topic, partition: None)
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str, int], _Held] = {}
        # Dead-letter retries per share partition (kept across reloads, so the failures
        # in a row are counted right); only the timer thread's dead_letter_pass uses it.
        self._backoffs: dict[tuple[str, str, int], Backoff] = {}

    # --- operations -----------------------------------------------------------------

    def acquire(
        self, group_id: str, topic: str, partition: int, member_id: str, max_records: int
    ) -> tuple[AcquiredRange, ...]:
        """Hand up to ``max_records`` records of ``topic``-``partition`` to ``member_id``
        of ``group_id``; durable before returned. Raises what the log and the store raise
        (``UnknownTopicOrPartitionError``, ``NotLeaderOrFollowerError``, ``StorageError``...)."""
        for attempt in (1, 2):
            held = self._get(group_id, topic, partition)
            now_ms = self._logs.clock.monotonic_ms()
            try:
                with held.lock:
                    transition = held.partition.acquire(member_id, max_records, now_ms, held.source)
                    durable = self._begin(held, transition)
            except FencedStateEpochError:
                if attempt == 2:
                    raise
                continue  # dropped by _begin: reloaded at the new state epoch
            self._await(held, durable)
            return transition.acquired
        raise AssertionError("unreachable")

    def acknowledge(
        self,
        group_id: str,
        topic: str,
        partition: int,
        member_id: str,
        acknowledgements: Sequence[Acknowledgement],
    ) -> None:
        """Apply ``member_id``'s acknowledgements, all or none, durably before returning.
        Raises ``InvalidRecordStateError``, ``InvalidRequestError`` (see
        ``SharePartition.acknowledge``) and what the store raises."""
        self.begin_acknowledge(group_id, topic, partition, member_id, acknowledgements)[0]()

    def begin_acknowledge(
        self,
        group_id: str,
        topic: str,
        partition: int,
        member_id: str,
        acknowledgements: Sequence[Acknowledgement],
    ) -> tuple[Callable[[], None], bool]:
        """``acknowledge`` without its wait for durability, which the returned callable
        does (raising what the store's wait raises; the acknowledgement must not be
        answered before it returns). ShareFetch appends its acquisitions before waiting
        for its piggy-backed acknowledgements, so both share one fsync. Raises as
        ``acknowledge``."""
        held = self._get(group_id, topic, partition)
        now_ms = self._logs.clock.monotonic_ms()
        with held.lock:
            transition = held.partition.acknowledge(member_id, acknowledgements, now_ms)
            durable = self._begin(held, transition)
        return (lambda: self._await(held, durable)), transition.start_moved

    def release_member(self, group_id: str, member_id: str) -> list[tuple[str, int]]:
        """Give back every record ``member_id`` of ``group_id`` holds on this broker (it
        left, or its session expired). Returns the topic partitions where records became
        available again (for waiting fetches to look again)."""
        now_ms = self._logs.clock.monotonic_ms()
        changed: list[tuple[str, int]] = []
        for key, held in self._loaded_items(group_id):
            with held.lock:
                transition = held.partition.release_member(member_id, now_ms)
                self._commit(held, transition)
            if transition.changed:
                changed.append(key[1:])
        return changed

    def expire_locks(self) -> list[tuple[str, str, int]]:
        """Expire every acquisition lock past its deadline, and let every share partition
        follow its log's start offset (retention, DeleteRecords). Run by a timer. Returns
        the share partitions (group, topic, partition) whose records changed. A share
        partition whose write fails is logged and left for the next pass."""
        now_ms = self._logs.clock.monotonic_ms()
        changed: list[tuple[str, str, int]] = []
        for key, held in self._loaded_items(None):
            try:
                if not _continues(held, self._current_epoch(key[1], key[2])):
                    self._drop(key, held)  # led again at a new epoch: reloaded on next use
                    continue
                with held.lock:
                    start = held.source.log_start_offset()
                    transition = held.partition.expire(now_ms, start)
                    self._commit(held, transition)
            except Exception:  # StorageError, NotLeaderOrFollowerError: retried next pass
                log.warning("share partition %s: expiring locks failed", key, exc_info=True)
                continue
            if transition.changed:
                changed.append(key)
        return changed

    def dead_letter_pass(self) -> int:
        """Copy every loaded share partition's records to be dead-lettered to its
        group's dead-letter topic and archive them, one transaction per share partition
        (module docstring of ``broker.share.dead_letter``); a share partition whose last
        attempt failed waits out its backoff. Returns the records dead-lettered. Never
        raises: a failure is logged and retried."""
        if self._dead_letters is None:
            return 0
        done = 0
        for key, held in self._loaded_items(None):
            with held.lock:
                config = held.partition.config
                if not config.dead_letter:
                    continue
                pending = held.partition.dead_letter_pending(MAX_RECORDS_PER_TRANSACTION)
                if not pending:
                    continue
                now_ms = self._logs.clock.monotonic_ms()
                backoff = self._backoffs.setdefault(key, Backoff())
                if not backoff.due(now_ms):
                    continue
                try:
                    done += self._dead_letter(key, held, [o for o, _ in pending], now_ms)
                    del self._backoffs[key]
                except Exception as exc:
                    failures = backoff.failed(now_ms)
                    log.log(
                        logging.ERROR if failures >= LOUD_AFTER_FAILURES else logging.WARNING,
                        "share group %s: %s-%d: dead-lettering offsets %d..%d to %s failed "
                        "(%d time(s) in a row): %s; they stay to be dead-lettered and are "
                        "retried in %d ms",
                        key[0],
                        key[1],
                        key[2],
                        pending[0][0],
                        pending[-1][0],
                        config.dead_letter_topic,
                        failures,
                        exc,
                        backoff.next_ms - now_ms,
                    )
        return done

    def _dead_letter(
        self, key: tuple[str, str, int], held: _Held, offsets: list[int], now_ms: int
    ) -> int:
        assert self._dead_letters is not None
        group_id, topic, partition = key
        share = held.partition
        records = share.records()
        originals = read_originals(self._logs.get_log(topic, partition), offsets)
        letters = tuple(
            DeadLetter(o, reason_of(records[o].state), records[o].delivery_count, originals.get(o))
            for o in offsets
        )
        transition = share.archive_dead_lettered(offsets, now_ms)
        batch = DeadLetterBatch(
            group_id,
            topic,
            partition,
            share.config.dead_letter_topic,
            letters,
            self._store.state_partition(held.state_key),
        )

        written = False

        def archive(transaction: tuple[int, int]) -> None:
            nonlocal written
            # The start offset too: archiving a prefix moves it, and the batches below
            # it are then not in ``durable`` (they are done).
            start = transition.start_offset if transition.start_moved else -1
            self._store.write_transactional(
                held.state_key,
                held.leader_epoch,
                start,
                transition.durable,
                transaction,
                held.state_epoch,
            )
            written = True

        try:
            self._dead_letters.write(batch, archive)
        except BaseException as exc:
            if written or isinstance(exc, FencedStateEpochError):
                # The outcome may still be a commit (an EndTxn that failed after its
                # Prepare landed), or an admin reset the state: forget the memory, the
                # next use reloads the truth (read_committed at the share coordinator).
                self._drop(key, held)
            raise
        share.apply(transition)  # the commit is decided: the coordinator finishes it
        log.info(
            "share group %s: %s-%d: dead-lettered %d record(s) (offsets %d..%d) to %s",
            group_id,
            topic,
            partition,
            len(offsets),
            offsets[0],
            offsets[-1],
            share.config.dead_letter_topic,
        )
        return len(offsets)

    def reconfigure(self, group_id: str, config: SharePartitionConfig) -> int:
        """Apply ``group_id``'s changed settings to its share partitions loaded here (its
        group configs changed: ``broker.core.share_group_configs``), as Kafka reads a
        group's configs anew on every use. From now on: the lock duration of each
        acquisition, the delivery limit and dead-letter topic of each delivery that ends,
        the isolation level of each read (records waiting to be dead-lettered when the
        dead-letter topic is removed are archived now). What already happened stays (a
        lock keeps its deadline; an Available record past a lowered limit is delivered
        once more and then archived); ``auto_offset_reset`` only places share partitions not yet
        started. Returns the share partitions changed."""
        changed = 0
        for key, held in self._loaded_items(group_id):
            with held.lock:
                old = held.partition.config
                if old == config:
                    continue
                held.partition.config = config
                if old.read_committed != config.read_committed:
                    held.source = LogRecordSource(
                        self._logs.get_log(key[1], key[2]), read_committed=config.read_committed
                    )
                if old.dead_letter and not config.dead_letter:
                    self._archive_undead(key, held)
            changed += 1
        if changed:
            log.info("share group %s: new settings for %d share partition(s)", group_id, changed)
        return changed

    def _archive_undead(self, key: tuple[str, str, int], held: _Held) -> None:
        """The group's dead-letter topic was removed: archive what waited to be copied
        there (as a reload would, ``SharePartition.from_snapshot``), durably. A failed
        write is logged; the next load archives them then."""
        share = held.partition
        offsets = [o for o, _ in share.dead_letter_pending(share.config.max_record_locks * 2)]
        if not offsets:
            return
        transition = share.archive_dead_lettered(offsets, self._logs.clock.monotonic_ms())
        try:
            self._commit(held, dataclasses.replace(transition, dead_lettered=0))
        except Exception:
            log.warning("share partition %s: archiving without a dead-letter topic failed", key)

    def loaded(self) -> list[tuple[str, str, int]]:
        """The share partitions (group, topic, partition) in memory here."""
        with self._lock:
            return list(self._held)

    def reset_start_offset(self, group_id: str, topic: str, partition: int, offset: int) -> None:
        """Alter share group offsets: the share partition starts over at ``offset``. The
        group must have no member (the caller's check, ``NON_EMPTY_GROUP``)."""
        held = self._get(group_id, topic, partition)
        with held.lock:
            self._commit(held, held.partition.reset_start_offset(offset))

    def describe(self, group_id: str, topic: str, partition: int) -> SharePartition:
        """A copy of the share partition's state (loading it if needed)."""
        held = self._get(group_id, topic, partition)
        with held.lock:
            current = held.partition
            copy = SharePartition(
                current.config, current.start_offset, current.end_offset, current.runs()
            )
            copy.dead_lettered = current.dead_lettered
        return copy

    def stats(
        self, group_id: str, topic: str, partition: int, state_epoch: int | None = None
    ) -> SharePartitionStats:
        """The share partition's statistics (loading it if needed). ``state_epoch``: the
        state's at its share coordinator, as an admin read it; memory loaded at another
        is reloaded first (it predates a reset or a delete that no write found yet)."""
        held = self._get(group_id, topic, partition, state_epoch)
        with held.lock:
            return held.partition.stats()

    def invalidate(self, group_id: str, topic: str, partition: int, state_epoch: int) -> None:
        """Drop the share partition from memory if it was loaded at another state epoch
        than ``state_epoch`` (an admin reset it; -1: deleted it): its next use reloads."""
        key = (group_id, topic, partition)
        with self._lock:
            held = self._held.get(key)
            if held is not None and held.state_epoch != state_epoch:
                del self._held[key]
                log.info(
                    "share group %s: %s-%d dropped (state epoch %d, loaded at %d)",
                    group_id,
                    topic,
                    partition,
                    state_epoch,
                    held.state_epoch,
                )

    def forget(self, group_id: str, topic: str, partition: int) -> None:
        """Drop one share partition from memory (its state was deleted: the group or its
        offsets for that topic). Its next use starts it afresh."""
        with self._lock:
            self._held.pop((group_id, topic, partition), None)

    def unload(self, topic: str, partition: int) -> None:
        """This broker stopped leading ``topic``-``partition``: forget its share
        partitions (the next leader loads them from the store)."""
        with self._lock:
            for key in [k for k in self._held if k[1:] == (topic, partition)]:
                del self._held[key]

    def unload_all(self) -> None:
        with self._lock:
            self._held.clear()

    # --- internals ------------------------------------------------------------------

    def _commit(self, held: _Held, transition: Transition) -> None:
        """Write ``transition`` durably and apply it (under ``held.lock``)."""
        self._await(held, self._begin(held, transition))

    def _begin(self, held: _Held, transition: Transition) -> Callable[[], None]:
        """Under ``held.lock``: append ``transition``'s durable part at the share
        coordinator and apply it to memory; returns what waits for its durability
        (``_await``, module docstring "Group commit"). Raises, with memory unchanged,
        what the store's checks and append raise."""
        durable: Callable[[], None] = _already_durable
        try:
            if transition.reset:
                state = self._store.initialize(
                    held.state_key,
                    transition.start_offset,
                    held.leader_epoch,
                    held.state_epoch + 1,
                )
                held.state_epoch = state.state_epoch
            elif transition.needs_write:
                start = transition.start_offset if transition.start_moved else -1
                durable = self._store.begin_write(
                    held.state_key,
                    held.leader_epoch,
                    start,
                    transition.durable,
                    state_epoch=held.state_epoch,
                ).wait
        except FencedStateEpochError:
            self._drop(held.key, held)  # memory older than the state: the next use reloads
            raise
        held.partition.apply(transition)
        return durable

    def _await(self, held: _Held, durable: Callable[[], None]) -> None:
        """Wait until a write ``_begin`` appended is durable. If that fails, memory is
        ahead of what is known durable: it is dropped (the next use reloads what the
        share coordinator holds) and the error raised to the caller, who answers it."""
        try:
            durable()
        except BaseException:
            self._drop(held.key, held)
            raise

    def _drop(self, key: tuple[str, str, int], held: _Held) -> None:
        with self._lock:
            if self._held.get(key) is held:
                del self._held[key]

    def _loaded_items(self, group_id: str | None) -> list[tuple[tuple[str, str, int], _Held]]:
        with self._lock:
            return [(k, h) for k, h in self._held.items() if group_id is None or k[0] == group_id]

    def _get(
        self, group_id: str, topic: str, partition: int, state_epoch: int | None = None
    ) -> _Held:
        key = (group_id, topic, partition)
        epoch = self._current_epoch(topic, partition)
        with self._lock:
            held = self._held.get(key)
            if held is not None and state_epoch is not None and held.state_epoch != state_epoch:
                log.info(
                    "share group %s: %s-%d reloaded (state epoch %d, loaded at %d)",
                    group_id,
                    topic,
                    partition,
                    state_epoch,
                    held.state_epoch,
                )
                del self._held[key]
                held = None
            if held is not None and _continues(held, epoch):
                return held
            if held is not None:
                log.info(
                    "share group %s: %s-%d reloaded (leader epoch %d, loaded at %d)",
                    group_id,
                    topic,
                    partition,
                    epoch,
                    held.leader_epoch,
                )
                del self._held[key]
            # Loading under the table lock keeps one load per share partition; loads are
            # rare (first use, leader change): one read of the store, and a first use's
            # or a new leader epoch's one write.
            held = self._load(group_id, topic, partition, epoch)
            self._held[key] = held
            return held

    def _current_epoch(self, topic: str, partition: int) -> int:
        epoch = self._leader_epoch(topic, partition)
        if epoch is None:
            epoch = max(self._logs.get_log(topic, partition).latest_epoch, 0)
        return epoch

    def _load(self, group_id: str, topic: str, partition: int, leader_epoch: int) -> _Held:
        config = self._group_config(group_id)
        partition_log = self._logs.get_log(topic, partition)
        source = LogRecordSource(partition_log, read_committed=config.read_committed)
        state_key = ShareStateKey(group_id, self._topic_id(topic), partition)
        try:
            snapshot = self._store.read_state(state_key, leader_epoch)
        except CoordinatorLoadInProgressError:
            if self._dead_letters is not None and config.dead_letter:
                # Maybe a dead-letter transaction of it is undecided (else the state
                # partition is loading): abort it now if open (a prepared one completes
                # on its own; without a dead-letter topic any more, its timeout does);
                # the client retries.
                self._dead_letters.fence(transactional_id(group_id, topic, partition))
            raise
        if snapshot is None:
            if config.auto_offset_reset == "earliest":
                start = source.log_start_offset()
            else:
                start = source.limit_offset()
            try:
                # State epoch 0: refused if an admin's alter wrote a state meanwhile.
                self._store.initialize(state_key, start, leader_epoch, 0)
            except FencedStateEpochError:
                snapshot = self._store.read_state(state_key, leader_epoch)
                if snapshot is None:
                    raise
            else:
                log.info(
                    "share group %s: %s-%d starts at %d (%s)",
                    group_id,
                    topic,
                    partition,
                    start,
                    config.auto_offset_reset,
                )
                share = SharePartition.new(config, start)
                key = (group_id, topic, partition)
                return _Held(share, source, state_key, leader_epoch, 0, key)
        share = SharePartition.from_snapshot(config, snapshot)
        log.info(
            "share group %s: loaded %s-%d at start offset %d",
            group_id,
            topic,
            partition,
            share.start_offset,
        )
        key = (group_id, topic, partition)
        return _Held(share, source, state_key, leader_epoch, snapshot.state_epoch, key)
