"""ProducePipeline: answers in request order, errors end the stream, reader stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from broker.produce_stream import ProducePipeline


def test_answers_in_order_with_appends_running_ahead() -> None:
    appended: list[int] = []
    first_complete_started = threading.Event()
    release = threading.Event()

    def append(n: int) -> int:
        appended.append(n)
        return n

    def complete(n: int) -> str:
        if n == 0:
            first_complete_started.set()
            # While request 0 "fsyncs", the reader keeps appending the next ones.
            assert release.wait(5)
        return f"answer-{n}"

    pipeline = ProducePipeline(iter(range(5)), append, complete, lambda: True, depth=8)
    answers = pipeline.responses()
    consumer: list[str] = []
    thread = threading.Thread(target=lambda: consumer.extend(answers))
    thread.start()
    assert first_complete_started.wait(5)
    deadline = time.monotonic() + 5
    while len(appended) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert appended == [0, 1, 2, 3, 4]  # all appended before the first answer left
    release.set()
    thread.join(5)
    assert consumer == [f"answer-{n}" for n in range(5)]


def test_an_append_error_ends_the_stream_after_the_earlier_answers() -> None:
    def append(n: int) -> int:
        if n == 2:
            raise ValueError("bad request 2")
        return n

    pipeline = ProducePipeline(iter(range(5)), append, str, lambda: True)
    got: list[str] = []
    with pytest.raises(ValueError, match="bad request 2"):
        got.extend(pipeline.responses())
    assert got == ["0", "1"]


def test_a_broken_request_iterator_ends_the_stream_quietly() -> None:
    def requests() -> Iterator[int]:
        yield 1
        raise RuntimeError("transport cancelled")

    pipeline = ProducePipeline(requests(), lambda n: n, str, lambda: True)
    assert list(pipeline.responses()) == ["1"]


def test_an_inactive_call_stops_waiting() -> None:
    blocked = threading.Event()

    def requests() -> Iterator[int]:
        blocked.wait(10)  # a client that never sends
        yield 1

    pipeline = ProducePipeline(requests(), lambda n: n, str, lambda: False, join_timeout_s=0.1)
    started = time.monotonic()
    assert list(pipeline.responses()) == []
    assert time.monotonic() - started < 5
    blocked.set()
