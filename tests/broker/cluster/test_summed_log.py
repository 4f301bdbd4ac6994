"""``SummedLog``: a batch's per-partition lines, one by one when few, summed up when many."""

from __future__ import annotations

import logging

import pytest

from tidelog.broker.cluster.summed_log import SummedLog

LOGGER = "tests.summed_log"


def test_few_lines_are_logged_each_and_many_are_summed_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = SummedLog(logging.getLogger(LOGGER), limit=3)
    for p in range(3):
        lines.add("few", f"t-{p}: few")
    for p in range(5):
        lines.add("many", f"t-{p}: many")
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        lines.flush()
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert info == [
        "t-0: few",
        "t-1: few",
        "t-2: few",
        "many: 5 partition(s): t-0: many; t-1: many; t-2: many; ...",
    ]
    assert debug == [f"t-{p}: many" for p in range(5)]
    caplog.clear()
    lines.flush()  # flushed lines are gone
    assert caplog.records == []
