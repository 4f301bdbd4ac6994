"""The checker's transactional verdicts added for the transactional workload (issue #28):
a read before its transaction's commit was asked for (``uncommitted-read``), and a
committed record away from the offset it was acknowledged at (``lost-write``).

Split from ``test_checker.py`` (past the 800-line mark); it reuses that file's
simulated correct log and its small constructors, so a legal history stays legal under
the new rules and each injected anomaly is the only kind reported.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import assume, given
from hypothesis import strategies as st

from tests.faults.checker import Report, check
from tests.faults.history import FinalRead, History, Op, Poll, TxnAbort, TxnCommit
from tests.faults.test_checker import _SETTINGS, _final, _poll, _send, _txn, legal_histories


def inject_uncommitted_read(history: History, rng: random.Random) -> History | None:
    """A commit of some value a poll read, moved to start after that poll ended."""
    commits = {value: op for op in history if isinstance(op, TxnCommit) for value in op.values}
    candidates = [
        (op, commits[value])
        for op in history
        if isinstance(op, Poll)
        for _, value in op.records
        if value in commits
    ]
    if not candidates:
        return None
    poll, txn = rng.choice(candidates)
    start = max(txn.start_ns, poll.end_ns + 1)
    later = dataclasses.replace(txn, start_ns=start, end_ns=max(txn.end_ns, start + 1))
    return tuple(later if op is txn else op for op in history)


@_SETTINGS
@given(history=legal_histories(), seed=st.integers(0, 2**32 - 1))
def test_an_uncommitted_read_made_by_hand_is_caught(history: tuple[Op, ...], seed: int) -> None:
    assert check(history).valid
    broken = inject_uncommitted_read(history, random.Random(seed))
    assume(broken is not None)
    assert broken is not None
    report = check(broken)
    assert report.kinds() == {"uncommitted-read"}, report.summary()


def test_an_uncommitted_read_by_hand() -> None:
    a = _send("a", 0, (0, 1), transactional=True)
    final = _final((0, "a"), end=2)
    # The commit starts at 10: a poll that ended at 3 read it too early, whatever the
    # commit's outcome (one that ended unknown may well have committed).
    for outcome in ("ok", "unknown"):
        report = check([a, _poll("c", (0, "a"), at=2), _txn(TxnCommit, outcome, "a"), final])
        assert report.kinds() == {"uncommitted-read"}, report.summary()
        assert isinstance(report.anomalies[0].evidence[1], Poll)
    # A poll that ended once the commit had started may have read it committed.
    assert check([a, _poll("c", (0, "a"), at=9), _txn(TxnCommit, "ok", "a"), final]).valid
    assert check([a, _poll("c", (0, "a"), at=20), _txn(TxnCommit, "ok", "a"), final]).valid


def test_reads_of_transactions_never_committed_are_other_anomalies_or_none() -> None:
    a = _send("a", 0, (0, 1), transactional=True)
    early = _poll("c", (0, "a"), at=2)
    # A definite abort: the read is an aborted read, not (also) an uncommitted one.
    assert check([a, early, _txn(TxnAbort, "ok", "a"), _final(end=2)]).kinds() == {"aborted-read"}
    # An abort that may not have happened, or no end at all: the fate is unknown.
    assert check([a, early, _txn(TxnAbort, "unknown", "a"), _final((0, "a"), end=2)]).valid
    assert check([a, early, _final((0, "a"), end=2)]).valid


def test_a_committed_record_away_from_its_acknowledged_offset_by_hand() -> None:
    a = _send("a", 0, (0, 1), transactional=True)
    b = _send("b", 1, (2, 3), transactional=True)
    commit = _txn(TxnCommit, "ok", "a", "b")
    assert check([a, b, commit, _final((0, "a"), (1, "b"))]).valid
    # Acknowledged at 0, found at 2: the acknowledgement named the wrong record.
    moved = check([a, b, commit, _final((1, "b"), (2, "a"))])
    assert moved.kinds() == {"lost-write"}, moved.summary()
    assert moved.anomalies[0].evidence[0] == a
    # Another value where it was acknowledged (and it nowhere).
    c = _send("c", 2, (4, 5), transactional=True, producer="q")
    other = TxnCommit(producer_id="q", values=("c",), outcome="ok", start_ns=12, end_ns=13)
    report = check([a, b, commit, c, other, _final((0, "a"), (1, "b"), (2, "x"))])
    assert report.kinds() == {"lost-write"}, report.summary()
    assert any(anomaly.evidence == (c, report_final(report)) for anomaly in report.anomalies)
    # Missing altogether: the transaction's own verdict, once.
    missing = check([a, b, commit, _final((1, "b"), end=2)])
    assert missing.kinds() == {"partial-transaction"}, missing.summary()


def test_a_send_that_failed_is_no_part_of_its_committed_transaction() -> None:
    # ``produce`` raised (a full queue): nothing was queued, the rest commits without it.
    a = _send("a", 0, (0, 1), transactional=True)
    gone = _send("b", None, (2, 3), "failed", transactional=True)
    commit = _txn(TxnCommit, "ok", "a", "b")
    assert check([a, gone, commit, _final((0, "a"))]).valid
    # Acknowledged instead, and absent: the transaction is partial, and the detail says
    # which send, how it ended and where it was acknowledged.
    acked = _send("b", 1, (2, 3), transactional=True)
    report = check([a, acked, commit, _final((0, "a"), end=2)])
    assert report.kinds() == {"partial-transaction"}, report.summary()
    assert "'b' (ok at t-0@1)" in report.anomalies[0].detail
    # A failed send read all the same was written after all: an aborted read.
    assert check([a, gone, commit, _final((0, "a"), (1, "b"))]).kinds() == {"aborted-read"}


def test_a_transaction_not_committed_is_not_held_to_its_offsets() -> None:
    # Records of an abort or an undecided commit are not acknowledged: where they are, if
    # anywhere, is judged by all-or-nothing only.
    a = _send("a", 0, (0, 1), transactional=True)
    b = _send("b", 1, (2, 3), transactional=True)
    for end in (_txn(TxnCommit, "unknown", "a", "b"), _txn(TxnAbort, "unknown", "a", "b")):
        assert check([a, b, end, _final((1, "b"), (2, "a"))]).valid


def report_final(report: Report) -> FinalRead:
    """The final read some anomaly of ``report`` names (the tests above make one)."""
    for anomaly in report.anomalies:
        for op in anomaly.evidence:
            if isinstance(op, FinalRead):
                return op
    raise AssertionError("no final read in the evidence")
