"""Growing a topic's partition count (``LogManager.create_partitions``): validation, the
crash-consistency order (metadata first, then directories), rollback of a failed growth,
and a hypothesis state machine of creates, growths, appends, clean restarts and crashes
against a plain model (topic -> list of partitions' values)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.storage.conftest import T0, crash, make_batch, read_values
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import (
    InvalidPartitionsError,
    InvalidRequestError,
    InvalidTopicError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.log_manager import MAX_PARTITIONS, TOPICS_FILE, LogManager


def _counts_on_disk(data: Path) -> dict[str, int]:
    document = json.loads((data / TOPICS_FILE).read_text())
    return {name: entry["partitions"] for name, entry in document["topics"].items()}


def _partition_dirs(data: Path) -> list[str]:
    return sorted(p.name for p in data.iterdir() if p.is_dir())


def test_grow_keeps_old_data_and_new_partitions_work_after_restart_and_crash(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 2, {"segment.bytes": "4096"})
    manager.get_log("t", 0).append(make_batch([b"old-0"]))
    manager.get_log("t", 1).append(make_batch([b"old-1"]))

    grown = manager.create_partitions("t", 5)

    assert (grown.partitions, manager.topic("t").partitions) == (5, 5)
    assert grown.overrides == {"segment.bytes": "4096"}
    assert _counts_on_disk(data) == {"t": 5}
    assert _partition_dirs(data) == [f"t-{p}" for p in range(5)]
    for p in range(2, 5):
        new_log = manager.get_log("t", p)
        assert (new_log.log_start_offset, new_log.log_end_offset) == (0, 0)
        assert new_log.config.segment_bytes == 4096
        new_log.append(make_batch([f"new-{p}".encode()]))
    manager.get_log("t", 4).flush()
    manager.close()

    manager = LogManager.open(data, clock=clock)
    assert manager.topic("t").partitions == 5
    assert [read_values(manager.get_log("t", p)) for p in range(5)] == [
        [b"old-0"],
        [b"old-1"],
        [b"new-2"],
        [b"new-3"],
        [b"new-4"],
    ]
    manager.create_partitions("t", 6)
    manager.get_log("t", 5).append(make_batch([b"new-5"]))
    manager.get_log("t", 5).flush()  # acknowledged with acks=all
    crash(data)

    manager = LogManager.open(data, clock=clock)
    assert manager.topic("t").partitions == 6
    assert read_values(manager.get_log("t", 5)) == [b"new-5"]
    manager.close()


def test_refusals_change_nothing(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 3)
    manager.create_topic("__offsets", 2, internal=True)
    before = (data / TOPICS_FILE).read_bytes()

    with pytest.raises(UnknownTopicOrPartitionError, match="unknown topic 'nope'"):
        manager.create_partitions("nope", 4)
    with pytest.raises(InvalidTopicError):
        manager.create_partitions("bad/name", 4)
    for count in (3, 2, 0, -1):
        with pytest.raises(InvalidPartitionsError, match="must be larger"):
            manager.create_partitions("t", count)
    with pytest.raises(InvalidPartitionsError, match=f"at most {MAX_PARTITIONS}"):
        manager.create_partitions("t", MAX_PARTITIONS + 1)
    for not_an_int in (True, 4.0, "4"):
        with pytest.raises(InvalidPartitionsError, match="must be an int"):
            manager.create_partitions("t", not_an_int)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="internal topic"):
        manager.create_partitions("__offsets", 3)

    assert (data / TOPICS_FILE).read_bytes() == before
    assert manager.topic("t").partitions == 3
    assert _partition_dirs(data) == ["__offsets-0", "__offsets-1", "t-0", "t-1", "t-2"]
    manager.close()


def test_validate_only_answers_the_new_count_and_changes_nothing(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1)
    assert manager.create_partitions("t", 4, validate_only=True).partitions == 4
    assert manager.topic("t").partitions == 1
    assert _counts_on_disk(data) == {"t": 1}
    assert _partition_dirs(data) == ["t-0"]
    with pytest.raises(InvalidPartitionsError):
        manager.create_partitions("t", 1, validate_only=True)
    manager.close()


def test_crash_after_the_metadata_before_the_directories(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The state a crash between the two steps leaves: topics.json says 4, only 2 exist.
    The next open creates the missing logs empty (as for a half-created topic)."""
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 2)
    manager.get_log("t", 1).append(make_batch([b"kept"]))
    manager.get_log("t", 1).flush()
    manager.create_partitions("t", 4)
    crash(data)
    for p in (2, 3):
        shutil.rmtree(data / f"t-{p}")

    manager = LogManager.open(data, clock=clock)
    assert manager.topic("t").partitions == 4
    assert [manager.get_log("t", p).log_end_offset for p in range(4)] == [0, 1, 0, 0]
    assert read_values(manager.get_log("t", 1)) == [b"kept"]
    assert _partition_dirs(data) == [f"t-{p}" for p in range(4)]
    manager.close()


