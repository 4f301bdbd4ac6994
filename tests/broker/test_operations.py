"""The one policy table (``broker.core.operations``) on its own: no socket, no listener. What
each operation needs, Kafka's two "or else" rules, whole-request refusals, and the audit
contract: one line per refused explicit resource, none for an allowed one or for an entry
a listing leaves out."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from tidelog.broker.core.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tidelog.broker.core.acl_store import Acls, LocalAclStore
from tidelog.broker.core.audit import AUDIT_LOGGER_NAME
from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.operations import authorize, cluster, group, topic, visible
from tidelog.storage.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)

ALICE = RequestContext("kafka", "ipv4:127.0.0.1:5000", "c", "User:alice")


def _acls(*grants: tuple[Operation, ResourceType, str]) -> Acls:
    acls = Acls(LocalAclStore.in_memory(), enabled=True)
    acls.create(
        [
            AclBinding("User:alice", "*", op, Permission.ALLOW, kind, name, PatternType.LITERAL)
            for op, kind, name in grants
        ]
    )
    return acls


@pytest.fixture
def audited() -> Iterator[list[dict[str, object]]]:
    lines: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = json.loads(record.getMessage())
            if line["event"] == "authorization_denied":  # not the ACLs' own creation
                lines.append(line)

    handler = Collect(logging.INFO)
    audit_log = logging.getLogger(AUDIT_LOGGER_NAME)
    old_level = audit_log.level
    audit_log.setLevel(logging.INFO)
    audit_log.addHandler(handler)
    try:
        yield lines
    finally:
        audit_log.removeHandler(handler)
        audit_log.setLevel(old_level)


def test_create_topics_is_allowed_by_the_topic_alone_without_a_cluster_audit_line(
    audited: list[dict[str, object]],
) -> None:
    acls = _acls((Operation.CREATE, ResourceType.TOPIC, "mine"))
    decided = authorize(acls, ALICE, "CreateTopics", "create_topics", [topic("mine")])
    assert decided == {topic("mine"): None}
    assert audited == []
    refused = authorize(acls, ALICE, "CreateTopics", "create_topics", [topic("theirs")])
    assert isinstance(refused[topic("theirs")], TopicAuthorizationFailedError)
    assert [(line["request"], line["operation"], line["resource_name"]) for line in audited] == [
        ("create_topics", "CREATE", "theirs")
    ]


def test_create_on_the_cluster_allows_every_topic() -> None:
    acls = _acls((Operation.CREATE, ResourceType.CLUSTER, "kafka-cluster"))
    decided = authorize(acls, ALICE, "CreateTopic", "create_topics", [topic("a"), topic("b")])
    assert decided == {topic("a"): None, topic("b"): None}


def test_init_producer_id_is_allowed_by_write_on_some_topic() -> None:
    assert authorize(
        _acls((Operation.WRITE, ResourceType.TOPIC, "t")),
        ALICE,
        "InitProducerId",
        "init_producer_id",
        [cluster()],
    ) == {cluster(): None}
    refused = authorize(_acls(), ALICE, "InitProducerId", "init_producer_id", [cluster()])
    assert isinstance(refused[cluster()], ClusterAuthorizationFailedError)


def test_each_refused_resource_is_audited_once_and_whole_stops_at_the_first(
    audited: list[dict[str, object]],
) -> None:
    acls = _acls((Operation.READ, ResourceType.TOPIC, "t"))
    names = [group("g"), topic("t"), topic("u"), topic("u")]
    decided = authorize(acls, ALICE, "OffsetCommit", "offset_commit", names)
    assert isinstance(decided[group("g")], GroupAuthorizationFailedError)
    assert decided[topic("t")] is None
    assert isinstance(decided[topic("u")], TopicAuthorizationFailedError)
    assert [line["resource_name"] for line in audited] == ["g", "u"]
    audited.clear()
    whole = authorize(acls, ALICE, "OffsetCommit", "offset_commit", names, whole=True)
    assert isinstance(whole[group("g")], GroupAuthorizationFailedError)
    assert whole[topic("u")] is None  # never decided
    assert [line["resource_name"] for line in audited] == ["g"]


def test_listings_are_filtered_silently(audited: list[dict[str, object]]) -> None:
    acls = _acls(
        (Operation.DESCRIBE, ResourceType.TOPIC, "seen"),
        (Operation.DESCRIBE, ResourceType.GROUP, "g1"),
    )
    assert visible(acls, ALICE, "metadata", ["hidden", "seen"]) == ["seen"]
    assert visible(acls, ALICE, "list_groups", ["g1", "g2"]) == ["g1"]
    assert audited == []
    # ListGroups: DESCRIBE on the cluster shows every group (Kafka's rule).
    everything = _acls((Operation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster"))
    assert visible(everything, ALICE, "list_groups", ["g1", "g2"]) == ["g1", "g2"]


def test_without_the_authorizer_everything_is_allowed_and_nothing_audited(
    audited: list[dict[str, object]],
) -> None:
    acls = Acls(LocalAclStore.in_memory(), enabled=False)
    assert authorize(acls, ALICE, "Produce", "produce", [topic("t")]) == {topic("t"): None}
    assert visible(acls, ALICE, "list_groups", ["g"]) == ["g"]
    assert audited == []


def test_a_resource_the_operation_does_not_name_is_a_listener_bug() -> None:
    with pytest.raises(ValueError, match="names no GROUP"):
        authorize(_acls(), ALICE, "Produce", "produce", [group("g")])
