"""Review of keyed producers on the broker: what DescribeProducers answers after an
unclean stop (no producer snapshot: the state is rebuilt from batch headers) and after
``producer.id.expiration.ms``."""

from __future__ import annotations

from pathlib import Path

from tidelog.broker.core.producer_ids import ProducerIdManager
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, TopicPartition
from tidelog.client.keyed_producer import KeyedProducer, ProducerRecord
from tidelog.storage.clock import ManualClock

DAY_MS = 86_400_000


def _values(address: str, tp: TopicPartition, end: int) -> list[bytes | None]:
    consumer = Consumer(address, auto_offset_reset="earliest", enable_auto_commit=False)
    out: list[bytes | None] = []
    try:
        consumer.assign([tp])
        while consumer.position(tp) < end:
            out.extend(r.value for r in consumer.poll(timeout_ms=500))
    finally:
        consumer.close(autocommit=False)
    return out


def test_a_rerun_after_an_unclean_stop_skips_what_the_log_holds(tmp_path: Path) -> None:
    """Eight batches of a keyed producer, then the broker stops without a usable producer
    snapshot (as after a crash): DescribeProducers still reports sequence 39, from the
    batch headers, and the re-run writes only the rest."""
    tp = TopicPartition("out", 0)
    records = [ProducerRecord(None, b"%03d" % i) for i in range(60)]
    with InProcessBroker(tmp_path) as broker:
        with AdminClient(broker.address) as admin:
            # Several segments: the rebuild crosses them (a roll also snapshots).
            admin.create_topic("out", 1, {"segment.bytes": "600"})
        with KeyedProducer(broker.address, "job", max_batch_records=5) as first:
            assert first.write_once({tp: records[:40]}, epoch=7).written == 40
        address = broker.address
    for snapshot in tmp_path.rglob("*.snapshot"):
        snapshot.unlink()
    port = int(address.rsplit(":", 1)[1])
    with InProcessBroker(tmp_path, port=port) as broker:
        with KeyedProducer(broker.address, "job", max_batch_records=5) as rerun:
            assert rerun.stored_sequences([tp], 7) == {tp: 40}
            summary = rerun.write_once({tp: records}, epoch=7)
            assert (summary.written, summary.skipped) == (20, 40)
        assert _values(broker.address, tp, 60) == [r.value for r in records]


def test_an_expired_key_gets_a_new_id_and_the_old_one_is_never_reused(tmp_path: Path) -> None:
    """After producer.id.expiration.ms of disuse a key starts afresh (the documented
    limit: a re-run that late writes again); the expired id is not handed out again,
    even after a restart, so the partitions' state of the old id can never be mistaken
    for a new producer's."""
    clock = ManualClock()
    manager = ProducerIdManager.open(tmp_path, clock, DAY_MS)
    old, _ = manager.init_keyed("spark:q:0:0")
    clock.advance(DAY_MS + 1)
    new, epoch = manager.init_keyed("spark:q:0:0")
    assert (new != old, epoch) == (True, 0)
    reopened = ProducerIdManager.open(tmp_path, clock, DAY_MS)
    assert reopened.init_keyed("spark:q:0:0") == (new, 0)
    assert reopened.init(-1, -1)[0] not in (old, new)
