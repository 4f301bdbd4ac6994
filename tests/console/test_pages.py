"""Every route of the web console against a real broker: pages, forms, CSRF, charts."""

from __future__ import annotations

import html
import json
import re
import time

import pytest
from starlette.testclient import TestClient

from tests.console.conftest import csrf_token, unique
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer, TopicPartition
from tidelog.client.admin import AdminClient
from tidelog.storage.errors import UnknownTopicOrPartitionError

pytestmark = pytest.mark.timeout(120)


def _text(page: str) -> str:
    """The page's text without tags, entities decoded, whitespace squeezed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def stat(page: str, element_id: str) -> str:
    """The text of the element with that id (a figure of the page)."""
    found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', page)
    assert found, f"no #{element_id}"
    return found.group(1).strip()


def test_overview_shows_the_broker_and_totals(
    web: TestClient, admin: AdminClient, broker: InProcessBroker
) -> None:
    admin.create_topic(unique("overview"), 3)
    page = web.get("/")
    assert page.status_code == 200
    text = _text(page.text)
    assert "Brokers" in text
    row = re.search(r'<tr data-broker="0">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    assert broker.address in row.group(1)
    assert "controller" in row.group(1)
    assert ">up<" in row.group(1)
    assert int(stat(page.text, "total-partitions")) >= 3
    assert stat(page.text, "total-offline") == "0"
    assert stat(page.text, "brokers-up") == "1 / 1"
    # Security headers, and the session cookie is HttpOnly and SameSite=Strict.
    assert page.headers["x-frame-options"] == "DENY"
    assert "default-src 'self'" in page.headers["content-security-policy"]
    cookie = page.headers["set-cookie"]
    assert "httponly" in cookie.lower()
    assert "samesite=strict" in cookie.lower()


def test_create_topic_with_csrf_then_sort_and_filter(web: TestClient, admin: AdminClient) -> None:
    name = unique("created")
    token = csrf_token(web)
    answer = web.post(
        "/topics",
        data={
            "csrf_token": token,
            "name": name,
            "partitions": "4",
            "replication_factor": "",
            "config": "retention.ms=3600000\n",
        },
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/topics/{name}"
    described = admin.describe_topic(name)
    assert len(described.partitions) == 4
    assert described.config["retention.ms"] == "3600000"
    # A live refresh landing before the redirect's page (the old page's timer) leaves
    # the message for that page.
    refreshed = web.get(answer.headers["location"], headers={"X-Console-Live": "1"})
    assert refreshed.status_code == 200
    assert f"Created topic {name}." not in refreshed.text
    shown = web.get(answer.headers["location"])
    assert f"Created topic {name}." in shown.text
    assert f"Created topic {name}." not in web.get(answer.headers["location"]).text
    # The table: filtered by name, sorted by partitions descending (links work without JS).
    other = unique("created-small")
    admin.create_topic(other, 1)
    table = web.get("/topics", params={"q": "created", "sort": "partitions", "order": "desc"})
    names = re.findall(r'<tr data-topic="([^"]+)">', table.text)
    assert name in names
    assert other in names
    assert names.index(name) < names.index(other)
    assert all("created" in n for n in names)
    row = re.search(rf'<tr data-topic="{name}">(.*?)</tr>', table.text, re.S)
    assert row
    assert "1 h" in row.group(1)
    ascending = web.get("/topics", params={"q": "created", "sort": "partitions", "order": "asc"})
    names_up = re.findall(r'<tr data-topic="([^"]+)">', ascending.text)
    assert names_up.index(other) < names_up.index(name)
    assert 'aria-sort="ascending"' in ascending.text
    # A refusal from the broker comes back as a message, not a crash.
    again = web.post("/topics", data={"csrf_token": token, "name": name, "partitions": "1"})
    assert again.status_code == 303
    assert "TOPIC_ALREADY_EXISTS" in web.get("/topics").text


def test_every_form_refuses_a_missing_or_wrong_csrf_token(
    web: TestClient, admin: AdminClient
) -> None:
    name = unique("csrf")
    admin.create_topic(name, 1)
    csrf_token(web)  # the session exists: only the token is missing
    posts = {
        "/topics": {"name": unique("never")},
        f"/topics/{name}/produce": {"value": "x"},
        f"/topics/{name}/config": {"set": "retention.ms=1000"},
        f"/topics/{name}/delete": {"confirm_name": name},
        "/groups/g/reset": {"target": "earliest"},
        "/security/users": {"name": "u", "password": "p"},
        "/security/users/delete": {"name": "u"},
        "/security/acls": {"principal": "User:u", "operation": "READ"},
        "/security/acls/delete": {"principal": "User:u"},
        "/logout": {},
        "/login": {"username": "u", "password": "p"},
    }
    for path, data in posts.items():
        for token in (None, "forged-token"):
            form = dict(data) if token is None else {**data, "csrf_token": token}
            answer = web.post(path, data=form)
            assert answer.status_code == 403, (path, token, answer.status_code)
            assert "CSRF" in answer.text
    # Nothing happened.
    assert admin.describe_topic(name).config.get("retention.ms") != "1000"
    assert all(not t.name.startswith("never") for t in admin.list_topics())
    # Another session's token is no good either.
    other = TestClient(web.app, follow_redirects=False)  # a second browser, same console
    other_token = csrf_token(other)
    refused = web.post(f"/topics/{name}/delete", data={"csrf_token": other_token,
                                                       "confirm_name": name})  # fmt: skip
    assert refused.status_code == 403
    admin.describe_topic(name)  # still there


def test_produce_and_browse_records(web: TestClient, admin: AdminClient) -> None:
    name = unique("browse")
    admin.create_topic(name, 2)
    token = csrf_token(web)
    sent = web.post(
        f"/topics/{name}/produce",
        data={
            "csrf_token": token,
            "partition": "1",
            "key": "user-7",
            "value": '{"amount": 42, "currency": "EUR"}',
            "headers": "trace=abc-123\n",
        },
    )
    assert sent.status_code == 303
    assert sent.headers["location"].startswith(f"/topics/{name}?")
    page = web.get(sent.headers["location"])
    assert "Sent: partition 1, offset 0." in page.text
    row = re.search(r'<tr data-offset="0">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    cell = html.unescape(row.group(1))
    assert "user-7" in cell
    assert '"amount": 42' in cell  # pretty JSON
    assert "\n" in cell.split('"amount"')[0][-5:]  # indented over lines
    assert "trace" in cell
    assert "abc-123" in cell
    for label in ("timestamp", "sent", "received", "corrected"):
        assert f"<dt>{label}</dt>" in row.group(1)
    assert "Z</dd>" in row.group(1)  # the times are shown as UTC dates
    # Hex rendering, and binary bytes that are not UTF-8 show as hex in auto mode.
    hexed = web.get(f"/topics/{name}", params={"partition": 1, "offset": 0, "mode": "hex"})
    assert "7b 22 61 6d" in hexed.text  # '{"am'
    with Producer(admin.config.bootstrap_servers, acks=1) as producer:
        producer.send(name, value=b"\xff\xfe\x00", partition=0).result(timeout=10)
    binary = web.get(f"/topics/{name}", params={"partition": 0, "offset": 0})
    assert "ff fe 00" in binary.text
    # Partition 5 does not exist: said so, the page still renders.
    missing = web.get(f"/topics/{name}", params={"partition": 5})
    assert missing.status_code == 200
    assert "no partition 5" in missing.text


def test_record_browser_pages_forward_and_back_and_seeks_by_time(
    web: TestClient, admin: AdminClient
) -> None:
    name = unique("pages")
    admin.create_topic(name, 1)
    base_ms = 1_700_000_000_000
    with Producer(admin.config.bootstrap_servers, acks=1, linger_ms=0) as producer:
        for i in range(45):
            producer.send(name, value=f"record {i}".encode(), timestamp_ms=base_ms + i * 1000)
        producer.flush()
    # No offset: the last page (records 25..44).
    last = web.get(f"/topics/{name}")
    offsets = [int(o) for o in re.findall(r'<tr data-offset="(\d+)">', last.text)]
    assert offsets == list(range(25, 45))
    assert 'rel="next"' not in last.text
    older = re.search(r'<a rel="prev" href="([^"]+)"', last.text)
    assert older
    back = web.get(html.unescape(older.group(1)).split("#")[0])
    assert [int(o) for o in re.findall(r'<tr data-offset="(\d+)">', back.text)] == list(
        range(5, 25)
    )
    first = web.get(f"/topics/{name}", params={"offset": 0})
    assert [int(o) for o in re.findall(r'<tr data-offset="(\d+)">', first.text)] == list(range(20))
    newer = re.search(r'<a rel="next" href="([^"]+)"', first.text)
    assert newer
    forward = web.get(html.unescape(newer.group(1)).split("#")[0])
    assert re.findall(r'<tr data-offset="(\d+)">', forward.text)[0] == "20"
    assert 'rel="prev"' not in first.text
    # By time: the browser's datetime-local (UTC) of record 30's timestamp.
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((base_ms + 30_000) / 1000))
    by_time = web.get(f"/topics/{name}", params={"timestamp": at})
    assert re.findall(r'<tr data-offset="(\d+)">', by_time.text)[0] == "30"
    assert "record 30" in by_time.text
    # An offset past the end shows the (empty) end, not an error.
    past = web.get(f"/topics/{name}", params={"offset": 1000})
    assert "No records here." in past.text


def test_edit_configs(web: TestClient, admin: AdminClient) -> None:
    name = unique("configs")
    admin.create_topic(name, 1, {"retention.ms": "60000"})
    token = csrf_token(web)
    changed = web.post(
        f"/topics/{name}/config",
        data={"csrf_token": token, "set": "segment.bytes=1048576\n", "delete": "retention.ms"},
    )
    assert changed.status_code == 303
    config = admin.describe_topic(name).config
    assert config["segment.bytes"] == "1048576"
    assert config["retention.ms"] != "60000"
    assert "Configs changed." in web.get(f"/topics/{name}").text
    bad = web.post(f"/topics/{name}/config", data={"csrf_token": token, "set": "nonsense"})
    assert bad.status_code == 303
    assert "Configs not changed" in web.get(f"/topics/{name}").text


def test_delete_topic_asks_for_confirmation(web: TestClient, admin: AdminClient) -> None:
    name = unique("doomed")
    admin.create_topic(name, 2)
    confirm = web.get(f"/topics/{name}/delete")
    assert confirm.status_code == 200
    assert "cannot be undone" in confirm.text
    assert 'name="confirm_name"' in confirm.text
    token = csrf_token(web, f"/topics/{name}/delete")
    wrong = web.post(f"/topics/{name}/delete", data={"csrf_token": token, "confirm_name": "x"})
    assert wrong.status_code == 303
    assert wrong.headers["location"] == f"/topics/{name}/delete"
    admin.describe_topic(name)  # still there
    done = web.post(f"/topics/{name}/delete", data={"csrf_token": token, "confirm_name": name})
    assert done.status_code == 303
    assert done.headers["location"] == "/topics"
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topic(name)
    assert f"Deleted topic {name}." in web.get("/topics").text
    # The topic's page is now a 404 page, not a traceback.
    gone = web.get(f"/topics/{name}")
    assert gone.status_code == 404
    assert "UNKNOWN_TOPIC_OR_PARTITION" in gone.text


def test_groups_lag_and_reset_only_when_empty(web: TestClient, admin: AdminClient) -> None:
    name = unique("grouped")
    group = unique("billing")
    admin.create_topic(name, 2)
    with Producer(admin.config.bootstrap_servers, acks=1) as producer:
        for i in range(10):
            producer.send(name, value=b"v", partition=i % 2)
        producer.flush()
    member = Consumer(
        admin.config.bootstrap_servers,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        heartbeat_interval_ms=200,
    )
    try:
        member.subscribe([name])
        got = 0
        deadline = time.monotonic() + 30
        while got < 4 and time.monotonic() < deadline:
            got += len(member.poll(timeout_ms=200, max_records=2))
        member.commit({TopicPartition(name, 0): 2, TopicPartition(name, 1): 2})
        listing = web.get("/groups")
        assert f'<tr data-group="{group}">' in listing.text
        page = web.get(f"/groups/{group}")
        assert page.status_code == 200
        assert stat(page.text, "group-members") == "1"
        assert stat(page.text, "total-lag") == "6"
        time.sleep(0.6)  # the lag chart keeps one sample per half second
        lag_rows = re.findall(r'<tr data-tp="([^"]+)">(.*?)</tr>', page.text, re.S)
        assert {tp for tp, _ in lag_rows} == {f"{name}-0", f"{name}-1"}
        assert "disabled" in page.text  # the reset form, while it has members
        # The confirmation refuses, and so does a POST made anyway.
        confirm = web.get(f"/groups/{group}/reset", params={"target": "earliest"})
        assert confirm.status_code == 303
        assert "the group has members" in web.get(f"/groups/{group}").text
        token = csrf_token(web)
        refused = web.post(
            f"/groups/{group}/reset", data={"csrf_token": token, "target": "earliest"}
        )
        assert refused.status_code == 303
        assert "NON_EMPTY_GROUP" in web.get(f"/groups/{group}").text
        assert admin.list_group_offsets(group)[TopicPartition(name, 0)] == 2
    finally:
        member.close(autocommit=False)
    deadline = time.monotonic() + 30
    while admin.describe_group(group).members and time.monotonic() < deadline:
        time.sleep(0.1)
    # Empty now: review, then reset to an offset of one topic.
    confirm = web.get(
        f"/groups/{group}/reset", params={"target": "offset", "offset": "4", "topic": name}
    )
    assert confirm.status_code == 200
    assert "Reset offsets" in confirm.text
    token = csrf_token(web, f"/groups/{group}/reset?target=offset&offset=4&topic={name}")
    done = web.post(
        f"/groups/{group}/reset",
        data={"csrf_token": token, "target": "offset", "offset": "4", "topic": name},
    )
    assert done.status_code == 303
    assert admin.list_group_offsets(group) == {
        TopicPartition(name, 0): 4,
        TopicPartition(name, 1): 4,
    }
    assert "Reset 2 partition(s)" in web.get(f"/groups/{group}").text
    latest = web.post(
        f"/groups/{group}/reset", data={"csrf_token": token, "target": "latest", "topic": ""}
    )
    assert latest.status_code == 303
    assert set(admin.list_group_offsets(group).values()) == {5}
    assert stat(web.get(f"/groups/{group}").text, "total-lag") == "0"
    # To a time: the first record at or after it (time 0: the log start).
    at_epoch = {"target": "timestamp", "timestamp": "1970-01-01T00:00:00"}
    confirm = web.get(f"/groups/{group}/reset", params=at_epoch)
    assert confirm.status_code == 200
    assert "1970-01-01 00:00:00.000Z" in confirm.text
    by_time = web.post(
        f"/groups/{group}/reset",
        data={"csrf_token": token, "target": "timestamp", "timestamp": "0"},
    )
    assert by_time.status_code == 303
    assert set(admin.list_group_offsets(group).values()) == {0}
    # The lag chart has the samples the pages took.
    chart = web.get(f"/api/charts/groups/{group}").json()
    values = [v for _, v in chart["series"][0]["points"]]
    assert 6 in values
    assert 0 in values
    # Bad input is said, not crashed on.
    bad = web.get(f"/groups/{group}/reset", params={"target": "offset"})
    assert bad.status_code == 303
    assert "give the offset" in web.get(f"/groups/{group}").text
    unknown = web.get("/groups/no-such-group")
    assert unknown.status_code == 404


def test_overview_chart_reports_the_produce_rate(web: TestClient, admin: AdminClient) -> None:
    name = unique("rate")
    admin.create_topic(name, 1)
    web.get("/")
    time.sleep(0.6)
    with Producer(admin.config.bootstrap_servers, acks=1) as producer:
        for _ in range(50):
            producer.send(name, value=b"x")
        producer.flush()
    # Charts sample at most every half second; on a loaded machine a look at every topic
    # may take longer: wait (bounded) for a sample after the records to show the rate.
    deadline = time.monotonic() + 20
    while True:
        time.sleep(0.6)
        web.get("/")
        chart = web.get("/api/charts/overview").json()
        names = [s["name"] for s in chart["series"]]
        assert names == ["produced/s", "consumed/s"]
        rates = [v for _, v in chart["series"][0]["points"] if v]
        if rates or time.monotonic() > deadline:
            break
    assert rates, chart
    assert max(rates) > 0
    row = re.search(rf'<tr data-topic="{name}">(.*?)</tr>', web.get("/topics").text, re.S)
    assert row
    assert "/s" in row.group(1)


def test_security_page_without_security(web: TestClient) -> None:
    page = web.get("/security")
    assert page.status_code == 200
    assert "No authorizer on this cluster" in page.text


def test_static_assets_health_and_login_redirects(web: TestClient) -> None:
    script = web.get("/static/uplot/uPlot.iife.min.js")
    assert script.status_code == 200
    assert "uPlot" in script.text
    assert web.get("/static/console.js").status_code == 200
    assert web.get("/static/console.css").status_code == 200
    assert web.get("/healthz").json() == {"status": "ok"}
    # No authentication: the login page leads back to the overview.
    assert web.get("/login").status_code == 303


def test_charts_json_is_plain_numbers(web: TestClient) -> None:
    web.get("/")
    answer = web.get("/api/charts/overview")
    assert answer.headers["content-type"].startswith("application/json")
    json.dumps(answer.json())  # serialisable, no NaN surprises
