"""The ``tidelog`` command line, driven as a subprocess against a real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import ROOT, tidelog
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Producer
from tidelog.client.types import QuotaEntity as ClientQuotaEntity


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int, text: str) -> None:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("tidelog: error: "), result.stderr
    assert text in lines[-1]


def test_topics_create_list_describe_delete(broker: InProcessBroker) -> None:
    address = broker.address
    created = tidelog(
        "topics", "create", "cli-topic", "--partitions", "3", "--config", "retention.ms=60000",
        "--bootstrap", address,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert 'Created topic "cli-topic" with 3 partition(s).' in created.stderr

    listed = tidelog("topics", "list", "--bootstrap", address)
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITIONS"]
    assert ["cli-topic", "3"] in [line.split() for line in lines[1:]]
    # Aligned: every row is as wide as the header (the count is flush right).
    assert len({len(line) for line in lines}) == 1

    described = tidelog("topics", "describe", "cli-topic", "--bootstrap", address)
    assert described.returncode == 0
    assert described.stdout.startswith("Topic: cli-topic   Partitions: 3")
    header = (
        "PARTITION  LEADER  REPLICAS  ISR  ELR  LAST KNOWN ELR  EPOCH  LOG START  LOG END  "
        "HIGH WATERMARK"
    )
    assert header in described.stdout
    rows = [line.split() for line in described.stdout.splitlines()]
    partition_rows = [row for row in rows if row[:1] in (["0"], ["1"], ["2"])]
    # A single node keeps no eligible leader replicas (KIP-966 is cluster mode's): "-".
    assert [row[:7] for row in partition_rows] == [
        [str(p), "0", "0", "0", "-", "-", "0"] for p in range(3)
    ]
    assert "retention.ms" in described.stdout
    assert "60000" in described.stdout

    altered = tidelog(
        "topics", "alter", "cli-topic", "--set", "retention.ms=120000", "--bootstrap", address
    )
    assert altered.returncode == 0, altered.stderr

    deleted = tidelog("topics", "delete", "cli-topic", "--bootstrap", address)
    assert deleted.returncode == 0
    assert "cli-topic" not in tidelog("topics", "list", "--bootstrap", address).stdout


def test_cluster_describe_and_replication_factor(broker: InProcessBroker) -> None:
    address = broker.address
    host, port = address.rsplit(":", 1)
    described = tidelog("cluster", "describe", "--bootstrap", address)
    assert described.returncode == 0, described.stderr
    assert "Controller: 0" in described.stdout
    lines = described.stdout.splitlines()
    assert lines[2].split() == ["BROKER", "HOST", "PORT", "CONTROLLER"]
    assert lines[3].split() == ["0", host, port, "yes"]

    created = tidelog(
        "topics", "create", "cli-rf1", "--replication-factor", "1", "--bootstrap", address
    )
    assert created.returncode == 0, created.stderr
    refused = tidelog(
        "topics", "create", "cli-rf3", "--replication-factor", "3", "--bootstrap", address
    )
    assert_one_line_error(refused, 1, "replication factor 3")


def test_topics_producers_lists_what_each_leader_remembers(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cli-producers", 2)
    with Producer(address, linger_ms=0) as producer:
        for i in range(3):
            producer.send("cli-producers", b"v%d" % i, partition=1).result(10)
    listed = tidelog("topics", "producers", "cli-producers", "--bootstrap", address)
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[:4] == ["PARTITION", "PRODUCER", "ID", "EPOCH"]
    partition, producer_id, epoch, last_sequence, last_offset, _ = row.split()
    assert (partition, epoch, last_sequence, last_offset) == ("1", "0", "2", "2")
    assert int(producer_id) >= 0
    only_zero = tidelog(
        "topics", "producers", "cli-producers", "--partition", "0", "--bootstrap", address
    )
    assert only_zero.returncode == 0, only_zero.stderr
    assert "No producers" in only_zero.stderr
    missing = tidelog("topics", "producers", "cli-no-such-topic", "--bootstrap", address)
    assert_one_line_error(missing, 1, "cli-no-such-topic")


def test_topics_delete_records(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cli-delete-records", 2)
    with Producer(address, linger_ms=0) as producer:
        for i in range(6):
            producer.send("cli-delete-records", b"v%d" % i, partition=i % 2).result(10)
    before = tidelog(
        "topics", "delete-records", "cli-delete-records", "--before", "2", "--partition", "0",
        "--bootstrap", address,
    )  # fmt: skip
    assert before.returncode == 0, before.stderr
    assert [line.split() for line in before.stdout.splitlines()] == [
        ["PARTITION", "LOW", "WATERMARK"],
        ["0", "2"],
    ]
    everything = tidelog(
        "topics", "delete-records", "cli-delete-records", "--all", "--bootstrap", address
    )
    assert everything.returncode == 0, everything.stderr
    assert [line.split() for line in everything.stdout.splitlines()][1:] == [["0", "3"], ["1", "3"]]
    with AdminClient(address) as admin:
        starts = [p.log_start_offset for p in admin.describe_topic("cli-delete-records").partitions]
    assert starts == [3, 3]
    above = tidelog(
        "topics", "delete-records", "cli-delete-records", "--before", "99", "--bootstrap", address
    )
    assert_one_line_error(above, 1, "high watermark")
    missing = tidelog("topics", "delete-records", "cli-no-such", "--all", "--bootstrap", address)
    assert_one_line_error(missing, 1, "cli-no-such")
    negative = tidelog(
        "topics", "delete-records", "cli-delete-records", "--before", "-1", "--bootstrap", address
    )
    assert negative.returncode == 2, negative.stderr
    neither = tidelog("topics", "delete-records", "cli-delete-records", "--bootstrap", address)
    assert neither.returncode == 2, neither.stderr


def test_produce_lines_then_consume_them_with_a_format(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cli-records", 1)
    produced = tidelog(
        "produce", "cli-records", "--key-separator", ":", "--bootstrap", address,
        stdin="user-1:hello\nuser-2:world\nuser-1:again: with a colon\n",
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert 'Produced 3 record(s) to "cli-records".' in produced.stderr

    consumed = tidelog(
        "consume", "cli-records", "--from-beginning", "--max-messages", "3",
        "--format", r"{offset}\t{key}\t{value}", "--bootstrap", address,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == [
        "0\tuser-1\thello",
        "1\tuser-2\tworld",
        "2\tuser-1\tagain: with a colon",
    ]
    assert "Processed a total of 3 message(s)." in consumed.stderr

    from_offset = tidelog(
        "consume", "cli-records", "--partition", "0", "--offset", "1", "--max-messages", "1",
        "--format", "{partition}/{offset} {timestamp} {value}", "--bootstrap", address,
    )  # fmt: skip
    assert from_offset.returncode == 0, from_offset.stderr
    partition_offset, timestamp, value = from_offset.stdout.split()
    assert (partition_offset, value) == ("0/1", "world")
    assert int(timestamp) > 1_600_000_000_000


def test_consume_prints_the_four_timestamps(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cli-times", 1)
    hour_ms = 3_600_000
    # A device clock two hours fast: its record and send times carry the skew.
    with Producer(address, wall_clock=lambda: time.time_ns() // 1_000_000 + 2 * hour_ms) as p:
        p.send("cli-times", value=b"ping").result(timeout=30)
    consumed = tidelog(
        "consume", "cli-times", "--from-beginning", "--max-messages", "1",
        "--print-timestamps", "--bootstrap", address,
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    *times, value = consumed.stdout.rstrip("\n").split("\t")
    assert value == "ping"
    fields = dict(t.split("=") for t in times)
    assert list(fields) == ["timestamp", "sent", "received", "corrected"]
    timestamp, sent, received, corrected = (int(v) for v in fields.values())
    assert corrected == timestamp + received - sent
    assert sent - received > hour_ms  # the device's clock, not the broker's
    assert abs(corrected - received) < hour_ms


def test_consume_without_from_beginning_reads_new_records_only(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cli-new-only", 1)
    with Producer(address) as producer:
        producer.send("cli-new-only", b"old")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tidelog.client.cli", "consume", "cli-new-only",
         "--max-messages", "1", "--bootstrap", address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        # Keep sending until the consumer (positioned at the end) has seen one.
        with Producer(address) as producer:
            for _ in range(100):
                producer.send("cli-new-only", b"new").result(timeout=10)
                try:
                    out, err = process.communicate(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                pytest.fail("the consumer never printed a new record")
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.splitlines() == ["new"]


def test_consume_stops_when_idle(broker: InProcessBroker) -> None:
    with AdminClient(broker.address) as admin:
        admin.create_topic("cli-idle", 2)
    with Producer(broker.address) as producer:
        for i in range(4):
            producer.send("cli-idle", b"%d" % i, partition=i % 2)
    result = tidelog(
        "consume", "cli-idle", "--from-beginning", "--idle-timeout-ms", "500",
        "--bootstrap", broker.address,
    )  # fmt: skip
    assert result.returncode == 0
    assert sorted(result.stdout.split()) == ["0", "1", "2", "3"]


def test_errors_are_one_line_with_a_trustworthy_status(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address) as admin:
        admin.create_topic("cli-exists", 1)
    assert_one_line_error(
        tidelog("topics", "create", "cli-exists", "--bootstrap", address),
        1,
        "already exists [TOPIC_ALREADY_EXISTS]",
    )
    assert_one_line_error(
        tidelog("topics", "describe", "cli-missing", "--bootstrap", address),
        1,
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert_one_line_error(
        tidelog("consume", "cli-missing", "--bootstrap", address), 1, "UNKNOWN_TOPIC"
    )
    assert_one_line_error(
        tidelog("produce", "cli-missing", "--bootstrap", address, stdin="x\n"), 1, "UNKNOWN_TOPIC"
    )
    assert_one_line_error(
        tidelog("topics", "create", "x", "--config", "novalue", "--bootstrap", address),
        2,
        "KEY=VALUE",
    )
    assert_one_line_error(
        tidelog("consume", "cli-exists", "--offset", "3", "--bootstrap", address),
        2,
        "--offset needs --partition",
    )
    assert_one_line_error(
        tidelog("produce", "cli-exists", "--key-separator", ":", "--bootstrap", address,
                stdin="k:v\nno separator\n"),
        2,
        "line 2 has no key separator",
    )  # fmt: skip
    usage = tidelog("topics", "create")
    assert usage.returncode == 2
    assert "Traceback" not in usage.stderr


def test_an_unreachable_broker_fails_after_the_timeout() -> None:
    result = tidelog("topics", "list", "--bootstrap", "127.0.0.1:9", "--timeout-ms", "300")
    assert_one_line_error(result, 1, "unreachable")
    assert "[BROKER_UNAVAILABLE]" in result.stderr


def test_serve_is_dispatched_to_the_broker_lazily() -> None:
    result = tidelog("serve", "--help")
    assert result.returncode == 0
    assert "broker" in result.stdout.lower()


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("tidelog")
    if not script.exists():
        pytest.skip("the tidelog console script is not installed in this environment")
    result = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0
    assert "topics" in result.stdout
    assert "consume" in result.stdout


def test_quotas_set_list_delete(broker: InProcessBroker) -> None:
    address = broker.address
    done = tidelog(
        "quotas", "set", "etl", "producer_byte_rate=1048576", "request_percentage=50",
        "--bootstrap", address,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    listed = tidelog("quotas", "list", "--bootstrap", address)
    assert listed.returncode == 0, listed.stderr
    lines = [line.split() for line in listed.stdout.splitlines()]
    assert lines[0] == [
        "USER",
        "CLIENT_ID",
        "PRODUCER_BYTE_RATE",
        "CONSUMER_BYTE_RATE",
        "REQUEST_PERCENTAGE",
    ]
    assert lines[1] == ["-", "etl", "1048576", "-", "50"]
    assert_one_line_error(
        tidelog("quotas", "set", "etl", "bogus=1", "--bootstrap", address), 1, "unknown quota"
    )
    removed = tidelog("quotas", "delete", "etl", "--bootstrap", address)
    assert removed.returncode == 0, removed.stderr
    with AdminClient(address) as admin:
        assert admin.describe_client_quotas() == {}


def test_quotas_of_users_and_users_with_client_ids(broker: InProcessBroker) -> None:
    address = broker.address
    for words in (
        ["--user", "alice", "producer_byte_rate=1000"],
        ["app", "consumer_byte_rate=2000", "--user", "<default>"],
        ["etl", "request_percentage=25"],
    ):
        done = tidelog("quotas", "set", *words, "--bootstrap", address)
        assert done.returncode == 0, done.stderr
    listed = tidelog("quotas", "list", "--bootstrap", address)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert rows == [
        ["<default>", "app", "-", "2000", "-"],
        ["alice", "-", "1000", "-", "-"],
        ["-", "etl", "-", "-", "25"],
    ]
    only = tidelog("quotas", "list", "--user", "alice", "--bootstrap", address)
    assert [line.split()[0] for line in only.stdout.splitlines()[1:]] == ["alice"]
    assert_one_line_error(
        tidelog("quotas", "set", "producer_byte_rate=1", "--bootstrap", address),
        2,
        "client id, a user",
    )
    removed = tidelog(
        "quotas", "delete", "--user", "alice", "producer_byte_rate", "--bootstrap", address
    )
    assert removed.returncode == 0, removed.stderr
    with AdminClient(address) as admin:
        assert ClientQuotaEntity("alice", None) not in admin.describe_quotas()
        assert ClientQuotaEntity("<default>", "app") in admin.describe_quotas()


def test_configs_describe_and_alter(broker: InProcessBroker) -> None:
    address = broker.address
    with AdminClient(address, request_timeout_ms=10_000) as admin:
        admin.create_topic("cli-configs", 1)
    altered = tidelog(
        "configs", "alter", "--topic", "cli-configs", "--set", "retention.ms=60000",
        "--append", "cleanup.policy=compact", "--bootstrap", address,
    )  # fmt: skip
    assert altered.returncode == 0, altered.stderr
    assert "Changed 2 config key(s) of topic cli-configs" in altered.stderr
    described = tidelog(
        "configs", "describe", "--topic", "cli-configs", "retention.ms", "cleanup.policy",
        "--synonyms", "--bootstrap", address,
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    rows = [line.split() for line in described.stdout.splitlines()]
    assert rows[0][:4] == ["KEY", "VALUE", "SOURCE", "SYNONYMS"]
    assert rows[1][:3] == ["cleanup.policy", "compact,delete", "DYNAMIC_TOPIC_CONFIG"]
    assert rows[2][:3] == ["retention.ms", "60000", "DYNAMIC_TOPIC_CONFIG"]
    assert "log.retention.ms=604800000 (DEFAULT_CONFIG)" in described.stdout
    defaults = tidelog(
        "configs", "alter", "--broker-defaults", "--set", "log.retention.bytes=1048576",
        "--bootstrap", address,
    )  # fmt: skip
    assert defaults.returncode == 0, defaults.stderr
    shown = tidelog("configs", "describe", "--broker-defaults", "--bootstrap", address)
    assert ["log.retention.bytes", "1048576", "DYNAMIC_DEFAULT_BROKER_CONFIG"] in [
        line.split() for line in shown.stdout.splitlines()
    ]
    assert tidelog(
        "configs", "alter", "--broker-defaults", "--delete", "log.retention.bytes",
        "--bootstrap", address,
    ).returncode == 0  # fmt: skip
    assert_one_line_error(
        tidelog(
            "configs",
            "alter",
            "--broker",
            "0",
            "--set",
            "num.partitions=3",
            "--bootstrap",
            address,
        ),
        1,
        "cannot be changed while the broker runs",
    )
    assert_one_line_error(
        tidelog("configs", "alter", "--topic", "cli-configs", "--bootstrap", address),
        2,
        "give at least one",
    )
