"""The operation tables cover every API either listener serves (each has an operation
and a policy entry, each operation is reached), and no authorization decision is
written outside the policy table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tidelog.broker.core.operations import (
    GRPC_METHOD_OPERATIONS,
    KAFKA_API_VARIANTS,
    KAFKA_APIS,
    OPERATIONS,
)
from tidelog.broker.grpc.authorize import _RESOURCES
from tidelog.broker.kafka.handlers import HANDLERS
from tidelog.broker.kafka.versions import ADVERTISED
from tidelog.proto.tidelog.v1 import broker_pb2 as pb

pytestmark = pytest.mark.timeout(120)


def test_every_advertised_kafka_api_has_an_operation_and_a_policy() -> None:
    assert set(KAFKA_APIS) == set(ADVERTISED), "an advertised api key without an operation"
    assert set(HANDLERS) <= set(KAFKA_APIS)
    for key, (_, operation) in KAFKA_APIS.items():
        assert operation in OPERATIONS, f"api {key}: {operation} has no policy entry"


def test_every_grpc_method_has_an_operation_a_policy_and_its_resources() -> None:
    methods = set(pb.DESCRIPTOR.services_by_name["Broker"].methods_by_name)
    assert set(GRPC_METHOD_OPERATIONS) == methods, "a gRPC method without an operation"
    assert set(_RESOURCES) == methods, "a gRPC method without its resources"
    for method, operation in GRPC_METHOD_OPERATIONS.items():
        assert operation in OPERATIONS, f"{method}: {operation} has no policy entry"


def test_every_operation_is_reached_from_some_listener() -> None:
    reached = (
        set(GRPC_METHOD_OPERATIONS.values())
        | {op for _, op in KAFKA_APIS.values()}
        | {op for op, key in KAFKA_API_VARIANTS.items() if key in KAFKA_APIS}
    )
    assert reached == set(OPERATIONS)


def test_no_authorization_decision_is_written_outside_the_policy_table() -> None:
    """An ACL check written inline in a handler means the pipeline was bypassed (STYLE.md):
    only ``broker.core.operations`` asks the ACLs (``Acls.allowed``, ``allowed_any``,
    ``check``) or writes an ``authorization_denied`` audit line."""
    broker = Path(__file__).resolve().parents[3] / "broker"
    assert (broker / "core" / "operations.py").is_file(), broker  # the scan must see something
    allowed_here = {broker / "core" / "operations.py", broker / "core" / "acl_store.py"}
    offenders = []
    for path in sorted(broker.rglob("*.py")):
        if path in allowed_here:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            inline_check = (
                isinstance(node, ast.Attribute)
                and node.attr in ("allowed", "allowed_any", "check")
                and ast.unparse(node.value).endswith("acls")
            )
            denial = isinstance(node, ast.Constant) and node.value == "authorization_denied"
            if inline_check or denial:
                offenders.append(f"{path.relative_to(broker.parent)}:{getattr(node, 'lineno', 0)}")
    assert not offenders, f"authorization decided outside broker.core.operations: {offenders}"
