"""``broker.grpc.data_service.fetch_response`` splices the stored bytes into a hand-built
``FetchResponse``: it must parse to exactly the message the protobuf constructor builds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.core.fetch import PartitionFetched
from tidelog.broker.grpc.data_service import fetch_response
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

_answers = st.lists(
    st.builds(
        PartitionFetched,
        topic=st.text(max_size=20),
        partition=st.integers(0, 2**31 - 1),
        # Sizes across the varint boundaries of the length prefixes (127/128, 16383/16384).
        records=st.one_of(
            st.binary(max_size=300),
            st.sampled_from([127, 128, 16_383, 16_384, 70_000]).map(lambda n: b"\x07" * n),
        ),
        high_watermark=st.integers(-1, 2**62),
        log_start_offset=st.integers(-1, 2**62),
        error_code=st.sampled_from(["", "OFFSET_OUT_OF_RANGE", "UNKNOWN_TOPIC_OR_PARTITION"]),
        error_message=st.text(max_size=30),
        batch_times=st.binary(max_size=48),
        diverging=st.none() | st.tuples(st.integers(-1, 2**31 - 1), st.integers(-1, 2**62)),
        last_stable_offset=st.integers(-1, 2**62),
        aborted_transactions=st.lists(
            st.tuples(st.integers(0, 2**62), st.integers(0, 2**62)), max_size=3
        ).map(tuple),
    ),
    max_size=4,
)


def _constructed(
    correlation_id: int, answers: list[PartitionFetched], throttle_ms: int, session_id: int = 0
) -> pb.FetchResponse:
    return pb.FetchResponse(
        correlation_id=correlation_id,
        throttle_time_ms=throttle_ms,
        session_id=session_id,
        results=[
            pb.FetchPartitionResult(
                topic=a.topic,
                partition=a.partition,
                error_code=a.error_code,
                error_message=a.error_message,
                high_watermark=a.high_watermark,
                log_start_offset=a.log_start_offset,
                records=a.records,
                batch_times=a.batch_times,
                diverging_epoch=(
                    None
                    if a.diverging is None
                    else pb.EpochEndOffset(epoch=a.diverging[0], end_offset=a.diverging[1])
                ),
                last_stable_offset=a.last_stable_offset,
                aborted_transactions=[
                    pb.AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in a.aborted_transactions
                ],
            )
            for a in answers
        ],
    )


@settings(max_examples=200, deadline=None)
@given(
    correlation_id=st.integers(-(2**63), 2**63 - 1),
    answers=_answers,
    throttle_ms=st.integers(0, 2**31 - 1),
    session_id=st.integers(0, 2**31 - 1),
)
def test_spliced_answer_parses_to_the_constructed_message(
    correlation_id: int, answers: list[PartitionFetched], throttle_ms: int, session_id: int
) -> None:
    wire = fetch_response(correlation_id, answers, throttle_ms, session_id)
    constructed = _constructed(correlation_id, answers, throttle_ms, session_id)
    assert pb.FetchResponse.FromString(wire) == constructed


def test_a_one_mebibyte_answer_round_trips() -> None:
    records = bytes(range(256)) * 4096
    answers = [PartitionFetched("t", 0, records, 10, 0), PartitionFetched("u", 3)]
    parsed = pb.FetchResponse.FromString(fetch_response(7, answers))
    assert parsed.results[0].records == records
    assert parsed == _constructed(7, answers, 0)
