"""ACLs enforced by a real broker on every RPC, and managed with AdminClient and the CLI.

Without authentication every caller is ``User:ANONYMOUS`` from 127.0.0.1; the bindings
below are made for that principal and host (the authentication tests use named users).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.broker.conftest import error_code, make_batch
from tidelog.broker.core.acl import AclBinding as BrokerBinding
from tidelog.broker.share.records import ShareStateKey, partition_for
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition
from tidelog.client.acls import CLUSTER, AclBinding, AclFilter
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    SecurityDisabledError,
    TopicAuthorizationFailedError,
)

ME = "User:ANONYMOUS"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[InProcessBroker]:
    """A broker that checks ACLs; ``User:ANONYMOUS`` may administer ACLs and create topics."""
    settings = {"authorizer.enabled": "true"}
    with InProcessBroker(tmp_path / "data", settings=settings) as broker:
        # Bootstrap: the very first bindings are written to the data directory's store
        # directly, as an operator's first `tidelog acls add` with a super user would.
        broker.server.core.acls.create(
            [
                _binding(ME, "ALTER", "CLUSTER", CLUSTER),
                _binding(ME, "DESCRIBE", "CLUSTER", CLUSTER),
                _binding(ME, "CREATE", "CLUSTER", CLUSTER),
                _binding(ME, "IDEMPOTENT_WRITE", "CLUSTER", CLUSTER),
            ]
        )
        yield broker


def _binding(principal: str, operation: str, kind: str, name: str) -> BrokerBinding:
    return BrokerBinding.parse(
        principal=principal,
        host="*",
        operation=operation,
        permission="ALLOW",
        resource_type=kind,
        resource_name=name,
    )


def allow(admin: AdminClient, operation: str, name: str, **kwargs: str) -> None:
    admin.create_acls([AclBinding(ME, operation, resource_name=name, **kwargs)])


def test_read_but_not_write(secured: InProcessBroker) -> None:
    bootstrap = secured.address
    with AdminClient(bootstrap) as admin:
        admin.create_topic("orders", 1)
        allow(admin, "READ", "orders")
    with Producer(bootstrap, acks=1) as producer, pytest.raises(TopicAuthorizationFailedError):
        producer.send("orders", b"x").result(timeout=10)
    with AdminClient(bootstrap) as admin:
        allow(admin, "WRITE", "orders")
    with Producer(bootstrap, acks=1) as producer:
        producer.send("orders", b"x").result(timeout=10)
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        records = []
        for _ in range(50):
            records += consumer.poll(timeout_ms=100)
            if records:
                break
    assert [r.value for r in records] == [b"x"]


def test_fetch_without_read_is_refused_per_partition(secured: InProcessBroker) -> None:
    with AdminClient(secured.address) as admin:
        admin.create_topic("secret", 1)
    with secured.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        answer = stub.Fetch(
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic="secret", partition=0, fetch_offset=0)]
            ),
            timeout=10,
        )
        assert answer.results[0].error_code == "TOPIC_AUTHORIZATION_FAILED"
        produced = stub.Produce(
            pb.ProduceRequest(
                acks=1,
                topics=[
                    pb.ProduceTopicData(
                        topic="secret",
                        partitions=[
                            pb.ProducePartitionData(partition=0, records=make_batch([b"a"]))
                        ],
                    )
                ],
            ),
            timeout=10,
        )
        assert produced.results[0].error_code == "TOPIC_AUTHORIZATION_FAILED"
        with pytest.raises(grpc.RpcError) as refused:
            stub.DescribeTopic(pb.DescribeTopicRequest(name="secret"), timeout=10)
        assert error_code(refused.value) == "TOPIC_AUTHORIZATION_FAILED"


def test_prefixed_acls_and_deny_overrides_allow(secured: InProcessBroker) -> None:
    bootstrap = secured.address
    with AdminClient(bootstrap) as admin:
        for name in ("logs-app", "logs-audit", "other"):
            admin.create_topic(name, 1)
        allow(admin, "WRITE", "logs-", pattern_type="PREFIXED")
        allow(admin, "WRITE", "logs-audit", permission="DENY")
        allow(admin, "DESCRIBE", "logs-", pattern_type="PREFIXED")
        # Listing shows only what the principal may describe.
        assert [t.name for t in admin.list_topics()] == ["logs-app", "logs-audit"]
    with Producer(bootstrap, acks=1) as producer:
        producer.send("logs-app", b"ok").result(timeout=10)
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send("logs-audit", b"no").result(timeout=10)


def test_groups_need_group_acls(secured: InProcessBroker) -> None:
    bootstrap = secured.address
    with AdminClient(bootstrap) as admin:
        admin.create_topic("events", 1)
        allow(admin, "READ", "events")
    with Consumer(bootstrap, group_id="g1", enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition("events", 0)])
        with pytest.raises(GroupAuthorizationFailedError):
            consumer.commit({TopicPartition("events", 0): 0})
    with AdminClient(bootstrap) as admin:
        admin.create_acls([AclBinding(ME, "READ", resource_type="GROUP", resource_name="g1")])
    with Consumer(bootstrap, group_id="g1", enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition("events", 0)])
        consumer.commit({TopicPartition("events", 0): 0})


def test_admin_calls_need_cluster_acls_and_super_users_pass(tmp_path: Path) -> None:
    plain = InProcessBroker(tmp_path / "a", settings={"authorizer.enabled": "true"})
    with plain as broker, AdminClient(broker.address) as admin:
        with pytest.raises(ClusterAuthorizationFailedError):
            admin.describe_acls()
        with pytest.raises(TopicAuthorizationFailedError):
            admin.create_topic("t", 1)
    settings = {"authorizer.enabled": "true", "super.users": ME}
    with (
        InProcessBroker(tmp_path / "b", settings=settings) as broker,
        AdminClient(broker.address) as admin,
    ):
        admin.create_topic("t", 1)
        admin.create_acls([AclBinding("User:alice", "READ", resource_name="t")])
        assert admin.describe_acls(AclFilter(principal="User:alice")) == [
            AclBinding("User:alice", "READ", resource_name="t")
        ]
        assert len(admin.delete_acls(AclFilter(resource_name="t"))) == 1
        assert admin.describe_acls() == []


def test_acls_survive_a_restart_and_the_cli_manages_them(tmp_path: Path) -> None:
    settings = {"authorizer.enabled": "true", "super.users": ME}
    data = tmp_path / "data"
    with InProcessBroker(data, settings=settings) as broker:
        added = tidelog(
            "acls", "add", "--allow-principal", "User:alice", "--operation", "READ",
            "--operation", "WRITE", "--topic", "orders-", "--resource-pattern-type",
            "prefixed", "--bootstrap", broker.address,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
    with InProcessBroker(data, settings=settings) as broker:
        listed = tidelog("acls", "list", "--topic", "orders-", "--bootstrap", broker.address)
        assert listed.returncode == 0, listed.stderr
        rows = [" ".join(line.split()) for line in listed.stdout.splitlines()[1:]]
        assert rows == [
            "TOPIC orders- PREFIXED User:alice * READ ALLOW",
            "TOPIC orders- PREFIXED User:alice * WRITE ALLOW",
        ]
        removed = tidelog(
            "acls", "remove", "--allow-principal", "User:alice", "--operation", "WRITE",
            "--topic", "orders-", "--bootstrap", broker.address,
        )  # fmt: skip
        assert removed.returncode == 0, removed.stderr
        with AdminClient(broker.address) as admin:
            assert [b.operation for b in admin.describe_acls()] == ["READ"]


def test_without_an_authorizer_acl_calls_say_so(broker: InProcessBroker) -> None:
    with AdminClient(broker.address) as admin:
        with pytest.raises(SecurityDisabledError):
            admin.create_acls([AclBinding(ME, "READ", resource_name="t")])
        admin.create_topic("open", 1)  # and everything else is allowed


def tidelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidelog.client.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


def test_share_groups_need_read_on_the_group_and_the_topics(secured: InProcessBroker) -> None:
    def refusal(call: object) -> str:
        with pytest.raises(grpc.RpcError) as caught:
            call()  # type: ignore[operator]
        return error_code(caught.value)

    join = pb.ShareGroupHeartbeatRequest(
        group_id="q", member_id="m", member_epoch=0, subscribed_topic_names=["jobs"]
    )
    fetch = pb.ShareFetchRequest(
        group_id="q", member_id="m", partitions=[pb.TopicPartitions(topic="jobs", partitions=[0])]
    )
    ack = pb.ShareAcknowledgeRequest(
        group_id="q",
        member_id="m",
        acknowledgements=[pb.ShareAcknowledgement(topic="jobs", partition=0, kind=1)],
    )
    describe = pb.DescribeShareGroupRequest(group_id="q")
    with secured.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        # Raw: AdminClient.create_topic would wait for a topic it may not describe.
        stub.CreateTopic(pb.CreateTopicRequest(name="jobs", partitions=1), timeout=10)
        for call in (
            lambda: stub.ShareGroupHeartbeat(join, timeout=10),
            lambda: stub.ShareFetch(fetch, timeout=10),
            lambda: next(stub.ShareFetchStream(iter([fetch]), timeout=10)),
            lambda: stub.ShareAcknowledge(ack, timeout=10),
            lambda: stub.DescribeShareGroup(describe, timeout=10),
        ):
            assert refusal(call) == "GROUP_AUTHORIZATION_FAILED"
        with AdminClient(secured.address) as admin:
            admin.create_acls([AclBinding(ME, "READ", resource_type="GROUP", resource_name="q")])
        for call in (
            lambda: stub.ShareGroupHeartbeat(join, timeout=10),
            lambda: stub.ShareFetch(fetch, timeout=10),
            lambda: next(stub.ShareFetchStream(iter([fetch]), timeout=10)),
            lambda: stub.ShareAcknowledge(ack, timeout=10),
        ):
            assert refusal(call) == "TOPIC_AUTHORIZATION_FAILED"
        with AdminClient(secured.address) as admin:
            allow(admin, "READ", "jobs")
        assert stub.ShareGroupHeartbeat(join, timeout=10).assignment[0].topic == "jobs"
        assert not stub.ShareFetch(fetch, timeout=10).partitions[0].error_code
        # The stream's requests are authorized as ShareFetch's, one by one.
        assert not next(stub.ShareFetchStream(iter([fetch]), timeout=10)).partitions[0].error_code
        # READ on the group allows DESCRIBE (Kafka's implication).
        assert stub.DescribeShareGroup(describe, timeout=10).members[0].member_id == "m"


def test_the_share_coordinator_calls_are_for_brokers_only(secured: InProcessBroker) -> None:
    """ReadShareGroupState, InitializeShareGroupState and WriteShareGroupState (a share
    partition's leader at its share coordinator) need CLUSTER_ACTION; granted, they read
    and write ``__share_group_state`` and fence an older leader epoch."""
    key = pb.ShareStateKeyRef(
        group_id="q", topic_id=uuid.uuid4().bytes, partition=0, leader_epoch=3, broker_id=7
    )
    old = pb.ShareStateKeyRef(
        group_id="q", topic_id=key.topic_id, partition=0, leader_epoch=2, broker_id=8
    )
    read = pb.ReadShareGroupStateRequest(key=key)
    init = pb.InitializeShareGroupStateRequest(key=key, start_offset=5)
    batch = pb.ShareStateBatch(first_offset=5, last_offset=6, delivery_state=2, delivery_count=1)
    write = pb.WriteShareGroupStateRequest(key=key, start_offset=-1, batches=[batch])
    stale = pb.WriteShareGroupStateRequest(key=old, start_offset=-1, batches=[batch])
    with secured.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        calls = (
            lambda: stub.ReadShareGroupState(read, timeout=10),
            lambda: stub.InitializeShareGroupState(init, timeout=10),
            lambda: stub.WriteShareGroupState(write, timeout=10),
        )
        for call in calls:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert error_code(caught.value) == "CLUSTER_AUTHORIZATION_FAILED"
        with AdminClient(secured.address) as admin:
            allow(admin, "CLUSTER_ACTION", CLUSTER, resource_type="CLUSTER")
        assert not stub.ReadShareGroupState(read, timeout=10).found
        assert stub.InitializeShareGroupState(init, timeout=10).start_offset == 5
        written = stub.WriteShareGroupState(write, timeout=10)
        assert (written.leader_epoch, list(written.batches)) == (3, [batch])
        with pytest.raises(grpc.RpcError) as caught:
            stub.WriteShareGroupState(stale, timeout=10)
        assert error_code(caught.value) == "FENCED_LEADER_EPOCH"
        assert list(stub.ReadShareGroupState(read, timeout=10).batches) == [batch]


def test_the_share_admin_calls_between_brokers_are_for_brokers_only(
    secured: InProcessBroker,
) -> None:
    """ReadShareGroupStateSummary, DeleteShareGroupState (at a share coordinator) and
    DescribeSharePartition (at a leader), the group coordinator's calls of the share-group
    admin in a cluster, need CLUSTER_ACTION; granted, an admin's initialize with a newer
    state epoch fences a write from the older one (FENCED_STATE_EPOCH), the summary shows
    it, and a delete leaves nothing."""
    topic = uuid.uuid4()
    key = pb.ShareStateKeyRef(group_id="q", topic_id=topic.bytes, partition=0, state_epoch=0)
    reset = pb.ShareStateKeyRef(group_id="q", topic_id=topic.bytes, partition=0, state_epoch=1)
    state_partition = partition_for(ShareStateKey("q", topic, 0), 5)
    summary = pb.ReadShareGroupStateSummaryRequest(group_id="q", state_partition=state_partition)
    delete = pb.DeleteShareGroupStateRequest(key=key)
    describe = pb.DescribeSharePartitionRequest(group_id="q", topic="jobs", partition=0)
    batch = pb.ShareStateBatch(first_offset=0, last_offset=0, delivery_state=2, delivery_count=1)
    with secured.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        calls = (
            lambda: stub.ReadShareGroupStateSummary(summary, timeout=10),
            lambda: stub.DeleteShareGroupState(delete, timeout=10),
            lambda: stub.DescribeSharePartition(describe, timeout=10),
        )
        for call in calls:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert error_code(caught.value) == "CLUSTER_AUTHORIZATION_FAILED"
        with AdminClient(secured.address) as admin:
            allow(admin, "CLUSTER_ACTION", CLUSTER, resource_type="CLUSTER")
        stub.CreateTopic(pb.CreateTopicRequest(name="jobs", partitions=1), timeout=10)
        init = pb.InitializeShareGroupStateRequest(key=key, start_offset=0)
        assert stub.InitializeShareGroupState(init, timeout=10).state_epoch == 0
        admin_reset = pb.InitializeShareGroupStateRequest(key=reset, start_offset=7)
        assert stub.InitializeShareGroupState(admin_reset, timeout=10).state_epoch == 1
        stale = pb.WriteShareGroupStateRequest(key=key, start_offset=-1, batches=[batch])
        with pytest.raises(grpc.RpcError) as caught:
            stub.WriteShareGroupState(stale, timeout=10)
        assert error_code(caught.value) == "FENCED_STATE_EPOCH"
        (state,) = stub.ReadShareGroupStateSummary(summary, timeout=10).states
        assert (state.topic_id, state.start_offset, state.state_epoch) == (topic.bytes, 7, 1)
        stub.DeleteShareGroupState(delete, timeout=10)
        assert list(stub.ReadShareGroupStateSummary(summary, timeout=10).states) == []
        at_leader = stub.DescribeSharePartition(describe, timeout=10)
        assert (at_leader.high_watermark, at_leader.HasField("stats")) == (0, False)
