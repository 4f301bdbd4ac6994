"""ProducerStateTable.describe: what DescribeProducers reports for a partition."""

from __future__ import annotations

from storage.producer_state import ProducerStateTable, ProducerSummary
from storage.records import BatchBuilder, BatchHeader, read_header


def _header(
    producer_id: int, epoch: int, base_sequence: int, count: int, base_offset: int
) -> BatchHeader:
    builder = BatchBuilder(
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
    )
    for i in range(count):
        builder.append(1_000 + i, None, b"v")
    return read_header(builder.build())


def test_describe_reports_the_last_batch_of_each_producer() -> None:
    table = ProducerStateTable()
    assert table.describe() == []
    table.update(_header(7, 2, 0, 3, 10), 1_000)
    table.update(_header(7, 2, 3, 2, 13), 1_005)
    table.update(_header(9, 0, 0, 1, 15), 1_010)
    assert sorted(table.describe(), key=lambda s: s.producer_id) == [
        ProducerSummary(7, 2, 4, 1_005, 14),
        ProducerSummary(9, 0, 0, 1_010, 15),
    ]
    assert table.describe(9) == [ProducerSummary(9, 0, 0, 1_010, 15)]
    assert table.describe(8) == []
