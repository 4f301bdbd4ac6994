"""The console in front of a broker with SCRAM and ACLs: login, acting as the logged-in
user and no more, the security page read-only or not, and no secret in logs or URLs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.console.conftest import console_client, csrf_token, unique
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.client.acls import AclBinding
from tidelog.client.admin import AdminClient
from tidelog.client.console import ConsoleConfig, create_app
from tidelog.client.console.limits import Attempt, LoginLimiter

pytestmark = pytest.mark.timeout(120)

SECURITY = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    data_dir: Path = tmp_path_factory.mktemp("secured")
    users = FileUserStore.open(data_dir)
    users.upsert("root", credential_from_password("SCRAM-SHA-256", "root-secret"))
    users.upsert("viewer", credential_from_password("SCRAM-SHA-256", "viewer-secret"))
    settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "authorizer.enabled": "true",
        "super.users": "User:root",
    }
    with InProcessBroker(data_dir, settings=settings) as broker:
        with AdminClient(
            broker.address, sasl_plain_username="root", sasl_plain_password="root-secret",
            **SECURITY,
        ) as admin:  # fmt: skip
            admin.create_topic("visible", 1)
            admin.create_topic("hidden", 1)
            admin.create_acls(
                [
                    AclBinding("User:viewer", "DESCRIBE", "TOPIC", "visible"),
                    AclBinding("User:viewer", "READ", "TOPIC", "visible"),
                    AclBinding("User:viewer", "DESCRIBE", "CLUSTER", "kafka-cluster"),
                ]
            )
        yield broker


def log_in(client: TestClient, user: str, password: str, next_url: str = "/") -> int:
    token = csrf_token(client, "/login")
    answer = client.post(
        "/login",
        data={"csrf_token": token, "username": user, "password": password, "next": next_url},
    )
    return answer.status_code


def test_pages_ask_for_a_login_and_a_wrong_password_is_refused(
    secured: InProcessBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with console_client(secured.address, security=SECURITY) as web:
        for path in ("/", "/topics", "/topics/visible", "/groups", "/security"):
            answer = web.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/login?next=")
        assert web.get("/api/charts/overview").status_code == 401
        refused = web.post(
            "/login",
            data={
                "csrf_token": csrf_token(web, "/login"),
                "username": "viewer",
                "password": "wrong-secret",
            },
        )
        assert refused.status_code == 401
        assert "refused this user name and password" in refused.text
        assert "wrong-secret" not in refused.text
        assert web.get("/").status_code == 303  # still logged out
    assert "wrong-secret" not in caplog.text
    # The login form posts the password in the body, never in a URL.
    with console_client(secured.address, security=SECURITY) as web:
        form = web.get("/login").text
        assert 'method="post"' in form
        assert 'type="password"' in form


def test_the_console_acts_with_the_logged_in_users_permissions(
    secured: InProcessBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with console_client(secured.address, security=SECURITY) as web:
        before = web.cookies.get("tidelog_console")
        assert log_in(web, "viewer", "viewer-secret", "/topics") == 303
        # A new session id after the login (no fixation).
        assert web.cookies.get("tidelog_console") != before
        topics = web.get("/topics")
        assert topics.status_code == 200
        assert "Signed in as" in topics.text
        assert 'data-topic="visible"' in topics.text
        assert 'data-topic="hidden"' not in topics.text  # no DESCRIBE on it
        # Creating is refused by the broker, for this user.
        name = unique("by-viewer")
        web.post("/topics", data={"csrf_token": csrf_token(web), "name": name})
        assert "AUTHORIZATION_FAILED" in web.get("/topics").text
        security = web.get("/security")
        assert "Read-only" in security.text
        assert 'action="/security/users"' not in security.text
        assert "User:viewer" in security.text  # DESCRIBE on the cluster: ACLs listed
        # Logging out closes the session.
        token = csrf_token(web)
        assert web.post("/logout", data={"csrf_token": token}).status_code == 303
        assert web.get("/topics").status_code == 303
    assert "viewer-secret" not in caplog.text


def test_a_super_user_may_change_users_and_acls(secured: InProcessBroker) -> None:
    with console_client(secured.address, security=SECURITY) as web:
        assert log_in(web, "root", "root-secret") == 303
        page = web.get("/security")
        assert "You may change users and ACLs." in page.text
        token = csrf_token(web, "/security")
        user = unique("erin")
        added = web.post(
            "/security/users",
            data={
                "csrf_token": token,
                "name": user,
                "password": "erin-secret",
                "mechanism": "SCRAM-SHA-512",
            },
        )
        assert added.status_code == 303
        page = web.get("/security")
        assert f"Saved user {user}" in page.text
        assert "SCRAM-SHA-512 (4096)" in page.text
        assert "erin-secret" not in page.text
        acl = {
            "principal": f"User:{user}",
            "permission": "ALLOW",
            "operation": "WRITE",
            "resource_type": "TOPIC",
            "resource_name": "visible",
            "pattern_type": "LITERAL",
            "host": "*",
        }
        assert web.post("/security/acls", data={"csrf_token": token, **acl}).status_code == 303
        page = web.get("/security")
        assert "ACL added." in page.text
        assert f"User:{user}" in page.text
        removed = web.post("/security/acls/delete", data={"csrf_token": token, **acl})
        assert removed.status_code == 303
        assert "Removed 1 ACL(s)." in web.get("/security").text
        web.post("/security/users/delete", data={"csrf_token": token, "name": user})
        page = web.get("/security")
        assert f"Deleted user {user}." in page.text
        # And the new user could have logged in with its own password, in its own session.
        with console_client(secured.address, security=SECURITY) as other:
            assert log_in(other, user, "erin-secret") == 401  # deleted: refused


def test_the_login_returns_to_a_group_page_whose_id_has_a_slash(secured: InProcessBroker) -> None:
    with console_client(secured.address, security=SECURITY) as web:
        asked = web.get("/groups/a%2Fb%20c")
        assert asked.status_code == 303
        # The address as sent, percent-encoded once more for the query.
        assert asked.headers["location"] == "/login?next=/groups/a%252Fb%2520c"
        form = web.get(asked.headers["location"]).text
        assert 'name="next" value="/groups/a%2Fb%20c"' in form
        token = csrf_token(web, asked.headers["location"])
        back = web.post(
            "/login",
            data={
                "csrf_token": token,
                "username": "root",
                "password": "root-secret",
                "next": "/groups/a%2Fb%20c",
            },
        )
        assert back.headers["location"] == "/groups/a%2Fb%20c"


def _attempt(client: TestClient, password: str, user: str = "root") -> Any:
    return client.post(
        "/login",
        data={
            "csrf_token": csrf_token(client, "/login"),
            "username": user,
            "password": password,
        },
    )


def test_one_guessing_address_is_stopped_before_it_locks_everyone_out(tmp_path: Path) -> None:
    """The broker allows 5 failed logins per address a minute and sees every console user
    as the console's one address; the console allows each browser address 3."""
    users = FileUserStore.open(tmp_path)
    users.upsert("root", credential_from_password("SCRAM-SHA-256", "root-secret"))
    users.upsert("other", credential_from_password("SCRAM-SHA-256", "other-secret"))
    with InProcessBroker(tmp_path, settings={"security.protocol": "SASL_PLAINTEXT"}) as broker:
        app = create_app(ConsoleConfig(bootstrap_servers=broker.address, security=SECURITY))
        guesser = TestClient(app, follow_redirects=False, client=("198.51.100.7", 50_000))
        someone = TestClient(app, follow_redirects=False, client=("203.0.113.9", 50_001))
        with guesser:
            for guess in ("guess-1", "guess-2", "guess-3"):
                answer = _attempt(guesser, guess)
                assert answer.status_code == 401
                assert "refused this user name and password" in answer.text
            # Ten more guesses, and the right password too: refused by the console itself,
            # the broker is not asked (it would have locked its one address after 5).
            for guess in [f"guess-{n}" for n in range(4, 14)] + ["root-secret"]:
                answer = _attempt(guesser, guess)
                assert answer.status_code == 429
                assert "Too many failed logins from your address" in answer.text
                assert 1 <= int(answer.headers["Retry-After"]) <= 60
            assert guesser.get("/topics").status_code == 303  # not logged in
            # Another address logs in at once: the broker did not lock the console out.
            assert _attempt(someone, "root-secret").status_code == 303
            assert someone.get("/topics").status_code == 200
        # The control: a console without that limit lets five guesses through (the
        # broker forgot the earlier three at the successful login), the broker has its 5,
        # and then refuses every console user, right password or not.
        unlimited = create_app(
            ConsoleConfig(
                bootstrap_servers=broker.address, security=SECURITY, login_failures_max=1_000
            )
        )
        with (
            TestClient(unlimited, follow_redirects=False, client=("198.51.100.7", 1)) as bad,
            TestClient(unlimited, follow_redirects=False, client=("203.0.113.9", 2)) as good,
        ):
            guesses = [f"guess-{n}" for n in range(5)]
            assert [_attempt(bad, g).status_code for g in guesses] == [401] * 5
            locked = _attempt(good, "other-secret", user="other")
            assert locked.status_code == 401
            assert "refused this user name and password" in locked.text


def test_the_limiter_window_and_what_counts() -> None:
    now = [0]
    limiter = LoginLimiter(
        max_failures=2, window_ms=1_000, max_addresses=2, clock_ms=lambda: now[0]
    )
    first = limiter.begin("a")
    assert isinstance(first, Attempt)
    limiter.end(first, refused=True)
    second = limiter.begin("a")  # in flight: counted before the answer
    assert isinstance(second, Attempt)
    assert limiter.begin("a") == 1_000  # ms until the first failure leaves the window
    limiter.end(second, refused=False)  # logged in (or unreachable): taken back
    assert limiter.failures("a") == 1
    third = limiter.begin("a")
    assert isinstance(third, Attempt)
    limiter.end(third, refused=True)
    now[0] = 400
    assert limiter.begin("a") == 600
    now[0] = 1_000  # the first failure left the window
    assert isinstance(limiter.begin("a"), Attempt)
    # Bounded memory: the least recently failing address is forgotten first.
    limiter.begin("b")
    limiter.begin("c")
    assert limiter.failures("a") == 0
    assert limiter.failures("c") == 1
    with pytest.raises(ValueError, match="must be positive"):
        LoginLimiter(max_failures=0)
