"""``client.share_outcomes.UnsureAcknowledgements``: which refusal a share consumer may
report as "not applied" (the rules alone; the consumer against a real broker is
``test_share_ack_retry.py``, and the fault harness's share checker holds it to them
under broker kills).

A refusal (``InvalidRecordStateError``) of offsets an unanswered request carried is
unknown; a success, another error, or a refusal of offsets no unanswered request carried
is reported as it is; an offset is forgotten once settled.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.client import AcknowledgementOutcomeUnknownError, TopicPartition
from tidelog.client.share_outcomes import UnsureAcknowledgements
from tidelog.storage.errors import (
    BrokerUnavailableError,
    InvalidRecordStateError,
    NotLeaderOrFollowerError,
)

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def test_a_refusal_after_an_unanswered_request_is_unknown() -> None:
    unsure = UnsureAcknowledgements()
    lost = BrokerUnavailableError("no answer")
    unsure.unanswered(TP, [3, 4], lost)
    reported = unsure.outcome(TP, [3, 4], InvalidRecordStateError("not held"))
    assert isinstance(reported, AcknowledgementOutcomeUnknownError)
    assert reported.__cause__ is lost
    assert not reported.retriable  # commit_sync must not wait on it
    # Settled: the same offsets refused again later (a new delivery) are "not applied".
    refused = InvalidRecordStateError("not held")
    assert unsure.outcome(TP, [3, 4], refused) is refused


def test_success_other_errors_and_other_partitions_are_reported_as_they_are() -> None:
    unsure = UnsureAcknowledgements()
    unsure.unanswered(TP, [1], BrokerUnavailableError("no answer"))
    refused = InvalidRecordStateError("not held")
    assert unsure.outcome(OTHER, [1], refused) is refused
    assert unsure.outcome(TP, [2], refused) is refused  # no unanswered request had 2
    moved = NotLeaderOrFollowerError("moved")
    assert unsure.outcome(TP, [1], moved) is moved
    unsure.unanswered(TP, [1], BrokerUnavailableError("no answer"))
    assert unsure.outcome(TP, [1], None) is None


@given(
    sent=st.sets(st.integers(0, 20)),
    settled=st.sets(st.integers(0, 20), min_size=1),
)
def test_a_refusal_is_unknown_exactly_when_it_covers_an_unanswered_offset(
    sent: set[int], settled: set[int]
) -> None:
    unsure = UnsureAcknowledgements()
    unsure.unanswered(TP, sorted(sent), BrokerUnavailableError("no answer"))
    reported = unsure.outcome(TP, sorted(settled), InvalidRecordStateError("not held"))
    assert isinstance(reported, AcknowledgementOutcomeUnknownError) == bool(sent & settled)
    # What was settled is forgotten; the rest stays unsure.
    again = unsure.outcome(TP, range(21), InvalidRecordStateError("not held"))
    assert isinstance(again, AcknowledgementOutcomeUnknownError) == bool(sent - settled)
