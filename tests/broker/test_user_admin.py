"""``broker.core.user_admin``: Kafka's KIP-554 rules over a real credentials file (no
socket): per-user results, nothing of a refused user applied, the others applied, and
the stored credential verifying the password the client salted."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tidelog.broker.core.context import RequestContext
from tidelog.broker.core.scram import verify_password
from tidelog.broker.core.user_admin import UserAdmin, UserChange
from tidelog.broker.core.users import FileUserStore
from tidelog.storage.errors import InvalidRequestError, ResourceNotFoundError

CONTEXT = RequestContext("kafka", "127.0.0.1:1", principal="User:admin")
SALT = b"0123456789abcdef"


def _salted(password: str, mechanism: str = "SCRAM-SHA-512", iterations: int = 4096) -> bytes:
    digest = "sha512" if mechanism.endswith("512") else "sha256"
    return hashlib.pbkdf2_hmac(digest, password.encode(), SALT, iterations)


def _upsert(name: str, password: str, mechanism: str = "SCRAM-SHA-512", **kw: int) -> UserChange:
    iterations = kw.get("iterations", 4096)
    return UserChange(name, mechanism, iterations, SALT, _salted(password, mechanism, iterations))


def test_a_batch_applies_each_good_user_and_nothing_of_a_refused_one(tmp_path: Path) -> None:
    store = FileUserStore.open(tmp_path)
    admin = UserAdmin(store)
    results = admin.alter(
        [
            _upsert("ann", "ann-1"),
            _upsert("ann", "ann-1", "SCRAM-SHA-256"),
            _upsert("ben", "ben-1"),  # refused with its deletion below: nothing of ben
            UserChange("ben", "SCRAM-SHA-256"),
            _upsert("cat", "c", "SCRAM-SHA-1"),
            _upsert("dan", "d", iterations=16_385),
            _upsert("eve", "e"),
            _upsert("eve", "e2"),
            UserChange("", "SCRAM-SHA-256"),
        ],
        CONTEXT,
    )
    assert results == {
        "ann": ("", None),
        "ben": ("RESOURCE_NOT_FOUND", "Attempt to delete a user credential that does not exist"),
        "cat": ("UNSUPPORTED_SASL_MECHANISM", results["cat"][1]),
        "dan": ("UNACCEPTABLE_CREDENTIAL", results["dan"][1]),
        "eve": ("DUPLICATE_RESOURCE", results["eve"][1]),
        "": ("UNACCEPTABLE_CREDENTIAL", "Username must not be empty"),
    }
    # Written to the file: a new store over the same directory reads ann alone.
    again = FileUserStore.open(tmp_path)
    assert set(again.users()) == {"ann"}
    credential = again.get("ann", "SCRAM-SHA-512")
    assert credential is not None
    assert verify_password(credential, "ann-1")
    assert not verify_password(credential, "ann-2")


def test_describe_names_users_once_each(tmp_path: Path) -> None:
    admin = UserAdmin(FileUserStore.open(tmp_path))
    admin.alter([_upsert("ann", "a", iterations=8192)], CONTEXT)
    assert [(d.name, d.iterations, d.error) for d in admin.describe(None)] == [
        ("ann", {"SCRAM-SHA-512": 8192}, "")
    ]
    found = admin.describe(["ann", "zed", "ann"])
    assert [(d.name, d.error) for d in found] == [
        ("ann", "DUPLICATE_RESOURCE"),
        ("zed", "RESOURCE_NOT_FOUND"),
    ]


def test_the_grpc_calls_raise(tmp_path: Path) -> None:
    admin = UserAdmin(FileUserStore.open(tmp_path))
    with pytest.raises(InvalidRequestError, match="iterations"):
        admin.upsert(
            "ann", "scram-sha-256", salt=SALT, iterations=100, salted_password=b"x",
            context=CONTEXT,
        )  # fmt: skip
    with pytest.raises(InvalidRequestError, match="salt"):
        admin.upsert(
            "ann", "SCRAM-SHA-256", salt=b"short", iterations=4096, salted_password=b"x",
            context=CONTEXT,
        )  # fmt: skip
    with pytest.raises(ResourceNotFoundError):
        admin.delete("ann", None, context=CONTEXT)
    admin.upsert(
        "ann", "scram-sha-256", salt=SALT, iterations=4096,
        salted_password=_salted("a", "SCRAM-SHA-256"), context=CONTEXT,
    )  # fmt: skip
    assert admin.users() == {"ann": {"SCRAM-SHA-256": 4096}}
    admin.delete("ann", "scram-sha-256", context=CONTEXT)
    assert admin.users() == {}
