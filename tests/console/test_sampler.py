"""The console's background sampler against a real broker: the charts have history of
traffic made while no page was open; one sampler per cluster connection (the shared one,
or one per logged-in session), stopped with the session or the application."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from tests.console.conftest import console_client, csrf_token, unique
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer, TopicPartition
from tidelog.client.admin import AdminClient
from tidelog.client.console.sampler import MAX_INTERVAL_MS, MIN_INTERVAL_MS, Sampler
from tidelog.client.console.sessions import SessionStore

pytestmark = pytest.mark.timeout(120)

SECURITY = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}


def _wait(condition: Any, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _store(web: TestClient) -> SessionStore:
    store: SessionStore = web.app.state.store  # type: ignore[attr-defined]
    return store


def _integral(points: list[list[float]]) -> float:
    """Sum of rate x step over a series' points: what the counter grew by."""
    return sum(v * (t - t0) for (t0, _), (t, v) in itertools.pairwise(points) if v)


def test_charts_cover_traffic_made_while_no_page_was_open(
    broker: InProcessBroker, admin: AdminClient
) -> None:
    topic, group = unique("unwatched"), unique("unwatched-readers")
    admin.create_topic(topic, 2)
    tp = TopicPartition(topic, 0)
    with console_client(broker.address, sample_interval_ms=MIN_INTERVAL_MS) as web:
        # No request at all: the sampler started with the application.
        store = _store(web)
        _wait(lambda: store.samplers() and store.samplers()[0].looks >= 2, "two looks")
        assert len(store) == 0  # nobody has opened a page
        began = time.time()
        with Producer(broker.address, acks=1) as producer:
            for _ in range(4):
                for i in range(50):
                    producer.send(topic, value=f"r{i}".encode(), partition=i % 2)
                producer.flush()
                time.sleep(0.5)
        with Consumer(broker.address, group_id=group, enable_auto_commit=False) as reader:
            reader.commit({tp: 30})  # 100 in partition 0: lag 70; 30 consumed
        ended = time.time()
        looks = store.samplers()[0].looks
        _wait(lambda: store.samplers()[0].looks >= looks + 2, "two more looks")

        chart = web.get("/api/charts/overview").json()
        produced, consumed = (s["points"] for s in chart["series"])
        # The series reach back over the whole time, before the first record ...
        assert produced[0][0] < began
        assert produced[-1][0] > ended
        assert len(produced) >= 5
        # ... and add up to what was produced and committed in it.
        assert _integral(produced) == pytest.approx(200, abs=0.5)
        assert _integral(consumed) == pytest.approx(30, abs=0.5)
        assert max(v for _, v in produced if v is not None) > 0

        lag = web.get(f"/api/charts/groups/{quote(group, safe='')}").json()["series"][0]
        assert lag["points"], "the group's lag was sampled without its page open"
        assert lag["points"][-1][1] == 70  # 100 in partition 0, 30 committed
    # The application stopped: so did its sampler.
    assert store.samplers() == []


def test_one_sampler_per_login_session_stopped_at_logout_and_expiry(tmp_path: Path) -> None:
    users = FileUserStore.open(tmp_path)
    users.upsert("root", credential_from_password("SCRAM-SHA-256", "root-secret"))
    settings = {"security.protocol": "SASL_PLAINTEXT"}
    with (
        InProcessBroker(tmp_path, settings=settings) as secured,
        console_client(
            secured.address, security=SECURITY, sample_interval_ms=MIN_INTERVAL_MS
        ) as web,
        console_client(
            secured.address,
            security=SECURITY,
            sample_interval_ms=MIN_INTERVAL_MS,
            session_idle_ms=2_000,
        ) as other,
    ):
        store = _store(web)
        assert store.samplers() == []  # with authentication: nothing before a login

        def log_in(client: TestClient) -> None:
            token = csrf_token(client, "/login")
            answer = client.post(
                "/login",
                data={"csrf_token": token, "username": "root", "password": "root-secret"},
            )
            assert answer.status_code == 303

        log_in(web)
        assert len(store.samplers()) == 1
        sampler = store.samplers()[0]
        _wait(lambda: sampler.looks >= 1, "the session's first look")
        assert web.get("/api/charts/overview").status_code == 200
        web.post("/logout", data={"csrf_token": csrf_token(web, "/topics")})
        assert not sampler.running
        assert store.samplers() == []

        # A session left idle is dropped by the housekeeping, request or not.
        log_in(other)
        other_store = _store(other)
        (idle,) = other_store.samplers()  # idle after 2 s; housekeeping looks every second
        _wait(lambda: not idle.running, "the idle session's sampler to stop", seconds=10)
        assert other_store.samplers() == []


def test_the_interval_is_bounded_and_errors_do_not_stop_it() -> None:
    assert Sampler(lambda: None, interval_ms=1, name="t").interval_ms == MIN_INTERVAL_MS
    assert Sampler(lambda: None, interval_ms=10**9, name="t").interval_ms == MAX_INTERVAL_MS
    calls: list[float] = []

    def failing() -> None:
        calls.append(time.monotonic())
        raise RuntimeError("the cluster is away")

    sampler = Sampler(failing, interval_ms=MIN_INTERVAL_MS, name="failing").start()
    try:
        _wait(lambda: len(calls) >= 2, "a second look after a failure", seconds=5)
    finally:
        sampler.stop()
    assert not sampler.running
    assert calls[1] - calls[0] >= MIN_INTERVAL_MS / 1000 - 0.05
