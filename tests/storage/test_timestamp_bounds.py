"""``message.timestamp.before.max.ms`` / ``message.timestamp.after.max.ms`` (KIP-937): a
CreateTime record further from the broker's clock than the topic allows is refused with
``INVALID_TIMESTAMP``, the whole batch, nothing stored; LogAppendTime topics and records
without a timestamp are not checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage.conftest import T0, log_config, make_batch, open_log, read_values, scratch_dir
from tidelog.storage.clock import ManualClock
from tidelog.storage.errors import InvalidTimestampError
from tidelog.storage.records import TimestampType


def test_records_outside_the_bounds_are_refused(tmp_path: Path) -> None:
    with scratch_dir(tmp_path) as directory:
        clock = ManualClock(T0)
        config = log_config(
            message_timestamp_before_max_ms=1_000, message_timestamp_after_max_ms=500
        )
        log = open_log(directory, clock, config)
        now = clock.wall_ms()
        log.append(make_batch([b"in"], timestamps=[now - 1_000]))
        log.append(make_batch([b"in too"], timestamps=[now + 500]))
        with pytest.raises(InvalidTimestampError, match="before"):
            # The first record is in bounds, a later one is not: the batch is refused.
            log.append(make_batch([b"x", b"y"], timestamps=[now, now - 1_001]))
        with pytest.raises(InvalidTimestampError, match="after"):
            log.append(make_batch([b"z"], timestamps=[now + 501]))
        assert read_values(log) == [b"in", b"in too"]
        assert log.log_end_offset == 2
        log.close()


def test_unbounded_by_default_and_not_for_log_append_time(tmp_path: Path) -> None:
    with scratch_dir(tmp_path) as directory:
        clock = ManualClock(T0)
        log = open_log(directory, clock, log_config())
        log.append(make_batch([b"old"], timestamps=[1]))  # the defaults bound nothing
        log.close()
    (tmp_path / "append-time").mkdir()
    with scratch_dir(tmp_path / "append-time") as directory:
        config = log_config(
            message_timestamp_type="LogAppendTime", message_timestamp_before_max_ms=10
        )
        log = open_log(directory, ManualClock(T0), config)
        log.append(make_batch([b"old"], timestamps=[1], timestamp_type=TimestampType.CREATE_TIME))
        assert read_values(log) == [b"old"]
        log.close()
