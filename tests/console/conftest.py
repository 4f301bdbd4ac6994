"""Fixtures for the web console's tests: a real broker and the console in front of it.

Server-side tests drive the real ASGI application in-process with Starlette's
``TestClient`` (requests go through the routing, the session middleware, the CSRF checks
and the templates, and the console's clients talk gRPC to a real ``InProcessBroker`` on
127.0.0.1:0 with a temporary data directory). Each test works on topics and groups of its
own; the broker is shared per module.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tidelog.broker.testing import InProcessBroker
from tidelog.client.admin import AdminClient
from tidelog.client.console import ConsoleConfig, create_app

_names = itertools.count()
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker() as running:
        yield running


@pytest.fixture(scope="module")
def admin(broker: InProcessBroker) -> Iterator[AdminClient]:
    with AdminClient(broker.address, request_timeout_ms=10_000) as client:
        yield client


def console_client(bootstrap: str, **settings: object) -> TestClient:
    """A ``TestClient`` on a fresh console app (use it in a ``with`` block)."""
    config = ConsoleConfig(bootstrap_servers=bootstrap, **settings)  # type: ignore[arg-type]
    return TestClient(create_app(config), follow_redirects=False)


@pytest.fixture
def web(broker: InProcessBroker) -> Iterator[TestClient]:
    with console_client(broker.address, refresh_ms=1_000) as client:
        yield client


def csrf_token(client: TestClient, path: str = "/topics") -> str:
    """The CSRF token of the session, read from a page's form as a browser would."""
    page = client.get(path)
    assert page.status_code == 200, page.text
    found = _CSRF.search(page.text)
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def unique(prefix: str) -> str:
    """A name no other test uses."""
    return f"{prefix}-{next(_names)}"
