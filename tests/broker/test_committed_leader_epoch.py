"""The committed leader epoch (KIP-320, issue #25 item 3) on the broker: kept in the
``__consumer_offsets`` record (value version 3; older versions still read), returned by
Tidelog's OffsetCommit/OffsetFetch RPCs, kept through a restart; and OffsetForLeaderEpoch,
which consumers use to check a position against the leader's log.

The Kafka listener's side is in ``tests/kafka/test_committed_leader_epoch.py``, the
consumer's in ``tests/client/test_leader_epoch_validation.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, make_batch, produce
from tidelog.broker.groups.assignor import TopicPartition
from tidelog.broker.groups.offset_records import (
    NO_LEADER_EPOCH,
    OffsetValue,
    decode_value,
    encode_key,
    encode_value,
)
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC, OffsetStore, OffsetStoreConfig
from tidelog.broker.testing import InProcessBroker
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.clock import ManualClock
from tidelog.storage.log_manager import LogManager, LogManagerConfig
from tidelog.storage.records import BatchBuilder

pytestmark = pytest.mark.timeout(60)

TP = TopicPartition("events", 3)


# --- the record format --------------------------------------------------------------------


def test_a_value_keeps_its_leader_epoch() -> None:
    value = OffsetValue(42, "m", 1_000, leader_epoch=7)
    data = encode_value(value)
    assert data[10:14] == (7).to_bytes(4, "big")  # version 3: the epoch after the offset
    assert decode_value(data) == value


def _legacy_value(version: int, offset: int, metadata: str, timestamp_ms: int) -> bytes:
    """A value as Kafka wrote versions 0-2 (no leader epoch; v1 has an expire time)."""
    encoded = metadata.encode()
    data = struct.pack(">hqh", version, offset, len(encoded)) + encoded
    data += struct.pack(">q", timestamp_ms)
    if version == 1:
        data += struct.pack(">q", timestamp_ms + 86_400_000)
    return data


@pytest.mark.parametrize("version", [0, 1, 2])
def test_older_value_versions_read_without_an_epoch(version: int) -> None:
    data = _legacy_value(version, 12, "meta", 5_000)
    assert decode_value(data) == OffsetValue(12, "meta", 5_000, NO_LEADER_EPOCH)
    with pytest.raises(ValueError, match="bad length"):
        decode_value(data + b"\x00")


def test_a_record_from_before_the_change_reads_as_no_epoch() -> None:
    # What Tidelog wrote before issue #25: version 3 with the epoch forced to -1.
    before = b"\x00\x03" + (9).to_bytes(8, "big") + b"\xff\xff\xff\xff" + b"\x00\x00"
    before += (1).to_bytes(8, "big")
    assert decode_value(before) == OffsetValue(9, "", 1, NO_LEADER_EPOCH)


def test_an_out_of_range_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match="leader epoch"):
        encode_value(OffsetValue(1, "", 1, leader_epoch=-2))


def _open_logs(directory: Path) -> LogManager:
    return LogManager.open(directory, LogManagerConfig(), clock=ManualClock())


def test_the_store_reloads_epochs_and_old_records(tmp_path: Path) -> None:
    other = TopicPartition("events", 0)
    with _open_logs(tmp_path) as logs:
        store = OffsetStore.open(logs, OffsetStoreConfig(num_partitions=1))
        # A record in Kafka's value version 1, as a migrated log might hold.
        builder = BatchBuilder()
        builder.append(1, encode_key("g", other), _legacy_value(1, 4, "", 1))
        logs.get_log(OFFSETS_TOPIC, 0).append(builder.build())
        store.commit("g", {TP: OffsetValue(5, "a", 1, leader_epoch=2)})
    with _open_logs(tmp_path) as logs:
        assert OffsetStore.open(logs).offsets("g") == {
            TP: OffsetValue(5, "a", 1, leader_epoch=2),
            other: OffsetValue(4, "", 1),
        }


# --- Tidelog's RPCs -----------------------------------------------------------------------


@pytest.fixture
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker(settings={"offsets.topic.num.partitions": 2}) as running:
        yield running


def _commit(stub: pb_grpc.BrokerStub, group: str, offsets: list[pb.CommittedOffset]) -> None:
    answer = stub.OffsetCommit(
        pb.OffsetCommitRequest(group_id=group, offsets=offsets), timeout=TIMEOUT_S
    )
    assert [r.error_code for r in answer.results] == [""] * len(offsets)


def _fetch(stub: pb_grpc.BrokerStub, group: str) -> dict[int, tuple[int, int, str]]:
    answer = stub.OffsetFetch(pb.OffsetFetchRequest(group_id=group), timeout=TIMEOUT_S)
    return {o.partition: (o.offset, o.leader_epoch, o.metadata) for o in answer.offsets}


def test_grpc_commit_and_fetch_keep_the_epoch_through_a_restart(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=3)
        _commit(
            stub,
            "g",
            [
                pb.CommittedOffset(topic="t", partition=0, offset=5, metadata="m", leader_epoch=1),
                pb.CommittedOffset(topic="t", partition=1, offset=7, leader_epoch=2),
                pb.CommittedOffset(topic="t", partition=2, offset=9),  # no epoch
            ],
        )
        want = {0: (5, 1, "m"), 1: (7, 2, ""), 2: (9, -1, "")}
        assert _fetch(stub, "g") == want
    broker.restart()
    with broker.channel() as channel:
        assert _fetch(pb_grpc.BrokerStub(channel), "g") == want


def test_offset_for_leader_epoch_over_grpc(broker: InProcessBroker) -> None:
    with broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t", partitions=1)
        produce(stub, "t", 0, make_batch([b"a", b"b", b"c"]))

        def ask(epoch: int, topic: str = "t") -> tuple[str, int, int]:
            answer = stub.OffsetForLeaderEpoch(
                pb.OffsetForLeaderEpochRequest(
                    partitions=[
                        pb.OffsetForLeaderEpochPartition(
                            topic=topic, partition=0, leader_epoch=epoch
                        )
                    ]
                ),
                timeout=TIMEOUT_S,
            )
            (result,) = answer.results
            return result.error_code, result.leader_epoch, result.end_offset

        # A single broker stamps no epochs: no leader change ever cut its log, so an
        # epoch ends at the log end; "no epoch" (-1) is UNDEFINED, as in Kafka.
        assert ask(0) == ("", 0, 3)
        assert ask(4) == ("", 4, 3)
        assert ask(-1) == ("", -1, -1)
        assert ask(0, "missing")[0] == "UNKNOWN_TOPIC_OR_PARTITION"
