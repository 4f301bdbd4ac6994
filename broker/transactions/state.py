"""The transaction coordinator's state machine for one transactional id, pure.

Kafka's ``TransactionMetadata`` and the decisions of its ``TransactionCoordinator``
(``reference/transactions.md`` sections 3, 4, 5, 9 and 10), as functions from the current
state and a request to a ``Decision``: either a new state to write to
``__transaction_state`` (``Write``: the coordinator appends it, waits until it is
replicated, then makes it current and answers, never the other way round), an answer with
nothing written (``Answer``), or a refusal with Kafka's error name (``Refuse``). Nothing
here does I/O, reads a clock or allocates producer ids by itself: the coordinator passes
``now_ms`` and an ``allocate`` function, so every rule can be tested by itself.

States (Kafka's numbers, written in the record) and the transitions allowed into each::

    Empty (0)              <- Empty, CompleteCommit, CompleteAbort
    Ongoing (1)            <- Ongoing, Empty, CompleteCommit, CompleteAbort
    PrepareCommit (2)      <- Ongoing
    PrepareAbort (3)       <- Ongoing, PrepareEpochFence; (v2) Empty, CompleteCommit, CompleteAbort
    CompleteCommit (4)     <- PrepareCommit
    CompleteAbort (5)      <- PrepareAbort
    Dead (6)               <- Empty, CompleteCommit, CompleteAbort (an expired id: a tombstone)
    PrepareEpochFence (7)  <- Ongoing (never written: Kafka keeps it in memory only; here the
                              fence goes straight to a PrepareAbort with the bumped epoch)

``check_transition`` enforces that table on every ``Write`` (a bug, not a client error, if
it fails), together with Kafka's other invariants: the epoch stays or goes up by one (or
starts at 0 under a new producer id), the partitions only grow until a Prepare state, and
a Complete state has none.

Epochs. A producer id's epoch is exhausted at 32,766: ``init_producer_id`` then moves to
a new producer id at epoch 0 (the old one kept as ``previous_producer_id`` so that a retry
of that very call is recognised); 32,767 is kept so that the coordinator can always fence
once more. ``last_producer_epoch`` (memory only, -1 after a reload, as Kafka's) lets a
retried ``InitProducerId`` (KIP-360: the client names the epoch it had) get the same answer
instead of a second bump.

Transactions v2 (KIP-890 part 2, ``client_version`` 2): every EndTxn bumps the epoch (the
Prepare state is written with epoch + 1, the markers carry it, and the client continues
under it), so that a late Produce or EndTxn of a finished transaction can never join the
next one; if the epoch is exhausted the Prepare state keeps the old id at 32,767 and names
``next_producer_id``, which the Complete state then moves to at epoch 0. An abort is
accepted in Empty and Complete states too (the client may not know how its last EndTxn
ended). A retried EndTxn is recognised by its epoch being one below the stored one.

Errors, as Kafka's coordinator answers (the listener turns ``PRODUCER_FENCED`` into
``INVALID_PRODUCER_EPOCH`` for request versions that predate it):
``INVALID_TRANSACTION_TIMEOUT``, ``INVALID_PRODUCER_ID_MAPPING``, ``PRODUCER_FENCED``,
``CONCURRENT_TRANSACTIONS`` (retriable: another transition is pending or a Prepare state
has not completed), ``INVALID_TXN_STATE``, ``TRANSACTION_ABORTABLE`` (a partition that was
not added, in the verify-only form).

Pure and thread-safe (values only).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from tidelog.broker.transactions.log_records import TxnLogValue

__all__ = [
    "MAX_EPOCH",
    "NO_EPOCH",
    "NO_PRODUCER_ID",
    "Answer",
    "Decision",
    "Refuse",
    "TxnMetadata",
    "TxnState",
    "Write",
    "add_partitions",
    "check_transition",
    "complete",
    "end_transaction",
    "expire",
    "fence_timed_out",
    "from_log_value",
    "init_producer_id",
    "is_exhausted",
    "to_log_value",
    "verify_partitions",
]

NO_PRODUCER_ID = -1
NO_EPOCH = -1
MAX_EPOCH = 0x7FFF  # 32,767: kept for one last fence
_EXHAUSTED_AT = MAX_EPOCH - 1
TRANSACTIONS_V2 = 2

TopicPartition = tuple[str, int]


class TxnState(enum.IntEnum):
    """A transaction's state; the numbers are Kafka's, as written in the record."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions report (``"PrepareCommit"``)."""
        return "".join(word.capitalize() for word in self.name.split("_"))

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_idle(self) -> bool:
        """No transaction in progress: a new one may begin, the id may expire."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


_S = TxnState
_VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset(
        {_S.ONGOING, _S.PREPARE_EPOCH_FENCE, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}
    ),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """Everything the coordinator knows of one transactional id."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int  # when the current transaction began; -1 when none
    last_update_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    client_version: int = 0  # 2: transactions v2 (KIP-890)
    last_producer_epoch: int = NO_EPOCH  # memory only: recognises a retried InitProducerId


