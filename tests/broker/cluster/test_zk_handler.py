"""``broker.cluster.zk_handler.PollingHandler``: kazoo's ``select`` contract on poll, for
the descriptors a broker with thousands of partitions has (above ``FD_SETSIZE``)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import pytest

from tidelog.broker.cluster.zk_handler import PollingHandler


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_ready_waits_out_the_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    started = time.monotonic()
    assert PollingHandler().select([a], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - started >= 0.045


def test_readable_and_writable_are_reported_as_given(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    handler = PollingHandler()
    assert handler.select([a], [a], [], 0) == ([], [a], [])
    b.sendall(b"x")
    assert handler.select([a, b], [a], [], 1.0) == ([a], [a], [])
    assert handler.select([a.fileno()], [], [], 1.0) == ([a.fileno()], [], [])


def test_a_closed_peer_is_readable(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    readable, _, _ = PollingHandler().select([a], [], [], 1.0)
    assert readable == [a]
    assert a.recv(1) == b""


def test_a_descriptor_above_fd_setsize_is_polled(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    high = os.dup2(a.fileno(), 1500)  # select.select refuses any descriptor >= 1024
    try:
        b.sendall(b"x")
        assert PollingHandler().select([high], [], [], 1.0) == ([high], [], [])
    finally:
        os.close(high)


def test_a_negative_timeout_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        PollingHandler().select([pair[0]], [], [], -1)
