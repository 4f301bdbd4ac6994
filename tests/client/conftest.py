"""Fixtures for the client tests.

Pure-engine tests need none. Integration tests share one real in-process broker
(``broker.testing.InProcessBroker`` on ``127.0.0.1:0`` with a temporary data directory)
per module, and each test works on topics of its own (``topic`` fixture), so they stay
independent without paying a broker start per test. Tests that stop or break the broker
start their own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client.admin import AdminClient

_names = itertools.count()


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker() as running:
        yield running


@pytest.fixture(scope="module")
def admin(broker: InProcessBroker) -> Iterator[AdminClient]:
    with AdminClient(broker.address, request_timeout_ms=10_000) as client:
        yield client


TopicFactory = Callable[..., str]


@pytest.fixture
def new_topic(admin: AdminClient, request: pytest.FixtureRequest) -> TopicFactory:
    """``new_topic(partitions=1, **config)``: create a fresh topic, return its name."""

    def create(partitions: int = 1, **config: object) -> str:
        base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:60]
        name = f"{base}-{next(_names)}"
        admin.create_topic(name, partitions, {k.replace("_", "."): v for k, v in config.items()})
        return name

    return create


@pytest.fixture
def topic(new_topic: TopicFactory) -> str:
    """A fresh one-partition topic."""
    return new_topic()