@dataclass(frozen=True, slots=True)
class Write:
    """Append ``metadata`` to ``__transaction_state``; once it is replicated make it
    current and answer with ``error`` (``""``: success) and ``producer_id``/``epoch``."""

    metadata: TxnMetadata
    error: str = ""
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class Answer:
    """Nothing to write: answer now (a no-op, or the retry of a call that succeeded)."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refused with Kafka's error name."""

    error: str
    message: str


Decision = Write | Answer | Refuse


def is_exhausted(epoch: int) -> bool:
    """Whether ``epoch`` is too high for another bump before a fence (>= 32,766)."""
    return epoch >= _EXHAUSTED_AT


def _bumped(epoch: int) -> int:
    return min(epoch + 1, MAX_EPOCH)


# --- InitProducerId ----------------------------------------------------------------


def init_producer_id(
    current: TxnMetadata | None,
    *,
    transactional_id: str,
    timeout_ms: int,
    max_timeout_ms: int,
    now_ms: int,
    allocate: Callable[[], int],
    expected_producer_id: int = NO_PRODUCER_ID,
    expected_epoch: int = NO_EPOCH,
) -> Decision:
    """A producer (re)starts with ``transactional_id``: fence every older instance.

    An unknown (or expired) id gets a new producer id at epoch 0. An idle one gets its
    epoch bumped (a new producer id once exhausted). An ongoing transaction is fenced:
    its abort is written with the epoch bumped (the old instance's next call is
    ``PRODUCER_FENCED``) and the caller is answered ``CONCURRENT_TRANSACTIONS``, to retry
    once the abort completes. ``expected_*`` (KIP-360, InitProducerId v3+): the identity
    the caller had; a mismatch is ``PRODUCER_FENCED``.
    """
    if not 0 < timeout_ms <= max_timeout_ms:
        return Refuse(
            "INVALID_TRANSACTION_TIMEOUT",
            f"transaction.timeout.ms {timeout_ms} is not in (0, {max_timeout_ms}] "
            "(transaction.max.timeout.ms)",
        )
    if current is None or current.state is TxnState.DEAD:
        producer_id = allocate()
        fresh = TxnMetadata(
            transactional_id, producer_id, 0, timeout_ms, TxnState.EMPTY, frozenset(), -1, now_ms
        )
        return Write(fresh, producer_id=producer_id, producer_epoch=0)
    if expected_producer_id != NO_PRODUCER_ID and not _known_identity(
        current, expected_producer_id, expected_epoch
    ):
        return Refuse(
            "PRODUCER_FENCED",
            f"producer id {expected_producer_id} epoch {expected_epoch} is not "
            f"{transactional_id}'s current one",
        )
    if current.state.is_prepare or current.state is TxnState.PREPARE_EPOCH_FENCE:
        return Refuse(
            "CONCURRENT_TRANSACTIONS", f"{transactional_id}'s last transaction is completing"
        )
    if current.state is TxnState.ONGOING:
        return _fence(current, now_ms, answer="CONCURRENT_TRANSACTIONS")
    if is_exhausted(current.producer_epoch):
        producer_id = allocate()
        rotated = replace(
            current,
            producer_id=producer_id,
            producer_epoch=0,
            previous_producer_id=current.producer_id,
            next_producer_id=NO_PRODUCER_ID,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=frozenset(),
            start_ms=-1,
            last_update_ms=now_ms,
            last_producer_epoch=NO_EPOCH,
        )
        return Write(rotated, producer_id=producer_id, producer_epoch=0)
    if expected_epoch == NO_EPOCH or expected_epoch == current.producer_epoch:
        epoch = _bumped(current.producer_epoch)
        last = NO_EPOCH if expected_epoch == NO_EPOCH else current.producer_epoch
    elif expected_epoch == current.last_producer_epoch:
        # The retry of a call whose answer was lost: the same answer, no second bump.
        return Answer(current.producer_id, current.producer_epoch)
    else:
        return Refuse(
            "PRODUCER_FENCED",
            f"epoch {expected_epoch} is not {transactional_id}'s current epoch "
            f"{current.producer_epoch}",
        )
    bumped = replace(
        current,
        producer_epoch=epoch,
        last_producer_epoch=last,
        timeout_ms=timeout_ms,
        state=TxnState.EMPTY,
        partitions=frozenset(),
        start_ms=-1,
        last_update_ms=now_ms,
    )
    return Write(bumped, producer_id=current.producer_id, producer_epoch=epoch)


