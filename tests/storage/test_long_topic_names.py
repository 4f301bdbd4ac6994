"""Topics with the longest valid name (249 characters) live and die like any other.

Regression (issue 15, found by ``tests/broker/hostile/test_fuzz.py``): deleting one
renamed its partition directory to ``<topic>-<p>.<uuid>-delete``, longer than a file name
may be (ENAMETOOLONG): the broker answered INTERNAL after the topic had left the
metadata, and its directories stayed behind for a topic of the same name to inherit.
"""

from __future__ import annotations

from pathlib import Path

from tests.storage.conftest import make_batch, read_values
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager

LONGEST = "t" * 249


def test_a_topic_with_the_longest_name_is_deleted_and_created_afresh(
    tmp_path: Path, clock: ManualClock
) -> None:
    data = tmp_path / "data"
    manager = LogManager.open(data, clock=clock)
    manager.create_topic(LONGEST, 12, {})
    manager.get_log(LONGEST, 11).append(make_batch([b"old"]))

    manager.delete_topic(LONGEST)

    assert sorted(p.name for p in data.iterdir() if p.is_dir()) == []
    manager.create_topic(LONGEST, 12, {})
    assert read_values(manager.get_log(LONGEST, 11)) == []
    manager.close()
    manager = LogManager.open(data, clock=clock)
    assert manager.topic(LONGEST).partitions == 12
    assert read_values(manager.get_log(LONGEST, 11)) == []
    manager.close()
