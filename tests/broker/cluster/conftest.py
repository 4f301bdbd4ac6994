"""A real ZooKeeper per test module (``broker.cluster.testing``), started in about a second.

Missing ZooKeeper (``libzookeeper-java``) fails the tests in CI, where ``.ci/run``
installs it, and skips them elsewhere with the command that installs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from broker.cluster.testing import ZooKeeperServer, zookeeper_available


def require_zookeeper() -> None:
    if zookeeper_available():
        return
    message = "ZooKeeper is not installed (apt-get install libzookeeper-java, or `make venv`)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    require_zookeeper()
    with ZooKeeperServer() as server:
        yield server