def _known_identity(current: TxnMetadata, producer_id: int, epoch: int) -> bool:
    if current.producer_epoch == NO_EPOCH or producer_id == current.producer_id:
        return True
    # The retry of a call that rotated the producer id: the caller still has the old one.
    return producer_id == current.previous_producer_id and is_exhausted(epoch)


def _fence(current: TxnMetadata, now_ms: int, *, answer: str) -> Write:
    """Abort ``current``'s ongoing transaction under a bumped epoch (Kafka's
    PrepareEpochFence followed by PrepareAbort, written as the one PrepareAbort)."""
    fenced = replace(
        current,
        producer_epoch=_bumped(current.producer_epoch),
        last_producer_epoch=NO_EPOCH,
        state=TxnState.PREPARE_ABORT,
        last_update_ms=now_ms,
    )
    return Write(fenced, error=answer)


# --- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------


def _check_identity(current: TxnMetadata | None, producer_id: int, epoch: int) -> Refuse | None:
    if current is None or current.state is TxnState.DEAD or current.producer_id != producer_id:
        return Refuse(
            "INVALID_PRODUCER_ID_MAPPING",
            f"producer id {producer_id} is not this transactional id's",
        )
    if epoch != current.producer_epoch:
        return Refuse(
            "PRODUCER_FENCED",
            f"epoch {epoch} is not the current epoch {current.producer_epoch}",
        )
    return None


def add_partitions(
    current: TxnMetadata | None,
    producer_id: int,
    epoch: int,
    partitions: Iterable[TopicPartition],
    now_ms: int,
) -> Decision:
    """Partitions (a group's offsets partition too) join the transaction; the first ones
    begin it (Ongoing, ``start_ms`` = now). Already all in: answered with no write."""
    refused = _check_identity(current, producer_id, epoch)
    if refused is not None:
        return refused
    assert current is not None
    if current.state.is_prepare or current.state is TxnState.PREPARE_EPOCH_FENCE:
        return Refuse("CONCURRENT_TRANSACTIONS", "the last transaction is still completing")
    wanted = frozenset(partitions)
    if current.state is TxnState.ONGOING and wanted <= current.partitions:
        return Answer(current.producer_id, current.producer_epoch)
    begins = current.state is not TxnState.ONGOING
    grown = replace(
        current,
        state=TxnState.ONGOING,
        partitions=(frozenset() if begins else current.partitions) | wanted,
        start_ms=now_ms if begins else current.start_ms,
        last_update_ms=now_ms,
    )
    return Write(grown, producer_id=current.producer_id, producer_epoch=current.producer_epoch)


def verify_partitions(
    current: TxnMetadata | None,
    producer_id: int,
    epoch: int,
    partitions: Iterable[TopicPartition],
) -> dict[TopicPartition, str]:
    """The verify-only AddPartitionsToTxn (KIP-890 part 1, a partition leader asking before
    the first transactional write of a producer): per partition ``""`` if it is in the
    ongoing transaction, else ``TRANSACTION_ABORTABLE``; ``PRODUCER_FENCED`` /
    ``INVALID_PRODUCER_ID_MAPPING`` / ``CONCURRENT_TRANSACTIONS`` for every partition."""
    wanted = list(partitions)
    refused = _check_identity(current, producer_id, epoch)
    if refused is not None:
        return dict.fromkeys(wanted, refused.error)
    assert current is not None
    if current.state.is_prepare:
        return dict.fromkeys(wanted, "CONCURRENT_TRANSACTIONS")
    ongoing = current.state is TxnState.ONGOING
    return {
        tp: "" if ongoing and tp in current.partitions else "TRANSACTION_ABORTABLE" for tp in wanted
    }


