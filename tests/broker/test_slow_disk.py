"""A slow disk never stalls the listener: reads wait for no fsync, and a loop that stops
turning anyway is reported with where it is stuck.

Against a real in-process broker. The slow disk is the one fault injected: ``os.fsync``
from the broker's storage threads waits until the test releases it (a loaded CI disk once
held an fsync for seconds, and every call on the listener waited with it).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, fetch, make_batch, produce_request
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

STUCK_S = 30.0  # how long a blocked fsync waits at most for the test to release it
ANSWER_S = 5.0  # a call that waits for the stuck fsync would take STUCK_S


@pytest.fixture
def stuck_disk(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """``(armed, entered)``: once ``armed`` is set, the next fsyncs on a storage thread
    (``tidelog-io``) wait until the fixture ends; ``entered`` says one is waiting."""
    armed = threading.Event()
    entered = threading.Event()
    release = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if armed.is_set() and threading.current_thread().name.startswith("tidelog-io"):
            entered.set()
            release.wait(STUCK_S)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        yield armed, entered
    finally:
        release.set()


def test_fetches_are_answered_while_a_roll_waits_for_the_disk(
    broker: InProcessBroker,
    stub: pb_grpc.BrokerStub,
    stuck_disk: tuple[threading.Event, threading.Event],
) -> None:
    armed, entered = stuck_disk
    create_topic(stub, "rolling", 1, **{"segment.bytes": "1024"})
    create_topic(stub, "elsewhere", 1)
    first = make_batch([b"x" * 600])
    assert (
        stub.Produce(produce_request("rolling", 0, first), timeout=TIMEOUT_S).results[0].error_code
        == ""
    )

    # This append fills the segment: the roll writes a producer snapshot and fsyncs under
    # the partition lock, and the disk holds that fsync.
    armed.set()
    rolling = stub.Produce.future(
        produce_request("rolling", 0, make_batch([b"y" * 600])), timeout=STUCK_S + 10
    )
    assert entered.wait(TIMEOUT_S), "the roll never reached an fsync"

    # Small fetches are read on the listener's loop: of the stuck partition and of another.
    stuck = fetch(stub, "rolling", 0, 0, timeout_s=ANSWER_S)
    assert stuck.error_code == ""
    assert stuck.records.startswith(first[:8])
    other = stub.Produce(produce_request("elsewhere", 0, make_batch([b"z"])), timeout=ANSWER_S)
    assert other.results[0].error_code == ""
    assert fetch(stub, "elsewhere", 0, 0, timeout_s=ANSWER_S).records
    assert not rolling.done(), "the roll did not wait for the disk: the test proved nothing"
    watchdog = broker.server.loop_watchdog
    assert watchdog is not None
    assert watchdog.stalls == 0

    armed.clear()


def test_a_loop_that_stops_turning_is_reported_with_its_stack(
    broker: InProcessBroker, stub: pb_grpc.BrokerStub, caplog: pytest.LogCaptureFixture
) -> None:
    watchdog = broker.server.loop_watchdog
    assert watchdog is not None
    loop = broker.server._listener._loop  # type: ignore[attr-defined]
    held = threading.Event()

    def hold_the_loop_for_a_while() -> None:
        held.set()
        time.sleep(3.5)

    with caplog.at_level(logging.INFO, logger="tidelog.broker.loop_watchdog"):
        loop.call_soon_threadsafe(hold_the_loop_for_a_while)
        assert held.wait(TIMEOUT_S)
        # A call made during the stall is answered after it, within its deadline.
        create_topic(stub, "after-the-stall", 1)
        deadline = time.monotonic() + TIMEOUT_S
        while "turns again" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "has not turned for" in warnings[0].getMessage()
    assert "hold_the_loop_for_a_while" in warnings[0].getMessage()
    assert "turns again after" in caplog.text
    assert watchdog.stalls == 1
    assert watchdog.longest_stall_s >= 2.0
    with pytest.raises(grpc.RpcError):  # the loop serves on: a normal error answer
        stub.DescribeTopic(pb.DescribeTopicRequest(name="never-made"), timeout=TIMEOUT_S)
