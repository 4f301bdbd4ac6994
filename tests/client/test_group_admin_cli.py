"""Group administration: ``AdminClient`` and ``tidelog groups ...`` against a real broker.

The command line runs in this process (``client.cli.main``, output captured) where only
the output and the exit status matter, and as a subprocess for ``consume --group``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.cli import main
from tidelog.client.types import ConsumerRecord
from tidelog.storage.errors import (
    GroupIdNotFoundError,
    GroupNotEmptyError,
    GroupSubscribedToTopicError,
    UnknownTopicOrPartitionError,
)

ROOT = Path(__file__).resolve().parents[2]
GROUP_SETTINGS = {
    "group.consumer.heartbeat.interval.ms": 100,
    "group.consumer.min.session.timeout.ms": 500,
    "group.consumer.session.timeout.ms": 2_000,
}


@pytest.fixture(scope="module")
def group_broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings=GROUP_SETTINGS) as running:
        yield running


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def committed(admin: AdminClient, group: str) -> dict[int, int | None]:
    return {p.tp.partition: p.committed_offset for p in admin.describe_group(group).partitions}


def test_reset_offsets_with_the_admin_client(group_broker: InProcessBroker) -> None:
    address = group_broker.address
    with AdminClient(address) as admin, Producer(address, linger_ms=0) as producer:
        admin.create_topic("reset", 2)
        for i in range(10):
            producer.send("reset", b"x", partition=0, timestamp_ms=1_000 + i * 100).result()
            producer.send("reset", b"y", partition=1, timestamp_ms=1_000 + i * 100).result()
        consumer = Consumer(address, group_id="resetters", enable_auto_commit=False)
        consumer.subscribe("reset")
        deadline = time.monotonic() + 10
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline
            consumer.poll(20)
        consumer.commit({TopicPartition("reset", 0): 4, TopicPartition("reset", 1): 6})
        with pytest.raises(GroupNotEmptyError):
            admin.reset_group_offsets("resetters", "reset", to_earliest=True)
        consumer.close()
        assert committed(admin, "resetters") == {0: 4, 1: 6}

        assert admin.reset_group_offsets("resetters", "reset", to_earliest=True) == {
            TopicPartition("reset", 0): 0,
            TopicPartition("reset", 1): 0,
        }
        assert admin.reset_group_offsets(
            "resetters", [TopicPartition("reset", 1)], to_latest=True
        ) == {TopicPartition("reset", 1): 10}
        assert committed(admin, "resetters") == {0: 0, 1: 10}
        moved = admin.reset_group_offsets("resetters", to_offset=99)  # clamped to the log end
        assert moved == {TopicPartition("reset", 0): 10, TopicPartition("reset", 1): 10}
        moved = admin.reset_group_offsets("resetters", "reset", to_timestamp_ms=1_250)
        assert moved == {TopicPartition("reset", 0): 3, TopicPartition("reset", 1): 3}
        # A member joining now starts at the reset offsets.
        with Consumer(address, group_id="resetters", enable_auto_commit=False) as again:
            again.subscribe("reset")
            records: list[ConsumerRecord] = []
            deadline = time.monotonic() + 10
            while len(records) < 14:
                assert time.monotonic() < deadline
                records += again.poll(50)
            assert min(r.offset for r in records if r.partition == 0) == 3

        with pytest.raises(ValueError, match="exactly one"):
            admin.reset_group_offsets("resetters", "reset")
        with pytest.raises(ValueError, match="exactly one"):
            admin.reset_group_offsets("resetters", "reset", to_latest=True, to_offset=1)
        with pytest.raises(ValueError, match="non-negative"):
            admin.reset_group_offsets("resetters", "reset", to_offset=-1)
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.reset_group_offsets("resetters", [TopicPartition("reset", 7)], to_latest=True)

        admin.delete_group("resetters")
        with pytest.raises(GroupIdNotFoundError):
            admin.describe_group("resetters")
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group("resetters")


def test_groups_commands(group_broker: InProcessBroker, capsys: pytest.CaptureFixture[str]) -> None:
    address = group_broker.address
    with AdminClient(address) as admin, Producer(address, linger_ms=0) as producer:
        admin.create_topic("cli-groups", 2)
        for i in range(8):
            producer.send("cli-groups", b"v", partition=i % 2, timestamp_ms=10_000 + i * 1_000)
        producer.flush()
        consumer = Consumer(address, group_id="cli-g", client_id="cli-member")
        consumer.subscribe("cli-groups")
        deadline = time.monotonic() + 10
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline
            consumer.poll(20)
        consumer.commit({TopicPartition("cli-groups", 0): 1, TopicPartition("cli-groups", 1): 4})

        status, out, _ = cli(capsys, "groups", "list", "--bootstrap", address)
        assert status == 0
        assert ["cli-g", "consumer", "Stable", "1"] in table(out)
        status, out, _ = cli(capsys, "groups", "describe", "cli-g", "--bootstrap", address)
        assert status == 0
        rows = table(out)
        assert rows[0] == ["Group:", "cli-g", "State:", "Stable", "Members:", "1"]
        assert rows[1] == ["MEMBER", "CLIENT", "EPOCH", "PARTITIONS"]
        assert rows[2][1:] == ["cli-member", "1", "cli-groups-0,cli-groups-1"]
        member_id = rows[2][0]
        assert rows[3] == ["TOPIC", "PARTITION", "COMMITTED", "LOG", "END", "LAG", "MEMBER"]
        assert rows[4:] == [
            ["cli-groups", "0", "1", "4", "3", member_id],
            ["cli-groups", "1", "4", "4", "0", member_id],
        ]

        # Refused while the group has a member: one line, exit status 1.
        for args in (
            ["groups", "reset-offsets", "cli-g", "--topic", "cli-groups", "--to-earliest"],
            ["groups", "delete", "cli-g"],
        ):
            status, out, err = cli(capsys, *args, "--bootstrap", address)
            assert status == 1
            assert err.strip().splitlines() == [err.strip()]
            assert err.startswith("tidelog: error: ")
            assert "[NON_EMPTY_GROUP]" in err
        consumer.close(autocommit=False)

        reset = ["groups", "reset-offsets", "cli-g", "--bootstrap", address]
        status, out, _ = cli(capsys, *reset, "--topic", "cli-groups", "--to-latest")
        assert status == 0
        assert table(out) == [
            ["TOPIC", "PARTITION", "NEW", "OFFSET"],
            ["cli-groups", "0", "4"],
            ["cli-groups", "1", "4"],
        ]
        status, out, _ = cli(
            capsys, *reset, "--topic", "cli-groups", "--partition", "1", "--to-offset", "2"
        )
        assert (status, table(out)[1:]) == (0, [["cli-groups", "1", "2"]])
        # 12 s after the epoch: the records of partition 0 are at 10, 12, 14, 16 s.
        status, out, _ = cli(
            capsys, *reset, "--all-topics", "--to-datetime", "1970-01-01T00:00:12Z"
        )
        assert (status, table(out)[1:]) == (0, [["cli-groups", "0", "1"], ["cli-groups", "1", "1"]])
        status, out, _ = cli(
            capsys, *reset, "--all-topics", "--to-datetime", "1970-01-01T01:00:12+01:00"
        )
        assert (status, table(out)[1:]) == (0, [["cli-groups", "0", "1"], ["cli-groups", "1", "1"]])
        assert committed(admin, "cli-g") == {0: 1, 1: 1}
        status, _, err = cli(capsys, *reset, "--topic", "cli-groups", "--to-earliest")
        assert status == 0

        # Bad usage is exit status 2, with one line.
        for bad in (
            [*reset, "--topic", "cli-groups"],  # no target
            [*reset, "--to-earliest"],  # no scope
            [*reset, "--topic", "cli-groups", "--to-earliest", "--to-latest"],
        ):
            with pytest.raises(SystemExit) as exited:
                main(bad)
            assert exited.value.code == 2
            capsys.readouterr()
        status, _, err = cli(capsys, *reset, "--topic", "cli-groups", "--to-datetime", "yesterday")
        assert status == 2
        assert "--to-datetime must be an ISO 8601 time" in err
        status, _, err = cli(capsys, *reset, "--all-topics", "--partition", "0", "--to-latest")
        assert (status, "--partition needs --topic" in err) == (2, True)

        status, _, err = cli(capsys, "groups", "delete", "cli-g", "--bootstrap", address)
        assert (status, err.strip()) == (0, 'Deleted group "cli-g".')
        status, _, err = cli(capsys, "groups", "describe", "cli-g", "--bootstrap", address)
        assert status == 1
        assert "[GROUP_ID_NOT_FOUND]" in err


def test_delete_offsets_with_the_admin_client_and_the_command_line(
    group_broker: InProcessBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin:
        admin.create_topic("del-read", 2)
        admin.create_topic("del-other", 2)
        consumer = Consumer(address, group_id="del-g", client_id="del-member")
        consumer.subscribe("del-read")
        deadline = time.monotonic() + 10
        while len(consumer.assignment()) < 2:
            assert time.monotonic() < deadline
            consumer.poll(20)
        consumer.commit({TopicPartition("del-read", 0): 0, TopicPartition("del-read", 1): 0})
        admin.alter_group_offsets("del-other-g", {TopicPartition("del-other", 0): 0})
        try:
            # The member reads del-read: its offsets stay; del-other's may go meanwhile.
            with pytest.raises(GroupSubscribedToTopicError, match="del-read"):
                admin.delete_offsets("del-g", [TopicPartition("del-read", 0)])
            status, _, err = cli(
                capsys, "groups", "delete-offsets", "del-g", "--topic", "del-read",
                "--bootstrap", address,
            )  # fmt: skip
            assert status == 1
            assert "[GROUP_SUBSCRIBED_TO_TOPIC]" in err
            with pytest.raises(UnknownTopicOrPartitionError):
                admin.delete_offsets("del-g", [TopicPartition("del-read", 9)])
            with pytest.raises(ValueError, match="no partitions"):
                admin.delete_offsets("del-g", [])
            with pytest.raises(TypeError):
                admin.delete_offsets("del-g", [("del-read", 0)])  # type: ignore[list-item]
        finally:
            consumer.close(autocommit=False)
        status, _, err = cli(
            capsys, "groups", "delete-offsets", "del-g", "--topic", "del-read",
            "--partition", "1", "--bootstrap", address,
        )  # fmt: skip
        assert (status, err.strip()) == (
            0,
            'Deleted the committed offsets of group "del-g" for del-read [1].',
        )
        assert admin.list_group_offsets("del-g") == {TopicPartition("del-read", 0): 0}
        status, _, err = cli(
            capsys, "groups", "delete-offsets", "del-g", "--topic", "del-read",
            "--bootstrap", address,
        )  # fmt: skip
        assert status == 0
        assert admin.list_group_offsets("del-g") == {}
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_offsets("del-nobody", [TopicPartition("del-read", 0)])
        status, _, err = cli(
            capsys, "groups", "delete-offsets", "del-g", "--topic", "no-such-topic",
            "--bootstrap", address,
        )  # fmt: skip
        assert status == 1
        assert "[UNKNOWN_TOPIC_OR_PARTITION]" in err


def test_consume_with_a_group_joins_it_and_commits_what_it_printed(
    group_broker: InProcessBroker,
) -> None:
    address = group_broker.address
    with AdminClient(address) as admin, Producer(address, linger_ms=0) as producer:
        admin.create_topic("cli-consume", 3)
        for i in range(30):
            producer.send("cli-consume", str(i).encode(), partition=i % 3)
        producer.flush()

        def consume(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tidelog.client.cli", "consume", "cli-consume",
                 "--group", "cc", "--from-beginning", "--bootstrap", address, *extra],
                capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip

        first = consume("--max-messages", "20")
        assert first.returncode == 0, first.stderr
        assert len(first.stdout.split()) == 20
        group = admin.describe_group("cc")
        assert group.members == ()  # it left when it stopped
        assert sum(p.committed_offset or 0 for p in group.partitions) == 20  # what it printed
        rest = consume("--idle-timeout-ms", "1500")
        assert rest.returncode == 0, rest.stderr
        assert sorted(first.stdout.split() + rest.stdout.split(), key=int) == [
            str(i) for i in range(30)
        ]
        assert [p.lag for p in admin.describe_group("cc").partitions] == [0, 0, 0]
