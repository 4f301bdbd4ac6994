"""Client quotas: the rate meter (pure), the manager, and throttling over the network."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.broker.conftest import TIMEOUT_S, create_topic, make_batch, produce
from tidelog.broker.core.quotas import (
    CONSUMER_BYTE_RATE,
    DEFAULT_ENTITY,
    PRODUCER_BYTE_RATE,
    QuotaEntity,
    QuotaManager,
    QuotaWindow,
    RateMeter,
)
from tidelog.broker.core.scram import credential_from_password
from tidelog.broker.core.users import FileUserStore
from tidelog.broker.testing import InProcessBroker
from tidelog.client import AdminClient, InvalidRequestError, Producer
from tidelog.client.types import QuotaEntity as ClientQuotaEntity
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.clock import ManualClock

WINDOW = QuotaWindow(samples=3, sample_ms=1_000)


# --- the meter: Kafka's sampled rate --------------------------------------------------


def test_a_young_meter_counts_the_whole_window_span() -> None:
    meter = RateMeter(WINDOW)
    meter.record(2_000, now_ms=0)
    # One sample so far, but the rate is over (samples - 1) windows: 2 s.
    assert meter.measure(0) == (2_000, 2_000)
    assert meter.rate_per_s(0) == 1_000


def test_throttle_is_the_time_to_pay_back_the_excess() -> None:
    meter = RateMeter(WINDOW)
    meter.record(3_000, now_ms=0)
    # 3,000 bytes against 1,000/s over 2 s: 1,000 too many, 1 s to pay back.
    assert meter.throttle_ms(1_000, 0) == 1_000
    assert meter.throttle_ms(1_500, 0) == 0  # exactly at the quota
    meter.record(1_000_000, now_ms=10)
    assert meter.throttle_ms(1_000, 10) == 3_000  # capped at the window span


def test_old_samples_leave_the_window() -> None:
    meter = RateMeter(WINDOW)
    meter.record(9_000, now_ms=0)
    meter.record(1, now_ms=1_000)
    meter.record(1, now_ms=2_000)
    assert meter.measure(2_500)[0] == 9_002
    assert meter.measure(3_000)[0] == 2  # the first sample's span ended
    assert meter.throttle_ms(1_000, 3_000) == 0


def test_the_manager_applies_default_and_own_quotas(tmp_path: Path) -> None:
    clock = ManualClock()
    quotas = QuotaManager.open(tmp_path, WINDOW, clock)
    assert quotas.record("anyone", PRODUCER_BYTE_RATE, 10**9) == 0  # no quota at all
    quotas.alter(DEFAULT_ENTITY, {PRODUCER_BYTE_RATE: 1_000}, [])
    quotas.alter("vip", {CONSUMER_BYTE_RATE: 5, PRODUCER_BYTE_RATE: 10**12}, [])
    assert quotas.record("anyone", PRODUCER_BYTE_RATE, 3_000) == 1_000
    # A client id's own quota wins over the default's.
    assert quotas.record("vip", PRODUCER_BYTE_RATE, 10**9) == 0
    assert quotas.throttled_ms()[PRODUCER_BYTE_RATE] == 1_000
    # Per quota, as Kafka: a client id with only a consumer quota of its own produces
    # under the default's producer quota.
    quotas.alter("reader", {CONSUMER_BYTE_RATE: 5}, [])
    assert quotas.record("reader", PRODUCER_BYTE_RATE, 3_000) == 1_000
    quotas.alter("reader", {}, [CONSUMER_BYTE_RATE])
    quotas.alter("vip", {}, [PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE])
    assert quotas.describe() == {DEFAULT_ENTITY: {PRODUCER_BYTE_RATE: 1_000.0}}
    reopened = QuotaManager.open(tmp_path, WINDOW, clock)
    assert reopened.describe() == {DEFAULT_ENTITY: {PRODUCER_BYTE_RATE: 1_000.0}}


def test_user_quotas_follow_kafkas_precedence_and_share_a_meter(tmp_path: Path) -> None:
    """Kafka's order: (user, client), (user, <default> client), user, (<default> user,
    client), (<default>, <default>), <default> user, client, <default> client; the
    clients one entity matches share its meter."""
    clock = ManualClock()
    quotas = QuotaManager.open(tmp_path, WINDOW, clock)
    rate = PRODUCER_BYTE_RATE
    quotas.alter(QuotaEntity(None, DEFAULT_ENTITY), {rate: 100}, [])
    quotas.alter(QuotaEntity(None, "app"), {rate: 200}, [])
    quotas.alter(QuotaEntity(DEFAULT_ENTITY, None), {rate: 300}, [])
    quotas.alter(QuotaEntity("alice", None), {rate: 1_000}, [])
    quotas.alter(QuotaEntity("alice", "app"), {rate: 2_000}, [])
    window_s = (WINDOW.samples - 1) * WINDOW.sample_ms / 1000  # a young meter's span

    def bound_is(user: str | None, client_id: str, expected: float) -> bool:
        """Fresh meters: just under ``expected`` bytes/s passes, just over is throttled."""

        def throttled(per_s: float) -> bool:
            probe = QuotaManager(tmp_path, WINDOW, clock, quotas.describe_entities())
            return probe.record(client_id, rate, per_s * window_s, user=user) > 0

        return not throttled(expected * 0.99) and throttled(expected * 1.01)

    assert bound_is("alice", "app", 2_000)  # (user, client id)
    assert bound_is("alice", "other", 1_000)  # user
    assert bound_is("bob", "app", 300)  # <default> user before client id
    assert bound_is(None, "app", 300)  # ANONYMOUS is a user too: the <default> user's
    quotas.alter(QuotaEntity(DEFAULT_ENTITY, None), {}, [rate])
    assert bound_is("bob", "app", 200)  # client id
    assert bound_is("bob", "other", 100)  # <default> client
    # alice's two client ids without an entry of their own share her 1,000 bytes/s.
    quotas.alter(QuotaEntity("alice", "app"), {}, [rate])
    assert quotas.record("one", rate, 1_000 * window_s, user="alice") == 0
    assert quotas.record("two", rate, 1_000 * window_s, user="alice") > 0
    # bob's client ids under the <default> client quota are metered each on its own.
    assert quotas.record("one", rate, 100 * window_s, user="bob") == 0
    assert quotas.record("two", rate, 100 * window_s, user="bob") == 0
    reopened = QuotaManager.open(tmp_path, WINDOW, clock)
    assert reopened.describe_entities() == quotas.describe_entities()
    assert QuotaEntity("alice", None) in reopened.describe_entities()


def test_a_quotas_file_from_before_user_quotas_still_loads(tmp_path: Path) -> None:
    (tmp_path / "quotas.json").write_text('{"client_ids": {"etl": {"producer_byte_rate": 5}}}')
    quotas = QuotaManager.open(tmp_path, WINDOW, ManualClock())
    assert quotas.describe() == {"etl": {PRODUCER_BYTE_RATE: 5.0}}


@pytest.mark.parametrize(
    "values", [{"bogus_rate": 1.0}, {PRODUCER_BYTE_RATE: 0.0}, {PRODUCER_BYTE_RATE: -5.0}]
)
def test_bad_quotas_are_refused(tmp_path: Path, values: dict[str, float]) -> None:
    quotas = QuotaManager.open(tmp_path, WINDOW, ManualClock())
    with pytest.raises(InvalidRequestError):
        quotas.alter("x", values, [])
    assert quotas.describe() == {}


# --- over the network -------------------------------------------------------------------

_SETTINGS = {"quota.window.num": 3, "quota.window.size.seconds": 1}


def test_quotas_are_set_listed_deleted_and_kept_across_restarts() -> None:
    with InProcessBroker(settings=_SETTINGS) as broker:
        with AdminClient(broker.address) as admin:
            admin.alter_client_quotas("etl", {"producer_byte_rate": 1e6})
            admin.alter_client_quotas(
                "<default>", {"consumer_byte_rate": 5e5, "request_percentage": 50}
            )
            assert admin.describe_client_quotas() == {
                "<default>": {"consumer_byte_rate": 5e5, "request_percentage": 50.0},
                "etl": {"producer_byte_rate": 1e6},
            }
            with pytest.raises(InvalidRequestError, match="unknown quota"):
                admin.alter_client_quotas("etl", {"producer_rate": 1})
        broker.restart()
        with AdminClient(broker.address) as admin:
            assert admin.describe_client_quotas("etl") == {"etl": {"producer_byte_rate": 1e6}}
            admin.alter_client_quotas("etl", delete=["producer_byte_rate"])
            assert admin.describe_client_quotas("etl") == {}


def test_a_producer_is_throttled_to_within_20_percent_of_its_quota() -> None:
    quota = 200_000  # bytes/s, far below what the producer does unthrottled
    record_bytes = 1_000
    records = 1_600  # 1.6 MB: about 7 s at the quota
    # Two samples of one second: the meter lets a new client send one second's worth at
    # once (it counts at least samples - 1 windows), then holds it to the quota.
    with InProcessBroker(settings={"quota.window.num": 2}) as broker:
        with AdminClient(broker.address) as admin:
            admin.create_topic("t", 1)
            admin.alter_client_quotas("throttled", {"producer_byte_rate": quota})
        acked: list[float] = []
        lock = threading.Lock()

        def on_ack(future: object) -> None:
            with lock:
                acked.append(time.monotonic())

        with Producer(
            broker.address, client_id="throttled", acks=1, batch_size=16_384, linger_ms=5
        ) as producer:
            producer.partitions_for("t")
            started = time.monotonic()
            for _ in range(records):
                producer.send("t", b"x" * record_bytes).add_done_callback(on_ack)
            producer.flush(timeout_ms=60_000)
        assert len(acked) == records
        burst_allowance = quota * 1  # (samples - 1) windows of one second
        rate = (records * record_bytes - burst_allowance) / (max(acked) - started)
        assert 0.8 * quota <= rate <= 1.2 * quota, f"{rate:.0f} bytes/s against {quota}"
        assert broker.server.core.quotas.throttled_ms()["producer_byte_rate"] > 0


def test_fetch_answers_report_the_throttle_time() -> None:
    settings = {**_SETTINGS, "quota.window.num": 2}
    with InProcessBroker(settings=settings) as broker, broker.channel() as channel:
        stub = pb_grpc.BrokerStub(channel)
        create_topic(stub, "t")
        produce(stub, "t", 0, make_batch([b"v" * 1_000]))
        with AdminClient(broker.address) as admin:
            admin.alter_client_quotas("reader", {"consumer_byte_rate": 500})
        request = pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0)])
        free = stub.Fetch(request, timeout=TIMEOUT_S)
        assert free.throttle_time_ms == 0
        assert free.results[0].records
        metadata = (("tidelog-client-id", "reader"),)
        held = stub.Fetch(request, timeout=TIMEOUT_S, metadata=metadata)
        # ~1,100 bytes against 500/s over one window: about 1.2 s to pay back.
        assert held.throttle_time_ms > 0
        assert held.results[0].records == free.results[0].records


def test_request_time_counts_against_request_percentage() -> None:
    settings = {**_SETTINGS, "quota.window.num": 2}
    with InProcessBroker(settings=settings) as broker:
        with AdminClient(broker.address) as admin:
            # A millionth of a thread: any call's storage time is over it.
            admin.alter_client_quotas("busy", {"request_percentage": 0.0001})
        quotas = broker.server.core.quotas
        with AdminClient(broker.address, client_id="other") as other:
            other.list_topics()
        assert quotas.throttled_ms()["request_percentage"] == 0
        with AdminClient(broker.address, client_id="busy") as busy:
            busy.list_topics()  # answered, late by the throttle time
        assert quotas.throttled_ms()["request_percentage"] > 0


def test_a_users_quota_binds_all_its_client_ids_together(tmp_path: Path) -> None:
    """alice's producer_byte_rate is shared by her two client ids (one meter); bob, with
    no quota of his own and no default, is not metered at all."""
    store = FileUserStore.open(tmp_path)
    for name in ("alice", "bob", "admin"):
        store.upsert(name, credential_from_password("SCRAM-SHA-256", f"{name}-secret"))
    settings = {"security.protocol": "SASL_PLAINTEXT", "quota.window.num": 2}

    def login(name: str) -> dict[str, str]:
        return {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": name,
            "sasl_plain_password": f"{name}-secret",
        }

    quota = 200_000  # bytes/s for alice, both client ids together
    record_bytes, per_producer = 1_000, 300
    with InProcessBroker(tmp_path, settings=settings) as broker:
        with AdminClient(broker.address, **login("admin")) as admin:
            admin.create_topic("t", 1)
            admin.alter_client_quotas(user="alice", quotas={"producer_byte_rate": quota})
            assert admin.describe_quotas() == {
                ClientQuotaEntity("alice", None): {"producer_byte_rate": quota}
            }
        acked: list[float] = []
        lock = threading.Lock()

        def produce(user: str, client_id: str) -> None:
            def on_ack(future: object) -> None:
                with lock:
                    acked.append(time.monotonic())

            with Producer(
                broker.address, client_id=client_id, acks=1, linger_ms=5, **login(user)
            ) as producer:
                producer.partitions_for("t")
                for _ in range(per_producer):
                    future = producer.send("t", b"x" * record_bytes)
                    if user == "alice":
                        future.add_done_callback(on_ack)
                producer.flush(timeout_ms=60_000)

        started = time.monotonic()
        threads = [
            threading.Thread(target=produce, args=("alice", "one")),
            threading.Thread(target=produce, args=("alice", "two")),
            threading.Thread(target=produce, args=("bob", "three")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(acked) == 2 * per_producer
        burst_allowance = quota * 1  # (samples - 1) windows of one second
        rate = (2 * per_producer * record_bytes - burst_allowance) / (max(acked) - started)
        assert 0.75 * quota <= rate <= 1.25 * quota, f"{rate:.0f} bytes/s against {quota}"
        metered = {key[:2] for key in broker.server.core.quotas._meters}
        assert metered == {("alice", "")}  # one meter for alice's two client ids, none for bob
