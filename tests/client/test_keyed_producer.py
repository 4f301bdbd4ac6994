"""KeyedProducer: a writer re-run after a failure stores every record exactly once."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, TopicPartition
from tidelog.client.admin import AdminClient
from tidelog.client.keyed_producer import KeyedProducer, ProducerRecord, plan_batches


def _values(broker: InProcessBroker, tp: TopicPartition, end: int) -> list[bytes | None]:
    consumer = Consumer(broker.address, auto_offset_reset="earliest", enable_auto_commit=False)
    out = []
    try:
        consumer.assign([tp])
        while consumer.position(tp) < end:
            out.extend(r.value for r in consumer.poll(timeout_ms=500))
    finally:
        consumer.close(autocommit=False)
    return out


@given(
    sizes=st.lists(st.integers(0, 300), max_size=40),
    first=st.integers(0, 45),
    max_records=st.integers(1, 8),
    max_bytes=st.integers(100, 2_000),
)
def test_plan_batches_is_a_deterministic_partition_of_the_tail(
    sizes: list[int], first: int, max_records: int, max_bytes: int
) -> None:
    records = [ProducerRecord(None, b"x" * n) for n in sizes]
    cuts = plan_batches(records, first, max_batch_records=max_records, max_batch_bytes=max_bytes)
    covered = [i for start, stop in cuts for i in range(start, stop)]
    assert covered == list(range(first, len(records)))
    assert all(0 < stop - start <= max_records for start, stop in cuts)
    # Resuming at any cut gives the same cuts from there on.
    for index, (start, _) in enumerate(cuts):
        again = plan_batches(
            records, start, max_batch_records=max_records, max_batch_bytes=max_bytes
        )
        assert again == cuts[index:]


def test_a_rerun_skips_what_the_failed_attempt_stored() -> None:
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic("out", 2)
        records = {
            TopicPartition("out", p): [ProducerRecord(b"k", b"%d-%03d" % (p, i)) for i in range(95)]
            for p in range(2)
        }
        # The first attempt gets 8 batches of 5 into partition 0, and nothing into 1.
        with KeyedProducer(broker.address, "job:0", max_batch_records=5) as first:
            partial = {TopicPartition("out", 0): records[TopicPartition("out", 0)][:40]}
            assert first.write_once(partial, epoch=3).written == 40
        with KeyedProducer(broker.address, "job:0", max_batch_records=5) as rerun:
            summary = rerun.write_once(records, epoch=3)
            assert (summary.written, summary.skipped) == (150, 40)
            assert rerun.write_once(records, epoch=3).written == 0  # and again: nothing
            # The next unit of work (a higher epoch) starts again at sequence 0.
            nxt = {TopicPartition("out", 1): [ProducerRecord(None, b"next")]}
            assert rerun.write_once(nxt, epoch=4).written == 1
        for p in range(2):
            tp = TopicPartition("out", p)
            want = [r.value for r in records[tp]] + ([b"next"] if p == 1 else [])
            assert _values(broker, tp, len(want)) == want


def test_two_attempts_racing_store_each_record_once() -> None:
    with InProcessBroker() as broker, AdminClient(broker.address) as admin:
        admin.create_topic("out", 1)
        tp = TopicPartition("out", 0)
        records = {tp: [ProducerRecord(None, b"%03d" % i) for i in range(60)]}
        with KeyedProducer(broker.address, "race", max_batch_records=4) as one:
            assert one.write_once({tp: records[tp][:20]}, epoch=0).written == 20

        def attempt() -> None:
            with KeyedProducer(broker.address, "race", max_batch_records=4) as producer:
                producer.write_once(records, epoch=0)

        # Three attempts at once (a zombie and two retries, say) from the same prefix.
        threads = [threading.Thread(target=attempt) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert _values(broker, tp, 60) == [r.value for r in records[tp]]
        with AdminClient(broker.address) as check:
            assert check.describe_topic("out").partitions[0].high_watermark == 60