def test_failed_growth_is_rolled_back(tmp_path: Path, clock: ManualClock) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic("t", 1)
    manager.get_log("t", 0).append(make_batch([b"a"]))
    # An I/O failure at the third new partition: a file sits where its directory must go.
    (data / "t-3").write_bytes(b"in the way")
    with pytest.raises(StorageError):
        manager.create_partitions("t", 5)
    assert manager.topic("t").partitions == 1
    assert _counts_on_disk(data) == {"t": 1}
    assert _partition_dirs(data) == ["t-0"]
    with pytest.raises(UnknownTopicOrPartitionError, match="has no partition 1"):
        manager.get_log("t", 1)

    (data / "t-3").unlink()
    assert manager.create_partitions("t", 5).partitions == 5
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert manager.topic("t").partitions == 5
    assert read_values(manager.get_log("t", 0)) == [b"a"]
    manager.close()


def test_closed_manager_refuses(tmp_path: Path, clock: ManualClock) -> None:
    manager = LogManager.open(tmp_path / "data", clock=clock)
    manager.create_topic("t", 1)
    manager.close()
    with pytest.raises(StorageError, match="closed"):
        manager.create_partitions("t", 2)


# ---------------------------------------------------------------------- state machine

_TOPICS = ("a", "b", "c")


class GrowingTopicsMachine(RuleBasedStateMachine):
    """Topics as a dict of per-partition value lists; the manager must always agree.

    Appends are flushed (acks=all), so a crash loses nothing; every growth is durable
    once ``create_partitions`` returned.
    """

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tidelog-grow-"))
        self.data = self.root / "data"
        self.clock = ManualClock(T0)
        self.manager = LogManager.open(self.data, clock=self.clock)
        self.model: dict[str, list[list[bytes]]] = {}
        self.counter = 0

    def teardown(self) -> None:
        crash(self.root)
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(topic=st.sampled_from(_TOPICS), partitions=st.integers(1, 3))
    def create(self, topic: str, partitions: int) -> None:
        if topic in self.model:
            return
        self.manager.create_topic(topic, partitions)
        self.model[topic] = [[] for _ in range(partitions)]

    @rule(topic=st.sampled_from(_TOPICS), delta=st.integers(-2, 3), validate_only=st.booleans())
    def grow(self, topic: str, delta: int, validate_only: bool) -> None:
        if topic not in self.model:
            with pytest.raises(UnknownTopicOrPartitionError):
                self.manager.create_partitions(topic, 2, validate_only=validate_only)
            return
        count = len(self.model[topic]) + delta
        if delta <= 0:
            with pytest.raises(InvalidPartitionsError):
                self.manager.create_partitions(topic, count, validate_only=validate_only)
            return
        meta = self.manager.create_partitions(topic, count, validate_only=validate_only)
        assert meta.partitions == count
        if not validate_only:
            self.model[topic].extend([] for _ in range(delta))

    @rule(topic=st.sampled_from(_TOPICS), choice=st.integers(0, 100))
    def append(self, topic: str, choice: int) -> None:
        if topic not in self.model:
            return
        partition = choice % len(self.model[topic])
        self.counter += 1
        value = f"v{self.counter}".encode()
        plog = self.manager.get_log(topic, partition)
        plog.append(make_batch([value]))
        plog.flush()
        self.model[topic][partition].append(value)

    @rule()
    def restart(self) -> None:
        self.manager.close()
        self.manager = LogManager.open(self.data, clock=self.clock)

    @rule()
    def crash_and_recover(self) -> None:
        crash(self.data)
        self.manager = LogManager.open(self.data, clock=self.clock)

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert {t.name: t.partitions for t in self.manager.topics()} == {
            t: len(ps) for t, ps in self.model.items()
        }
        expected_dirs = sorted(f"{t}-{p}" for t, ps in self.model.items() for p in range(len(ps)))
        assert _partition_dirs(self.data) == expected_dirs
        for topic, partitions in self.model.items():
            for partition, expected in enumerate(partitions):
                assert read_values(self.manager.get_log(topic, partition)) == expected


GrowingTopicsMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_growing_topics_state_machine = GrowingTopicsMachine.TestCase