# --- EndTxn and completion --------------------------------------------------------------


def end_transaction(
    current: TxnMetadata | None,
    producer_id: int,
    epoch: int,
    commit: bool,
    now_ms: int,
    *,
    client_version: int = 0,
    allocate: Callable[[], int] | None = None,
) -> Decision:
    """EndTxn: write PrepareCommit or PrepareAbort (the client is answered after it; the
    markers and the Complete state follow). A retry of an EndTxn that completed answers
    success; one still completing ``CONCURRENT_TRANSACTIONS``. ``client_version`` 2
    (EndTxn v5+): transactions v2, the epoch bumps (see the module docstring); ``allocate``
    gives the next producer id when the epoch is exhausted (required then)."""
    v2 = client_version >= TRANSACTIONS_V2
    wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    if current is None or current.state is TxnState.DEAD:
        return Refuse("INVALID_PRODUCER_ID_MAPPING", f"producer id {producer_id} is unknown")
    if v2 and _is_v2_retry(current, producer_id, epoch):
        if current.state is wanted_complete:
            return Answer(current.producer_id, current.producer_epoch)
        if current.state is wanted_prepare:
            return Refuse("CONCURRENT_TRANSACTIONS", "the transaction is still completing")
        return Refuse("INVALID_TXN_STATE", f"the last transaction ended {current.state.kafka_name}")
    refused = _check_identity(current, producer_id, epoch)
    if refused is not None:
        return refused
    state = current.state
    if state is TxnState.PREPARE_EPOCH_FENCE:
        return Refuse("CONCURRENT_TRANSACTIONS", "the transaction is being fenced")
    if state is TxnState.ONGOING or (v2 and not commit and state.is_idle):
        prepared = _prepared(current, wanted_prepare, now_ms, v2, client_version, allocate)
        return Write(
            prepared, producer_id=prepared.producer_id, producer_epoch=prepared.producer_epoch
        )
    if not v2 and state is wanted_complete:
        return Answer(current.producer_id, current.producer_epoch)  # a retry: done already
    if state is wanted_prepare:
        return Refuse("CONCURRENT_TRANSACTIONS", "the transaction is still completing")
    return Refuse(
        "INVALID_TXN_STATE",
        f"cannot {'commit' if commit else 'abort'} in state {state.kafka_name}",
    )


def _is_v2_retry(current: TxnMetadata, producer_id: int, epoch: int) -> bool:
    """Under v2 the Prepare state already carries epoch + 1 (or, on overflow, the old id
    at 32,767 with the next id named, and after completion the next id at epoch 0).
    ``last_producer_epoch`` tells a retry from a caller fenced by a timeout's abort (which
    bumped the epoch too, and clears it); it is memory only, so after a coordinator
    failover a retried EndTxn is answered ``PRODUCER_FENCED``, as Kafka's."""
    if producer_id == current.producer_id:
        return epoch == current.last_producer_epoch and epoch < current.producer_epoch
    return (
        producer_id == current.previous_producer_id
        and current.producer_epoch == 0
        and is_exhausted(epoch)
    )


def _prepared(
    current: TxnMetadata,
    state: TxnState,
    now_ms: int,
    v2: bool,
    client_version: int,
    allocate: Callable[[], int] | None,
) -> TxnMetadata:
    prepared = replace(
        current,
        state=state,
        last_update_ms=now_ms,
        client_version=client_version,
        start_ms=current.start_ms if current.start_ms >= 0 else now_ms,
    )
    if not v2:
        return prepared
    if is_exhausted(current.producer_epoch):
        # Overflow: finish under the old id at the reserved epoch, then move on.
        if allocate is None:
            raise ValueError("an exhausted epoch under transactions v2 needs a new producer id")
        return replace(
            prepared,
            producer_epoch=MAX_EPOCH,
            last_producer_epoch=current.producer_epoch,
            next_producer_id=allocate(),
        )
    return replace(
        prepared,
        producer_epoch=current.producer_epoch + 1,
        last_producer_epoch=current.producer_epoch,
    )


