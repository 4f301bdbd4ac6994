"""A real ZooKeeper per test module (``broker.cluster.testing``), started in about a second.

Missing ZooKeeper (``libzookeeper-java``) fails the tests in CI, where ``.ci/run``
installs it, and skips them elsewhere with the command that installs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tidelog.broker.cluster.testing import LocalCluster, ZooKeeperServer, zookeeper_available
from tidelog.client import AdminClient

_LOG_TAIL_CHARS = 6_000


def partition_leaders(admin: AdminClient, topic: str) -> dict[int, int]:
    """Each partition of ``topic`` -> its leader's id (-1: none), as ``admin`` sees it now."""
    return {p.partition: p.leader for p in admin.describe_topic(topic).partitions}


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a ``LocalCluster`` reports the end of every broker's log:
    the broker's side of a failure seen only in CI, where the directories are gone after."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for value in funcargs.values():
        if isinstance(value, LocalCluster):
            for broker_id in value.broker_ids:
                tail = value.output(broker_id)[-_LOG_TAIL_CHARS:]
                report.sections.append((f"broker {broker_id} log (end)", tail))
