"""Names in addresses: a consumer group id may hold any character (``/``, ``?``, ``#``,
spaces, non-ASCII), and its pages, links and forms must work for it; a topic name that
Kafka would refuse gets a clear 400/404 page, never a 500."""

from __future__ import annotations

import html
import re
import time
from urllib.parse import quote

import pytest
from starlette.testclient import TestClient

from tests.console.conftest import csrf_token, unique
from tidelog.client import Consumer, Producer, TopicPartition
from tidelog.client.admin import AdminClient

pytestmark = pytest.mark.timeout(120)

# Every character that breaks a naive path: a separator, a query, a fragment, a space, a
# percent sign, non-ASCII, and what HTML escapes.
AWKWARD = "team/a b?c#d%2F&<é>✓"


def _stat(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', page)
    assert found, element_id
    return found.group(1).strip()


def test_a_group_with_any_characters_shows_its_lag_and_resets(
    web: TestClient, admin: AdminClient
) -> None:
    topic = unique("awkward-topic")
    group = AWKWARD + unique("")
    admin.create_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    with Producer(admin.config.bootstrap_servers, acks=1) as producer:
        for i in range(8):
            producer.send(topic, value=f"v{i}".encode())
        producer.flush()
    member = Consumer(
        admin.config.bootstrap_servers,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        heartbeat_interval_ms=200,
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while tp not in member.assignment():
            assert time.monotonic() < deadline, "no assignment"
            member.poll(timeout_ms=100, max_records=1)
        member.commit({tp: 3})
        # The groups page links to it percent-encoded, whole.
        listing = web.get("/groups").text
        link = f"/groups/{quote(group, safe='')}"
        assert f'href="{link}"' in listing
        assert html.escape(group) in listing
        page = web.get(link)
        assert page.status_code == 200, page.text
        assert f"<code>{html.escape(group)}</code>" in page.text
        assert _stat(page.text, "total-lag") == "5"
        assert _stat(page.text, "group-members") == "1"
        assert f'data-chart="/api/charts/groups/{quote(group, safe="")}"' in page.text
        chart = web.get(f"/api/charts/groups/{quote(group, safe='')}").json()
        assert chart["series"][0]["name"] == f"lag of {group}"
        assert chart["series"][0]["points"][-1][1] == 5
    finally:
        member.close(autocommit=False)
    deadline = time.monotonic() + 30
    while admin.describe_group(group).members:
        assert time.monotonic() < deadline, "the member did not leave"
        time.sleep(0.1)

    # Reset through the confirmation page, following the page's own form addresses.
    page = web.get(link).text
    action = re.search(r'<form method="get" action="([^"]+)"', page)
    assert action
    assert html.unescape(action.group(1)) == f"{link}/reset"
    confirm = web.get(f"{link}/reset", params={"target": "earliest", "topic": topic})
    assert confirm.status_code == 200, confirm.text
    assert f'action="{link}/reset"' in confirm.text
    token = csrf_token(web, f"{link}/reset?target=earliest&topic={topic}")
    done = web.post(
        f"{link}/reset", data={"csrf_token": token, "target": "earliest", "topic": topic}
    )
    assert done.status_code == 303
    assert done.headers["location"] == link
    after = web.get(link).text
    assert "Reset 1 partition(s)" in after
    assert _stat(after, "total-lag") == "8"
    assert admin.list_group_offsets(group) == {tp: 0}


def test_group_addresses_that_name_no_group(web: TestClient) -> None:
    # An unknown id (with a "/" in it) is a page saying so, not an error of the server.
    missing = web.get(f"/groups/{quote('no/such group', safe='')}")
    assert missing.status_code in (200, 404)
    assert "Internal Server Error" not in missing.text
    assert web.get("/groups/some-group/nothing-here").status_code == 404
    broken = web.get("/groups/%FF%FE")  # not UTF-8
    assert broken.status_code == 400
    assert "not valid UTF-8" in broken.text


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/topics/bad%20name", 400),
        ("/topics/caf%C3%A9", 400),
        ("/topics/a%24b/delete", 400),
        ("/topics/" + "x" * 250, 400),
        ("/topics/%2E%2E", 400),  # ".." (clients normalise it unencoded)
        ("/topics/a%2Fb", 404),
        ("/topics/a/b/c", 404),
    ],
)
def test_an_illegal_topic_name_is_a_clear_page(web: TestClient, path: str, status: int) -> None:
    answer = web.get(path)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    assert "<h1>" in answer.text
    if status == 400:
        assert "is not a topic name" in answer.text


def test_posts_to_an_illegal_topic_name_are_refused_clearly(web: TestClient) -> None:
    token = csrf_token(web)
    answer = web.post("/topics/bad%20name/produce", data={"csrf_token": token, "value": "x"})
    assert answer.status_code == 400
    assert "is not a topic name" in answer.text
