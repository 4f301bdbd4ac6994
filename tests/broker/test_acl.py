"""Kafka's ACL decision rule (``broker.core.acl``): examples from Kafka's documentation and
properties that must hold for any set of bindings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.core.acl import (
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    parse_principals,
)
from tidelog.storage.errors import InvalidRequestError

TOPIC = ResourceType.TOPIC


def acl(
    principal: str,
    operation: str,
    name: str,
    *,
    permission: str = "ALLOW",
    pattern: str = "LITERAL",
    host: str = "*",
    kind: str = "TOPIC",
) -> AclBinding:
    return AclBinding.parse(
        principal=principal,
        host=host,
        operation=operation,
        permission=permission,
        resource_type=kind,
        resource_name=name,
        pattern_type=pattern,
    )


def test_allow_deny_and_no_acl() -> None:
    authorizer = Authorizer(
        [
            acl("User:alice", "READ", "orders"),
            acl("User:*", "WRITE", "logs-", pattern="PREFIXED"),
            acl("User:mallory", "WRITE", "logs-audit", permission="DENY"),
        ]
    )
    allowed = authorizer.authorize
    assert allowed("User:alice", "1.2.3.4", Operation.READ, TOPIC, "orders")
    assert not allowed("User:alice", "1.2.3.4", Operation.WRITE, TOPIC, "orders")
    assert allowed("User:alice", "h", Operation.DESCRIBE, TOPIC, "orders")  # READ implies it
    assert not allowed("User:bob", "h", Operation.READ, TOPIC, "orders")
    assert allowed("User:bob", "h", Operation.WRITE, TOPIC, "logs-app")  # prefixed, User:*
    assert allowed("User:mallory", "h", Operation.WRITE, TOPIC, "logs-app")
    assert not allowed("User:mallory", "h", Operation.WRITE, TOPIC, "logs-audit")  # deny wins
    assert not allowed("User:alice", "h", Operation.READ, TOPIC, "unnamed")  # no ACL: refused
    assert not allowed(None, "h", Operation.READ, TOPIC, "orders")  # anonymous
    permissive = Authorizer(authorizer.bindings, allow_if_no_acl=True)
    assert permissive.authorize(None, "h", Operation.READ, TOPIC, "unnamed")
    assert not permissive.authorize("User:bob", "h", Operation.READ, TOPIC, "orders")


def test_hosts_super_users_and_cluster() -> None:
    authorizer = Authorizer(
        [
            acl("User:alice", "READ", "t", host="10.0.0.1"),
            acl("User:ops", "ALL", "kafka-cluster", kind="CLUSTER"),
        ],
        super_users=parse_principals("User:root; User:admin"),
    )
    assert authorizer.authorize("User:alice", "10.0.0.1", Operation.READ, TOPIC, "t")
    assert not authorizer.authorize("User:alice", "10.0.0.2", Operation.READ, TOPIC, "t")
    assert authorizer.authorize("User:admin", "x", Operation.DELETE, TOPIC, "anything")
    cluster = ResourceType.CLUSTER
    assert authorizer.authorize("User:ops", "x", Operation.ALTER, cluster, "kafka-cluster")
    assert not authorizer.authorize("User:alice", "x", Operation.ALTER, cluster, "kafka-cluster")


def test_idempotent_writers_need_write_on_some_topic() -> None:
    authorizer = Authorizer([acl("User:p", "WRITE", "t"), acl("User:q", "READ", "t")])
    assert authorizer.authorize_any("User:p", "h", Operation.WRITE, TOPIC)
    assert not authorizer.authorize_any("User:q", "h", Operation.WRITE, TOPIC)


def test_malformed_bindings_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="principal"):
        acl("alice", "READ", "t")
    with pytest.raises(InvalidRequestError, match="operation"):
        acl("User:a", "SHOUT", "t")
    with pytest.raises(InvalidRequestError, match="cluster"):
        acl("User:a", "ALTER", "other", kind="CLUSTER")
    with pytest.raises(InvalidRequestError, match="PREFIXED"):
        acl("User:a", "READ", "*", pattern="PREFIXED")


def test_filters_and_json_round_trip() -> None:
    bindings = [acl("User:a", "READ", "t"), acl("User:b", "WRITE", "t", permission="DENY")]
    authorizer = Authorizer(bindings)
    assert authorizer.matching(AclFilter(principal="User:b")) == [bindings[1]]
    assert authorizer.matching(AclFilter(permission=Permission.ALLOW)) == [bindings[0]]
    assert authorizer.matching(AclFilter(pattern_type=PatternType.PREFIXED)) == []
    assert [AclBinding.from_json(b.to_json()) for b in bindings] == bindings


principals = st.sampled_from(["User:a", "User:b", "User:*"])
operations = st.sampled_from(list(Operation))
names = st.sampled_from(["t", "t-1", "u", "*"])
bindings = st.builds(
    lambda p, o, n, perm, prefixed: AclBinding(
        p,
        "*",
        o,
        perm,
        TOPIC,
        n if not (prefixed and n == "*") else "t",
        PatternType.PREFIXED if prefixed else PatternType.LITERAL,
    ),
    principals,
    operations,
    names,
    st.sampled_from(list(Permission)),
    st.booleans(),
)


@given(
    st.lists(bindings, max_size=8),
    bindings,
    st.sampled_from(["User:a", "User:b"]),
    operations,
    st.sampled_from(["t", "t-1", "u"]),
)
def test_a_deny_never_allows_more(
    existing: list[AclBinding],
    extra: AclBinding,
    principal: str,
    operation: Operation,
    name: str,
) -> None:
    """Adding a DENY binding never turns a refusal into a permission; one that matches
    the request always refuses it, whatever else allows."""
    deny = AclBinding(
        extra.principal,
        extra.host,
        extra.operation,
        Permission.DENY,
        extra.resource_type,
        extra.resource_name,
        extra.pattern_type,
    )
    before = Authorizer(existing).authorize(principal, "h", operation, TOPIC, name)
    after = Authorizer([*existing, deny]).authorize(principal, "h", operation, TOPIC, name)
    assert after <= before
    if (
        deny.matches_resource(TOPIC, name)
        and deny.principal in (principal, "User:*")
        and deny.operation in (operation, Operation.ALL)
    ):
        assert not after


@given(st.lists(bindings, max_size=8), operations, st.sampled_from(["t", "u"]))
def test_super_users_may_do_anything(
    existing: list[AclBinding], operation: Operation, name: str
) -> None:
    authorizer = Authorizer(existing, super_users=frozenset({"User:a"}))
    assert authorizer.authorize("User:a", "h", operation, TOPIC, name)
