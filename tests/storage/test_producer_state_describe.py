"""ProducerStateTable.describe (what DescribeProducers reports) and producer expiration."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage.conftest import make_batch
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import InvalidConfigError
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.producer_state import ProducerStateTable, ProducerSummary
from tidelog.storage.records import BatchBuilder, BatchHeader, read_header


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


def test_idle_producers_are_forgotten_after_the_expiration(tmp_path: Path) -> None:
    clock = ManualClock()
    config = LogManagerConfig(producer_id_expiration_ms=60_000)
    manager = LogManager.open(tmp_path, config, clock)
    manager.create_topic("t", 1)
    log = manager.get_log("t", 0)
    log.append(make_batch([b"a"], producer_id=1, producer_epoch=0, base_sequence=0))
    clock.advance(30_000)
    log.append(make_batch([b"b"], producer_id=2, producer_epoch=0, base_sequence=0))
    clock.advance(30_000)  # producer 1 idle exactly 60 s: not yet
    assert manager.run_producer_expiration() == 0
    clock.advance(1)
    assert manager.run_producer_expiration() == 1
    assert [s.producer_id for s in log.describe_producers()] == [2]
    # Forgotten for good: the next snapshot (here, a clean restart) no longer has it.
    manager.close()
    clock.advance(30_000)
    manager = LogManager.open(tmp_path, config, clock)
    log = manager.get_log("t", 0)
    assert [s.producer_id for s in log.describe_producers()] == [2]
    assert manager.run_producer_expiration() == 1  # producer 2, idle 60 s + 1 ms by now
    assert log.describe_producers() == []
    # A forgotten producer writes again as a new one: its next batch starts at sequence 0.
    log.append(make_batch([b"c"], producer_id=1, producer_epoch=0, base_sequence=0))
    assert [s.producer_id for s in log.describe_producers()] == [1]
    manager.close()


def test_the_expiration_settings_are_validated() -> None:
    with pytest.raises(InvalidConfigError, match="producer_id_expiration_ms"):
        LogManagerConfig(producer_id_expiration_ms=0)
    with pytest.raises(InvalidConfigError, match="producer_id_expiration_check_interval_ms"):
        LogManagerConfig(producer_id_expiration_check_interval_ms=0)
