"""A share group's configs over the gRPC listener (ConfigResource type GROUP):
``AdminClient.describe_configs`` / ``incremental_alter_configs`` with
``ConfigResource.group`` and ``tidelog configs describe|alter --group``, against a real
broker. The command line runs in this process (``client.cli.main``, output captured).

Proven: SET and DELETE land and are described back (source GROUP_CONFIG, the others
DEFAULT_CONFIG with the broker's value); a bad value, an unknown key, APPEND and an
internal dead-letter topic raise ``InvalidConfigError`` and change nothing;
``validate_only`` changes nothing; the CLI sets, shows and deletes them and exits
non-zero on an invalid one. (``tests/client/test_share_dead_letter.py`` sets its
dead-letter topics this way too, and proves they take effect.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, InvalidConfigError
from tidelog.client.cli import main
from tidelog.client.types import AlterConfigOp, ConfigResource

LIMIT = "share.delivery.count.limit"
DLQ = "errors.deadletterqueue.topic.name"


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings={"group.share.delivery.count.limit": 4}) as running:
        yield running


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_group_configs_with_the_admin_client(broker: InProcessBroker) -> None:
    resource = ConfigResource.group("admin-workers")
    with AdminClient(broker.address) as admin:
        before = admin.describe_configs(resource)
        assert (before[LIMIT].value, before[LIMIT].source) == ("4", "DEFAULT_CONFIG")
        assert [(s.name, s.value) for s in before[LIMIT].synonyms] == [
            ("group.share.delivery.count.limit", "4")
        ]
        admin.incremental_alter_configs(
            resource, [AlterConfigOp(LIMIT, "set", "3"), AlterConfigOp(DLQ, "set", "dead")]
        )
        after = admin.describe_configs(resource, [LIMIT, DLQ])
        assert set(after) == {LIMIT, DLQ}
        assert (after[LIMIT].value, after[LIMIT].source) == ("3", "GROUP_CONFIG")
        assert (after[DLQ].value, after[DLQ].source) == ("dead", "GROUP_CONFIG")

        for bad in (
            [AlterConfigOp(LIMIT, "set", "1")],  # below Kafka's 2
            [AlterConfigOp(DLQ, "set", "__share_group_state")],
            [AlterConfigOp("retention.ms", "set", "1")],
            [AlterConfigOp(DLQ, "append", "more")],
            [AlterConfigOp(LIMIT, "delete"), AlterConfigOp("share.isolation.level", "set", "x")],
        ):
            with pytest.raises(InvalidConfigError):
                admin.incremental_alter_configs(resource, bad)
        admin.incremental_alter_configs(
            resource, [AlterConfigOp(LIMIT, "set", "9")], validate_only=True
        )
        assert admin.describe_configs(resource, [LIMIT])[LIMIT].value == "3"

        admin.incremental_alter_configs(resource, [AlterConfigOp(DLQ, "delete")])
        assert admin.describe_configs(resource, [DLQ])[DLQ].source == "DEFAULT_CONFIG"
    shares = broker.server.core.shares
    assert shares is not None
    assert shares.share_groups.group_configs("admin-workers") == {LIMIT: "3"}


def test_group_configs_with_the_cli(
    broker: InProcessBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("--bootstrap", broker.address)
    status, _, err = cli(
        capsys,
        "configs",
        "alter",
        *common,
        "--group",
        "cli-workers",
        "--set",
        f"{DLQ}=cli-dead",
        "--set",
        f"{LIMIT}=2",
    )
    assert status == 0, err
    assert "group cli-workers" in err
    status, out, _ = cli(capsys, "configs", "describe", *common, "--group", "cli-workers")
    assert status == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line.strip()}
    assert rows[DLQ] == ["cli-dead", "GROUP_CONFIG"]
    assert rows[LIMIT] == ["2", "GROUP_CONFIG"]
    assert rows["share.record.lock.duration.ms"][1] == "DEFAULT_CONFIG"

    status, _, err = cli(
        capsys, "configs", "alter", *common, "--group", "cli-workers", "--set", f"{LIMIT}=99"
    )
    assert status != 0
    assert LIMIT in err
    status, _, _ = cli(
        capsys, "configs", "alter", *common, "--group", "cli-workers", "--delete", DLQ
    )
    assert status == 0
    shares = broker.server.core.shares
    assert shares is not None
    assert shares.share_groups.group_configs("cli-workers") == {LIMIT: "2"}
