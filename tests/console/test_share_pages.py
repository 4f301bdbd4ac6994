"""The console's groups pages with a share group (issue #32): the listing gives each
group's type, and a share group's page its members and, per share partition, the start
and end offsets, lag, in-flight, available, acknowledged and archived counts, the
delivery-count histogram and the dead-lettered count (the same figures as
``tidelog groups describe``), as plain HTML."""

from __future__ import annotations

import html
import re

import pytest
from starlette.testclient import TestClient

from tests.broker.cluster.waiting import eventually
from tests.console.conftest import unique
from tidelog.client import Producer, ShareConsumer
from tidelog.client.admin import AdminClient
from tidelog.client.types import ConsumerRecord

pytestmark = pytest.mark.timeout(120)


def _cells(page: str, row_start: str) -> list[str]:
    """The text of each cell of the first table row starting with ``row_start``."""
    at = page.index(row_start)
    row = page[at : page.index("</tr>", at)]
    return [
        html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
        for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)
    ]


def test_a_share_group_on_the_groups_pages(web: TestClient, admin: AdminClient) -> None:
    name = unique("queued")
    group = unique("workers")
    admin.create_topic(name, 1)
    bootstrap = admin.config.bootstrap_servers
    member = ShareConsumer(
        bootstrap, group, acknowledgement_mode="explicit", client_id="console-share"
    )
    try:
        member.subscribe([name])
        eventually(lambda: bool(member.assignment()), 30)
        assert member.poll(timeout_ms=0) == []  # the share partition starts at the log end
        with Producer(bootstrap, acks=1) as producer:
            for _ in range(3):
                producer.send(name, value=b"job", partition=0)
            producer.flush()
        got: dict[int, ConsumerRecord] = {}

        def three() -> bool:
            got.update((r.offset, r) for r in member.poll(timeout_ms=200))
            return len(got) == 3

        eventually(three, 30, interval_s=0)
        member.acknowledge(got[0], "release")
        member.acknowledge(got[1], "reject")
        member.commit_sync()

        listing = web.get("/groups")
        assert listing.status_code == 200
        assert _cells(listing.text, f'<tr data-group="{group}">') == [group, "share", "Stable", "1"]
        page = web.get(f"/groups/{group}")
        assert page.status_code == 200, page.text
        assert "Share group" in page.text
        assert "console-share" in page.text
        # 0 available again, 1 archived, 2 in flight, each delivered once; lag 3 - 1.
        cells = _cells(page.text, f'<tr data-tp="{name}-0">')
        assert cells == [name, "0", "0", "3", "2", "1", "1", "0", "1", "1: 3", "0"]
    finally:
        member.close()
