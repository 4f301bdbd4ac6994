"""ProducerIdManager: unique ids across restarts, epoch bumps, fencing, damage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidelog.broker.core.producer_ids import MAX_PRODUCER_EPOCH, STATE_FILE_NAME, ProducerIdManager
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    InvalidProducerEpochError,
    InvalidRequestError,
    StorageError,
    UnknownProducerIdError,
)

DAY_MS = 86_400_000


def _open(path: Path, clock: ManualClock) -> ProducerIdManager:
    return ProducerIdManager.open(path, clock, DAY_MS)


def test_new_ids_are_unique_across_restarts(tmp_path: Path) -> None:
    clock = ManualClock()
    first = _open(tmp_path, clock)
    ids = [first.init(-1, -1) for _ in range(3)]
    assert ids == [(0, 0), (1, 0), (2, 0)]
    again = _open(tmp_path, clock)
    assert again.init(-1, -1) == (3, 0)


def test_reinit_bumps_the_epoch_and_fences_the_old_instance(tmp_path: Path) -> None:
    clock = ManualClock()
    manager = _open(tmp_path, clock)
    pid, epoch = manager.init(-1, -1)
    assert manager.init(pid, epoch) == (pid, 1)
    with pytest.raises(InvalidProducerEpochError, match="epoch 0 is not the current epoch 1"):
        manager.init(pid, 0)
    reopened = _open(tmp_path, clock)
    with pytest.raises(InvalidProducerEpochError):
        reopened.init(pid, 0)
    assert reopened.init(pid, 1) == (pid, 2)


def test_unknown_and_malformed_requests(tmp_path: Path) -> None:
    manager = _open(tmp_path, ManualClock())
    with pytest.raises(UnknownProducerIdError):
        manager.init(5, 0)
    for pid, epoch in [(-1, 0), (0, -1), (-2, -2), (0, MAX_PRODUCER_EPOCH + 1)]:
        with pytest.raises(InvalidRequestError):
            manager.init(pid, epoch)
    assert manager.next_producer_id == 0  # nothing was handed out


def test_expired_entries_trust_the_producer_and_are_dropped(tmp_path: Path) -> None:
    clock = ManualClock()
    manager = _open(tmp_path, clock)
    pid, _ = manager.init(-1, -1)
    manager.init(pid, 0)
    clock.advance(DAY_MS + 1)
    assert manager.init(pid, 7) == (pid, 8)  # the entry expired: the logs still fence
    manager.init(-1, -1)
    clock.advance(DAY_MS + 1)
    manager.init(-1, -1)
    state = json.loads((tmp_path / STATE_FILE_NAME).read_text())
    assert list(state["producers"]) == ["2"]  # older entries pruned at the last write


def test_exhausted_epoch_gets_a_fresh_id(tmp_path: Path) -> None:
    clock = ManualClock()
    manager = _open(tmp_path, clock)
    pid, _ = manager.init(-1, -1)
    state = json.loads((tmp_path / STATE_FILE_NAME).read_text())
    state["producers"][str(pid)] = [MAX_PRODUCER_EPOCH, clock.wall_ms()]
    (tmp_path / STATE_FILE_NAME).write_text(json.dumps(state))
    manager = _open(tmp_path, clock)
    assert manager.init(pid, MAX_PRODUCER_EPOCH) == (pid + 1, 0)


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b'{"version": 2, "next_producer_id": 1, "producers": {}}',
        b'{"version": 1, "producers": {}}',
        b'{"version": 1, "next_producer_id": 1, "producers": {"5": [0, 0]}}',
    ],
)
def test_damaged_state_refuses_to_start(tmp_path: Path, content: bytes) -> None:
    (tmp_path / STATE_FILE_NAME).write_bytes(content)
    with pytest.raises(StorageError):
        _open(tmp_path, ManualClock())
