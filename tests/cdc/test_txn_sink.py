"""``TransactionalSink`` on its own against a real broker: a second sink with the same
name fences the first, whose open transaction never becomes visible and whose next
commit stops it with ``CdcError`` ("fenced"), not a retry (docs/cdc.md)."""

from __future__ import annotations

import pytest

from tests.cdc.topics import read_topic
from tidelog.broker.testing import InProcessBroker
from tidelog.client.admin import AdminClient
from tidelog.client.cdc import CdcError, ChangeRecord, ChangeUnit, Position, TransactionalSink
from tidelog.client.cdc.sink import ensure_compacted_topic, read_position

pytestmark = pytest.mark.timeout(60)


def _unit(topic: str, n: int) -> ChangeUnit:
    record = ChangeRecord(topic, f'{{"id": {n}}}'.encode(), f'{{"n": {n}}}'.encode())
    return ChangeUnit((record,), Position(1_000 + n, True, 0))


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
    values = [r.value for r in read_topic(broker.address, topic, "read_committed")]
    assert values == [b'{"n": 1}', b'{"n": 3}']
    stored = read_position(broker.address, offsets, "fence", {}, 10_000)
    assert stored is not None
    assert stored.position.lsn == 1_003
