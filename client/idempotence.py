"""Sequence numbers of an idempotent producer, and what to do with each produce answer.

Kafka's rules (reference section 4), kept per partition:

- A batch gets its producer id, epoch and base sequence when it is first drained, and
  keeps them (and its bytes) on every retry, so the broker can recognise a retry and
  answer it with the original offsets instead of storing it twice.
- The broker accepts a batch only if its first sequence follows the last one stored, so
  batches of one partition land in order even with several requests in flight.
- ``OUT_OF_ORDER_SEQUENCE_NUMBER`` for a batch that is not the next one expected just
  means an earlier batch has not landed yet: retry it after that one. For the batch that
  *is* the next one expected it means the broker lost what it had acknowledged (an
  unclean restart that cut the log): the batch fails with ``OutOfOrderSequenceError``.
- Once a batch with a sequence fails for good, every later sequence of that partition is
  unusable (the broker would wait for the missing one forever). As Kafka since KIP-360,
  the partition starts over with a fresh producer identity: batches the broker cannot
  have stored (answered ``OUT_OF_ORDER_SEQUENCE_NUMBER`` or a request error, which is
  decided before the append, or never sent) are given new sequences; batches whose fate
  is unknown (timed out, an internal error) fail with the first one, because resending
  them under a new identity could store them twice.

Tidelog hands out producer ids cheaply, so a partition starts over under a *new producer
id* (epoch 0), which the broker accepts at any sequence, rather than by bumping the epoch
of the id every other partition is using; other partitions keep theirs undisturbed.

Pure: integers and batch descriptions in, decisions out. Not thread-safe (the producer's
sender thread is its only user).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidelog.client.types import TopicPartition
from tidelog.storage.errors import OutOfOrderSequenceError, RequestError, TidelogError

__all__ = ["Decision", "ResetMode", "SequenceTable"]

NO_SEQUENCE = -1
_SEQUENCE_MODULUS = 2**31


class Decision(enum.Enum):
    """What the sender does with a batch after an answer or a failure."""

    COMPLETE = "complete"  # stored (or a duplicate of a stored batch): complete it
    RETRY = "retry"  # back into the queue, same bytes, after the backoff
    REQUEUE_FRESH = "requeue_fresh"  # not stored: back into the queue for new sequences
    FAIL = "fail"  # fail its records with the error


class ResetMode(enum.Enum):
    """How a partition's other sequenced batches are treated when it starts over."""

    RESEQUENCE = "resequence"  # the broker cannot have stored them: new sequences
    FAIL = "fail"  # they may have been stored: fail them too


@dataclass(slots=True)
class _PartitionSequences:
    producer_id: int
    producer_epoch: int
    next_sequence: int = 0
    last_acked: int = NO_SEQUENCE
    reset: ResetMode | None = None


