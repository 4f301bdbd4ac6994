"""``SessionStore``: ids, CSRF tokens, logins and idle expiry (on a manual clock), with
real ``ClusterView``s on a real broker, whose clients must be closed when a session goes."""

from __future__ import annotations

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client.console.sessions import SessionStore
from tidelog.client.console.view import ClusterView
from tidelog.client.errors import ClosedError


def test_sessions_tokens_logins_and_expiry(broker: InProcessBroker) -> None:
    now = [0]
    store = SessionStore(None, idle_ms=1_000, clock_ms=lambda: now[0])
    first, created = store.get_or_create(None)
    assert created
    assert store.get_or_create(first.session_id) == (first, False)
    assert first.csrf_ok(first.csrf_token)
    assert not first.csrf_ok("forged")
    assert not first.csrf_ok(None)
    second, _ = store.get_or_create("unknown-id")  # a stale cookie gets a new session
    assert second.session_id != "unknown-id"
    assert second.csrf_token != first.csrf_token

    view = ClusterView(broker.address, {}, principal="alice")
    old_id, old_token = first.session_id, first.csrf_token
    store.log_in(first, view, "alice")
    assert first.principal == "alice"
    assert first.session_id != old_id  # no fixation
    assert not first.csrf_ok(old_token)
    assert store.get_or_create(old_id)[1]  # the old id is gone
    view.admin.list_topics()  # open while the session lives

    now[0] = 5_000  # idle: the session and its clients go
    fresh, created = store.get_or_create(first.session_id)
    assert created
    assert fresh.view is None
    with pytest.raises(ClosedError):
        view.admin.list_topics()


def test_without_authentication_sessions_share_one_view(broker: InProcessBroker) -> None:
    made: list[ClusterView] = []

    def make() -> ClusterView:
        made.append(ClusterView(broker.address, {}))
        return made[-1]

    store = SessionStore(make, idle_ms=60_000)
    a, _ = store.get_or_create(None)
    b, _ = store.get_or_create(None)
    assert a.view is b.view
    assert len(made) == 1
    store.log_out(a)
    made[0].admin.list_topics()  # shared: still open after one session leaves
    store.close()
    with pytest.raises(ClosedError):
        made[0].admin.list_topics()
