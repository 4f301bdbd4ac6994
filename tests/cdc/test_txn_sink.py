"""``TransactionalSink`` on its own against a real broker (docs/cdc.md): a second sink
with the same name fences the first, whose open transaction never becomes visible and
whose next commit stops it with ``CdcError`` ("fenced"), not a retry; a transaction made
abortable by a refused record is aborted and written again until it commits."""

from __future__ import annotations

import logging
import threading

import pytest

from tests.broker.cluster.waiting import eventually
from tests.cdc.topics import read_topic
from tidelog.broker.testing import InProcessBroker
from tidelog.client.admin import AdminClient
from tidelog.client.cdc import CdcError, ChangeRecord, ChangeUnit, Position, TransactionalSink
from tidelog.client.cdc.sink import ensure_compacted_topic, read_position

pytestmark = pytest.mark.timeout(60)


def _unit(topic: str, n: int) -> ChangeUnit:
    record = ChangeRecord(topic, f'{{"id": {n}}}'.encode(), f'{{"n": {n}}}'.encode())
    return ChangeUnit((record,), Position(1_000 + n, True, 0))


def _committed(broker: InProcessBroker, topic: str) -> list[bytes | None]:
    return [r.value for r in read_topic(broker.address, topic, "read_committed")]


def test_a_second_sink_fences_the_first(broker: InProcessBroker) -> None:
    topic, offsets = "fence.public.t", "fence-offsets"
    with AdminClient(broker.address) as admin:
        ensure_compacted_topic(admin, topic, 1)
        ensure_compacted_topic(admin, offsets, 1)
    first = TransactionalSink(
        broker.address, "fence", offsets, {}, lambda: 0, commit_interval_ms=3_600_000
    )
    try:
        first.write(_unit(topic, 1))
        first.flush(10_000)
        first.write(_unit(topic, 2))  # left open
        second = TransactionalSink(broker.address, "fence", offsets, {}, lambda: 0)
        try:
            with pytest.raises(CdcError, match="fenced"):
                first.flush(10_000)
            second.write(_unit(topic, 3))
            assert second.flush(10_000) == 1_003
        finally:
            second.close()
    finally:
        first.close()
    want = [b'{"n": 1}', b'{"n": 3}']
    eventually(lambda: _committed(broker, topic) == want, 30)  # the markers follow EndTxn
    assert _committed(broker, topic) == want
    stored = read_position(broker.address, offsets, "fence", {}, 10_000)
    assert stored is not None
    assert stored.position.lsn == 1_003


def test_a_refused_record_aborts_and_the_transaction_is_written_again(
    broker: InProcessBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A record the broker refuses (larger than the topic's ``max.message.bytes``) makes
    the open transaction abortable: the commit aborts it and writes its units again,
    backing off, until the refusal ends (the operator raises the limit); the aborted
    attempts are never visible read_committed and every unit is there once."""
    caplog.set_level(logging.WARNING, logger="tidelog.client.cdc.txn_sink")
    topic, offsets = "refused.public.t", "refused-offsets"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1, {"cleanup.policy": "compact", "max.message.bytes": "512"})
        ensure_compacted_topic(admin, offsets, 1)
    sink = TransactionalSink(
        broker.address, "refused", offsets, {}, lambda: 0, commit_interval_ms=3_600_000
    )
    big = ChangeRecord(topic, b'{"id": 2}', b"x" * 2_000)
    results: list[object] = []
    try:
        sink.write(_unit(topic, 1))
        sink.write(ChangeUnit((big,), Position(1_002, True, 0)))
        committer = threading.Thread(target=lambda: results.append(sink.flush(60_000)))
        committer.start()
        eventually(lambda: caplog.text.count("writing it again") >= 2, 30)
        assert not results  # not committed while the record is refused
        with AdminClient(broker.address) as admin:
            admin.alter_topic_config(topic, {"max.message.bytes": "1048588"})
        committer.join(60)
        assert results == [1_002]
    finally:
        sink.close()
    want = [b'{"n": 1}', b"x" * 2_000]
    eventually(lambda: _committed(broker, topic) == want, 30)  # the markers follow EndTxn
    assert _committed(broker, topic) == want