class SequenceTable:
    """Per-partition producer identity and sequences of one idempotent producer."""

    __slots__ = ("_epoch", "_external", "_partitions", "_producer_id", "_stale_ids")

    def __init__(self, *, external_identity: bool = False) -> None:
        """``external_identity``: the identity is set by its owner (a transactional
        producer's ``client.transactions``), never asked for by the sender: the table
        never reports ``needs_producer_id``, and the owner decides when a batch may go."""
        self._external = external_identity
        self._producer_id = -1
        self._epoch = -1
        self._partitions: dict[TopicPartition, _PartitionSequences] = {}
        # Ids some partition started over from: a new partition state must not use them.
        self._stale_ids: set[int] = set()

    # --- the producer identity --------------------------------------------------------

    @property
    def producer_id(self) -> int:
        return self._producer_id

    @property
    def needs_producer_id(self) -> bool:
        """True until ``InitProducerId`` answered, and after a partition started over."""
        if self._external:
            return False
        return self._producer_id < 0 or self._producer_id in self._stale_ids

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """The identity that partitions without sequences yet will use."""
        self._producer_id = producer_id
        self._epoch = epoch

    def restart(self, producer_id: int, epoch: int) -> None:
        """A new identity for every partition, each from sequence 0 (a transactional
        producer's epoch bump): everything known of the old one is forgotten."""
        self._partitions.clear()
        self._stale_ids.clear()
        self.set_producer_id(producer_id, epoch)

    # --- sending ------------------------------------------------------------------------

    def can_send(self, tp: TopicPartition, in_flight: int = 0) -> bool:
        """Whether ``tp``'s next batch may go out, with ``in_flight`` batches of it flying.

        False while ``tp`` starts over, or needs an identity that is not there yet; and
        while the first batch of ``tp``'s identity is in flight and none has been
        acknowledged. The broker accepts a producer id it has never seen at any sequence
        (its state may have expired), so if that first batch failed retriably while a
        later one was stored, the later one would be stored first and the first could
        never follow it. One round trip per partition and identity closes that gap.
        """
        state = self._partitions.get(tp)
        if state is None:
            return not self.needs_producer_id
        if state.reset is not None:
            return False
        return in_flight == 0 or state.last_acked != NO_SEQUENCE

    def assign(self, tp: TopicPartition, record_count: int) -> tuple[int, int, int]:
        """``(producer_id, epoch, base_sequence)`` for a batch of ``tp`` drained first now.

        Raises ``RuntimeError`` if ``can_send(tp)`` is false.
        """
        state = self._partitions.get(tp)
        if state is None:
            if self.needs_producer_id:
                raise RuntimeError(f"no usable producer id for {tp}")
            state = _PartitionSequences(self._producer_id, self._epoch)
            self._partitions[tp] = state
        elif state.reset is not None:
            raise RuntimeError(f"{tp} is starting over")
        base = state.next_sequence
        state.next_sequence = (base + record_count) % _SEQUENCE_MODULUS
        return state.producer_id, state.producer_epoch, base

    # --- answers ------------------------------------------------------------------------

    def acked(self, tp: TopicPartition, producer_id: int, last_sequence: int) -> None:
        """A batch of ``tp`` was stored (or recognised as a duplicate)."""
        state = self._partitions.get(tp)
        if state is not None and state.producer_id == producer_id:
            state.last_acked = last_sequence

    def decide_error(
        self,
        tp: TopicPartition,
        producer_id: int,
        base_sequence: int,
        error: TidelogError,
        can_retry: bool,
    ) -> Decision:
        """What to do with a batch that failed with ``error``.

        ``can_retry`` is false once the batch ran out of retries or delivery time.
        A decision that leaves a gap in the partition's sequences also starts the
        partition over (``reset_pending`` becomes true for it).
        """
        state = self._partitions.get(tp)
        sequenced = base_sequence != NO_SEQUENCE
        if not sequenced or state is None or state.producer_id != producer_id:
            # Not idempotent, or from an identity the partition already left behind.
            if state is not None and state.reset is ResetMode.RESEQUENCE and sequenced:
                return Decision.REQUEUE_FRESH
            if state is not None and state.reset is ResetMode.FAIL and sequenced:
                return Decision.FAIL
            return Decision.RETRY if error.retriable and can_retry else Decision.FAIL
        if state.reset is ResetMode.RESEQUENCE:
            # An earlier batch failed for good: this one was not stored after it.
            return Decision.REQUEUE_FRESH
        if state.reset is ResetMode.FAIL:
            return Decision.FAIL
        if isinstance(error, OutOfOrderSequenceError):
            expected = (state.last_acked + 1) % _SEQUENCE_MODULUS
            if base_sequence != expected:
                # An earlier batch has not landed yet; this one follows it.
                if can_retry:
                    return Decision.RETRY
                state.reset = ResetMode.FAIL
                return Decision.FAIL
            # The broker lost batches it had acknowledged: fail this one, start over.
            state.reset = ResetMode.RESEQUENCE
            return Decision.FAIL
        if error.retriable:
            if can_retry:
                return Decision.RETRY
            # Its fate is unknown (it may be stored): it and everything after it fail.
            state.reset = ResetMode.FAIL
            return Decision.FAIL
        if isinstance(error, RequestError):
            # Refused for good (too large, corrupt, fenced...): a request error is decided
            # before the append, so it was not stored, and neither were the batches after
            # it; they get new sequences.
            state.reset = ResetMode.RESEQUENCE
            return Decision.FAIL
        # Anything else final (an internal error) may have come after the append: its
        # fate is unknown, so it and everything after it fail rather than be resent
        # under a new identity.
        state.reset = ResetMode.FAIL
        return Decision.FAIL

    def expired(self, tp: TopicPartition, producer_id: int, base_sequence: int) -> None:
        """A sequenced batch that waited for a retry ran out of delivery time."""
        state = self._partitions.get(tp)
        if (
            base_sequence != NO_SEQUENCE
            and state is not None
            and state.producer_id == producer_id
            and state.reset is None
        ):
            state.reset = ResetMode.FAIL

    def reset_mode(self, tp: TopicPartition) -> ResetMode | None:
        """How ``tp`` is starting over, or None if it is not."""
        state = self._partitions.get(tp)
        return None if state is None else state.reset

    def finish_reset(self, tp: TopicPartition) -> None:
        """``tp`` has nothing in flight any more: forget its identity and sequences.

        Its next batch uses a producer id it never used; the current one becomes stale,
        so ``needs_producer_id`` turns true until a fresh id is set.
        """
        state = self._partitions.pop(tp, None)
        if state is not None:
            self._stale_ids.add(state.producer_id)

    def resetting(self) -> list[TopicPartition]:
        """Partitions that are starting over."""
        return [tp for tp, state in self._partitions.items() if state.reset is not None]