def complete(prepared: TxnMetadata, now_ms: int) -> Write:
    """Every marker of a prepared transaction is written: its Complete state (no
    partitions). Under v2 after an overflow, the ``next_producer_id`` the Prepare state
    named takes over at epoch 0.

    Raises ``ValueError`` if ``prepared`` is not in a Prepare state (a coordinator bug)."""
    if not prepared.state.is_prepare:
        raise ValueError(f"cannot complete a transaction in state {prepared.state.kafka_name}")
    state = (
        TxnState.COMPLETE_COMMIT
        if prepared.state is TxnState.PREPARE_COMMIT
        else TxnState.COMPLETE_ABORT
    )
    done = replace(prepared, state=state, partitions=frozenset(), last_update_ms=now_ms)
    if prepared.next_producer_id != NO_PRODUCER_ID:
        done = replace(
            done,
            previous_producer_id=prepared.producer_id,
            producer_id=prepared.next_producer_id,
            producer_epoch=0,
            next_producer_id=NO_PRODUCER_ID,
        )
    return Write(done, producer_id=done.producer_id, producer_epoch=done.producer_epoch)


# --- the coordinator's timers ------------------------------------------------------------


def fence_timed_out(current: TxnMetadata, now_ms: int) -> Write | None:
    """An Ongoing transaction past ``start_ms + timeout_ms`` is aborted under a bumped
    epoch (the producer's next call is fenced); None if it has not timed out."""
    if current.state is not TxnState.ONGOING or now_ms <= current.start_ms + current.timeout_ms:
        return None
    return _fence(current, now_ms, answer="")


def expire(current: TxnMetadata, now_ms: int, expiration_ms: int) -> Write | None:
    """An id idle for ``transactional.id.expiration.ms``: Dead (written as a tombstone)."""
    if not current.state.is_idle or now_ms - current.last_update_ms < expiration_ms:
        return None
    return Write(replace(current, state=TxnState.DEAD, last_update_ms=now_ms))


# --- invariants and the record --------------------------------------------------------


def check_transition(before: TxnMetadata | None, after: TxnMetadata) -> None:
    """Raise ``ValueError`` if ``before`` -> ``after`` breaks Kafka's rules (a bug)."""
    if before is None:
        if after.state is not TxnState.EMPTY or after.producer_epoch != 0:
            raise ValueError(f"a new id must start Empty at epoch 0, not {after}")
        return
    if before.state not in _VALID_PREVIOUS[after.state]:
        raise ValueError(f"{before.state.kafka_name} -> {after.state.kafka_name} is not allowed")
    if after.producer_id == before.producer_id:
        if after.producer_epoch not in (before.producer_epoch, _bumped(before.producer_epoch)):
            raise ValueError(f"epoch {before.producer_epoch} -> {after.producer_epoch}")
    elif after.producer_epoch != 0:
        raise ValueError(f"a new producer id must start at epoch 0, not {after.producer_epoch}")
    if after.last_update_ms < before.last_update_ms:
        raise ValueError("the last update time went backwards")
    if (
        before.state is TxnState.ONGOING
        and after.state in (TxnState.ONGOING,)
        and not (before.partitions <= after.partitions)
    ):
        raise ValueError("an ongoing transaction lost partitions")
    if after.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.EMPTY) and (
        after.partitions
    ):
        raise ValueError(f"{after.state.kafka_name} with partitions")


def to_log_value(metadata: TxnMetadata) -> TxnLogValue | None:
    """The record value of ``metadata``; None (a tombstone) for Dead."""
    if metadata.state is TxnState.DEAD:
        return None
    return TxnLogValue(
        metadata.producer_id,
        metadata.producer_epoch,
        metadata.timeout_ms,
        int(metadata.state),
        None if metadata.state is TxnState.EMPTY else metadata.partitions,
        metadata.last_update_ms,
        metadata.start_ms,
        metadata.previous_producer_id,
        metadata.next_producer_id,
        metadata.client_version,
    )


def from_log_value(transactional_id: str, value: TxnLogValue) -> TxnMetadata:
    """The metadata a loading coordinator rebuilds from a record (``last_producer_epoch``
    is memory only: -1). Raises ``ValueError`` for a state number Kafka does not write."""
    try:
        state = TxnState(value.state)
    except ValueError:
        raise ValueError(f"{transactional_id}: unknown transaction state {value.state}") from None
    if state in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
        raise ValueError(f"{transactional_id}: state {state.kafka_name} is never written")
    return TxnMetadata(
        transactional_id,
        value.producer_id,
        value.producer_epoch,
        value.timeout_ms,
        state,
        value.partitions or frozenset(),
        value.start_ms,
        value.last_update_ms,
        value.previous_producer_id,
        value.next_producer_id,
        value.client_version,
    )
