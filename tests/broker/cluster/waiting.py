"""Waiting for a cluster to reach a state: one bounded poll for every cluster test module."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from tidelog.storage.errors import TidelogError


def eventually(
    check: Callable[[], bool], timeout_s: float = 30.0, *, interval_s: float = 0.1
) -> None:
    """Poll ``check`` until it is true; fail after ``timeout_s``.

    A client error or an RPC error counts as "not yet": brokers restart and leaders move
    while these tests wait.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (TidelogError, grpc.RpcError):
            pass
        assert time.monotonic() < deadline, f"condition not reached in {timeout_s:.0f} s"
        time.sleep(interval_s)
