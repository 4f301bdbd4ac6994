"""A partition log driven with idempotent and transactional producers, against a model.

Rules write plain, idempotent and transactional batches, commit and abort (markers through
``append_marker``, also for producers with nothing open), send a producer's last
transactional batch again (a retry: a duplicate while its transaction is open, out of
order once a marker ended it), roll, truncate at a batch boundary (a follower's
divergence), and reopen cleanly and uncleanly (from the log start or from a flushed
recovery point). After every step:

* the last stable offset is the first offset of the oldest open transaction, else the log
  end (one node: the high watermark is the log end);
* a read_committed reader applying Kafka's client filtering to ``read`` (up to the LSO) and
  ``aborted_transactions`` gets exactly the committed and non-transactional records below
  the LSO, in offset order;
* a read_uncommitted reader gets every data record.

After a truncation every producer moves to a new epoch (what a producer does after its
leader changed under it), so the model need not predict sequence state that the cut
changed; a transaction whose marker was cut is open again and may be ended later.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.storage.conftest import T0, crash, log_config, open_log, reopen_clean, reopen_unclean
from tests.storage.txn_reader import read_committed, read_uncommitted, txn_batch
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import OutOfOrderSequenceError
from tidelog.storage.partition_log import PartitionLog
from tidelog.storage.records import BatchBuilder

IDEMPOTENT = 1
TRANSACTIONAL = (10, 11, 12)


@dataclass
class ModelBatch:
    """One batch of the log: data (``values``) or a marker (``commit`` not None)."""

    base: int
    last: int
    producer_id: int | None
    transactional: bool
    values: list[bytes]
    commit: bool | None = None


@dataclass
class Sent:
    """A producer's last transactional batch: what a retry repeats, and whether the
    transaction it belongs to is still open."""

    epoch: int
    first_sequence: int
    count: int
    base: int
    open: bool = True


class TxnLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tidelog-txn-sm-"))
        self.directory = self.root / "events-0"
        self.clock = ManualClock(T0)
        self.batches: list[ModelBatch] = []
        self.epochs = dict.fromkeys((IDEMPOTENT, *TRANSACTIONAL), 0)
        self.sequences = dict.fromkeys((IDEMPOTENT, *TRANSACTIONAL), 0)
        self.counter = 0
        self.last_sent: dict[int, Sent] = {}
        self.log: PartitionLog

    @initialize(segment_bytes=st.integers(250, 1200))
    def open(self, segment_bytes: int) -> None:
        config = log_config(segment_bytes=segment_bytes, file_delete_delay_ms=0)
        self.log = open_log(self.directory, self.clock, config)

    def teardown(self) -> None:
        crash(self.root)
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ model

    @property
    def end(self) -> int:
        return self.batches[-1].last + 1 if self.batches else 0

    def _values(self, count: int) -> list[bytes]:
        self.counter += count
        return [b"r%d" % n for n in range(self.counter - count, self.counter)]

    def _visible(self) -> tuple[int, list[bytes], list[bytes]]:
        """The model's LSO, read_committed values and read_uncommitted values."""
        open_txns: dict[int, list[ModelBatch]] = {}
        committed: set[int] = set()  # id() of data batches that committed
        for batch in self.batches:
            pid = batch.producer_id
            if batch.commit is not None:
                assert pid is not None
                ended = open_txns.pop(pid, [])
                if batch.commit:
                    committed.update(id(b) for b in ended)
            elif batch.transactional:
                assert pid is not None
                open_txns.setdefault(pid, []).append(batch)
        lso = min((txn[0].base for txn in open_txns.values()), default=self.end)
        visible = [
            value
            for batch in self.batches
            if batch.base < lso and (not batch.transactional or id(batch) in committed)
            for value in batch.values
        ]
        everything = [value for batch in self.batches for value in batch.values]
        return lso, visible, everything

    # ------------------------------------------------------------------ rules

    @rule(count=st.integers(1, 3), idempotent=st.booleans())
    def write_plain(self, count: int, idempotent: bool) -> None:
        values = self._values(count)
        if idempotent:
            pid = IDEMPOTENT
            batch = txn_batch(
                pid, self.epochs[pid], self.sequences[pid], values, transactional=False
            )
            self.sequences[pid] += count
        else:
            builder = BatchBuilder()
            for value in values:
                builder.append(T0, None, value)
            batch, pid = builder.build(), None  # type: ignore[assignment]
        result = self.log.append(batch)
        assert result.base_offset == self.end
        self.batches.append(ModelBatch(result.base_offset, result.last_offset, pid, False, values))

    @rule(pid=st.sampled_from(TRANSACTIONAL), count=st.integers(1, 3))
    def write_transactional(self, pid: int, count: int) -> None:
        values = self._values(count)
        batch = txn_batch(pid, self.epochs[pid], self.sequences[pid], values)
        sent = Sent(self.epochs[pid], self.sequences[pid], count, self.end)
        self.sequences[pid] += count
        result = self.log.append(batch)
        assert result.base_offset == self.end
        self.batches.append(ModelBatch(result.base_offset, result.last_offset, pid, True, values))
        self.last_sent[pid] = sent

    @rule(pid=st.sampled_from(TRANSACTIONAL))
    def retry_last_batch(self, pid: int) -> None:
        sent = self.last_sent.get(pid)
        if sent is None:
            return
        batch = txn_batch(pid, sent.epoch, sent.first_sequence, [b"retry"] * sent.count)
        if sent.open:
            result = self.log.append(batch)
            assert result.duplicate
            assert result.base_offset == sent.base
        else:  # a transaction's end closes its duplicate window
            with pytest.raises(OutOfOrderSequenceError):
                self.log.append(batch)
        assert self.log.log_end_offset == self.end

    @rule(pid=st.sampled_from(TRANSACTIONAL), commit=st.booleans())
    def end_transaction(self, pid: int, commit: bool) -> None:
        offset = self.log.append_marker(pid, self.epochs[pid], commit, 0)
        assert offset == self.end
        self.batches.append(ModelBatch(offset, offset, pid, True, [], commit))
        if pid in self.last_sent:
            self.last_sent[pid].open = False

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def reopen_clean(self) -> None:
        self.log = reopen_clean(self.log, self.clock)

    @rule(flushed=st.booleans())
    def reopen_unclean(self, flushed: bool) -> None:
        recovery_point = 0
        if flushed:
            self.log.flush()
            recovery_point = self.log.recovery_point
        self.log = reopen_unclean(self.log, self.clock, recovery_point=recovery_point)

    @rule(choice=st.integers(0, 10**6))
    def truncate(self, choice: int) -> None:
        if not self.batches:
            return
        keep = choice % (len(self.batches) + 1)
        cut = self.batches[keep].base if keep < len(self.batches) else self.end
        self.log.truncate_to(cut)
        del self.batches[keep:]
        assert self.log.log_end_offset == self.end
        for pid in self.epochs:  # producers start a new epoch after their leader moved
            self.epochs[pid] += 1
            self.sequences[pid] = 0
        self.last_sent.clear()

    # ------------------------------------------------------------------ checks

    @invariant()
    def reads_match_the_model(self) -> None:
        if not hasattr(self, "log"):
            return
        lso, visible, everything = self._visible()
        assert self.log.log_end_offset == self.end
        assert self.log.last_stable_offset == lso
        assert [r.value for r in read_committed(self.log)] == visible
        assert [r.value for r in read_uncommitted(self.log)] == everything


TxnLogMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_transactional_log_state_machine = TxnLogMachine.TestCase
