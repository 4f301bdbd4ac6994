"""The failure message's view of a partition (``tests.faults.log_dump``), on a real log."""

from __future__ import annotations

from pathlib import Path

from tests.faults.log_dump import describe_partition
from tests.storage.conftest import make_batch, open_log
from tests.storage.txn_reader import txn_batch
from tidelog.storage.clock import ManualClock


def test_it_shows_values_markers_and_aborted_transactions_near_the_offsets(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "topic-0"
    log = open_log(directory, ManualClock())
    log.append(make_batch([b"plain"]))  # 0
    log.append(txn_batch(7, 3, 0, [b"a1", b"a2"]))  # 1-2
    log.append_marker(7, 3, False, 0)  # 3: ABORT
    log.append(txn_batch(7, 3, 2, [b"b1"]))  # 4
    log.append_marker(7, 3, True, 0)  # 5: COMMIT
    for i in range(60):
        log.append(make_batch([f"far{i}".encode()]))  # 6-65
    log.flush()
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    text = describe_partition(directory, [2], context=5)
    after = {p.name: p.read_bytes() for p in directory.iterdir()}
    log.close()
    assert "0-0 pid -1 epoch -1 seq -1: plain" in text
    assert "1-2 pid 7 epoch 3 seq 0 txn: a1 a2" in text
    assert "3-3 pid 7 epoch 3 seq -1 txn: ABORT marker, coordinator epoch 0" in text
    assert "5-5 pid 7 epoch 3 seq -1 txn: COMMIT marker" in text
    assert "aborted: pid 7 1-3" in text
    assert "far1 " not in text  # outside the context
    assert "far59" not in text
    assert after == before  # read through a copy: the live files stay as they were


def test_a_missing_directory_is_said_so(tmp_path: Path) -> None:
    assert "no such directory" in describe_partition(tmp_path / "gone-0", [1])
