"""Issue #29: the NFQUEUE delayer, a userspace netem for kernels without ``sch_netem``.

Pure tests first (the nfnetlink_queue messages as bytes, the seeded per-packet plan);
then real packets through a real namespace (``netns``) with ``slow(method="delayer")``:
a TCP round trip to the node takes at least the delay (a lower bound, never an upper
one), numbered UDP datagrams come out of order with jitter and some go missing with
loss, a dead delayer does not blackhole the node (the queue's bypass flag), and healing
restores direct, in-order delivery and removes the process and the rules. Last, a short
fault run of ``netem`` steps only, checked.

The namespace tests need root, ``ip``, ``nft``, ``tc``, and NFQUEUE in the kernel (with
nftables' queue statement or iptables): they fail in CI (``CI`` set) without them and
skip elsewhere.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import nfqueue
from tests.faults.delayer import DelayPlan, LinkShape
from tests.faults.nemesis import missing as harness_missing
from tests.faults.netns import NamespaceNetwork, missing

log = logging.getLogger(__name__)

NODE = "b1"
PORT = 7411
DATAGRAMS = 300


def _require(reason: str | None) -> None:
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


# --- the messages, as bytes ---------------------------------------------------------------


def test_a_verdict_names_its_queue_packet_and_verdict() -> None:
    message = nfqueue.verdict_message(3, 0x01020304, nfqueue.NF_ACCEPT, seq=9)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", message)
    assert (length, kind, flags, seq, pid) == (len(message), 0x0301, 0x1, 9, 0)
    assert message[16:20] == b"\x00\x00\x00\x03"  # AF_UNSPEC, version 0, queue 3 big-endian
    assert struct.unpack_from("=HH", message, 20) == (12, 2)  # NFQA_VERDICT_HDR, 8 bytes
    assert message[24:] == b"\x00\x00\x00\x01\x01\x02\x03\x04"
    with pytest.raises(ValueError, match="verdict"):
        nfqueue.verdict_message(0, 1, 7)
    with pytest.raises(ValueError, match="queue"):
        nfqueue.verdict_message(70_000, 1, nfqueue.NF_DROP)


def test_binding_asks_for_acks_and_sets_fail_open() -> None:
    messages = nfqueue.bind_messages(5, max_length=100, first_seq=11)
    assert [struct.unpack_from("=I", m, 8)[0] for m in messages] == [11, 12, 13, 14]
    for message in messages:
        _, kind, flags, _, _ = struct.unpack_from("=IHHII", message)
        assert kind == 0x0302
        assert flags == 0x1 | 0x4
    command, params, max_length, flags = messages
    assert command[20:28] == struct.pack("=HH", 8, 1) + b"\x01\x00\x00\x00"  # bind, pf 0
    assert params[24:29] == struct.pack(">IB", 0, 1)  # metadata only
    assert max_length[24:28] == struct.pack(">I", 100)
    assert flags[20:] == (struct.pack("=HH", 8, 4) + struct.pack(">I", 5)) + (
        struct.pack("=HH", 8, 5) + struct.pack(">I", 5)
    )


def test_a_queued_packet_and_an_error_are_read_back() -> None:
    header = struct.pack(">IHB", 77, 0x0800, 3) + b"\0"  # padded to 8
    other = struct.pack("=HH", 8, 0x8000 | 9) + b"abcd"  # nested flag set, skipped
    body = b"\x00\x00\x00\x00" + other + struct.pack("=HH", 11, 1) + header
    packet = struct.pack("=IHHII", 16 + len(body), 0x0300, 0, 0, 0) + body
    error = struct.pack("=IHHII", 20, 2, 0, 4, 0) + struct.pack("=i", -22)
    ack = struct.pack("=IHHII", 20, 2, 0, 5, 0) + struct.pack("=i", 0)
    messages = nfqueue.parse(packet + error + ack)
    assert [nfqueue.packet_id(m) for m in messages] == [77, None, None]
    assert [nfqueue.error_code(m) for m in messages] == [None, 22, 0]
    with pytest.raises(ValueError, match="truncated"):
        nfqueue.parse(packet[:-4])


# --- the plan: seeded per-packet decisions --------------------------------------------------


def test_the_same_seed_gives_the_same_decisions() -> None:
    shape = LinkShape(delay_ms=50, jitter_ms=20, loss_percent=10, reorder_percent=10)
    plan, again, other = DelayPlan(shape, 4), DelayPlan(shape, 4), DelayPlan(shape, 5)
    first = [plan.decide() for _ in range(500)]
    assert first == [again.decide() for _ in range(500)]
    assert first != [other.decide() for _ in range(500)]


def test_decisions_follow_the_shape() -> None:
    plan = DelayPlan(LinkShape(delay_ms=100, jitter_ms=0), seed=1)
    assert {plan.decide() for _ in range(100)} == {100_000}
    plan = DelayPlan(LinkShape(delay_ms=50, jitter_ms=30, loss_percent=20), seed=2)
    decisions = [plan.decide() for _ in range(5_000)]
    dropped = decisions.count(None)
    assert 700 < dropped < 1_300  # 20 % of 5 000, far outside chance
    delays = [d for d in decisions if d is not None]
    assert min(delays) >= 0
    assert len(set(delays)) > 100
    assert 45_000 < sum(delays) / len(delays) < 56_000
    plan = DelayPlan(LinkShape(delay_ms=50, jitter_ms=0, reorder_percent=25), seed=3)
    immediate = [plan.decide() for _ in range(4_000)].count(0)
    assert 800 < immediate < 1_200


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="delay_ms"):
        LinkShape(delay_ms=-1)
    with pytest.raises(ValueError, match="loss_percent"):
        LinkShape(loss_percent=101)


# --- real packets through a namespace -------------------------------------------------------


@pytest.fixture
def network() -> Iterator[NamespaceNetwork]:
    _require(missing())
    with NamespaceNetwork([NODE]) as built:
        yield built


def _in_node(
    network: NamespaceNetwork, script: str, *args: str, output: bool = False
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        network.wrap(NODE, [sys.executable, "-c", script, *args]),
        stdout=subprocess.PIPE if output else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        text=True,
    )


_ECHO = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
server.settimeout(30)
print("listening", flush=True)
while True:
    try:
        connection, _ = server.accept()
    except TimeoutError:
        break
    with connection:
        connection.settimeout(10)
        data = connection.recv(64)
        if data == b"stop":
            break
        connection.sendall(data)
"""

_SEND = """
import socket, struct, sys, time
target, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
    for number in range(count):
        sender.sendto(struct.pack(">I", number), (target, port))
        time.sleep(0.001)
"""


def _echo_server(network: NamespaceNetwork) -> subprocess.Popen[str]:
    server = _in_node(network, _ECHO, str(PORT), output=True)
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    return server


def _round_trip_s(network: NamespaceNetwork) -> float:
    """Seconds for a TCP connect + one echoed message to the node (its SYN-ACK and its
    answer both leave the node)."""
    began = time.monotonic()
    with socket.create_connection((network.address(NODE), PORT), timeout=10) as connection:
        connection.sendall(b"ping")
        assert connection.recv(64) == b"ping"
    return time.monotonic() - began


def _stop_echo(network: NamespaceNetwork, server: subprocess.Popen[str]) -> None:
    try:
        with socket.create_connection((network.address(NODE), PORT), timeout=10) as connection:
            connection.sendall(b"stop")
    finally:
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        if server.stdout is not None:
            server.stdout.close()


def _datagrams(network: NamespaceNetwork, count: int = DATAGRAMS) -> list[int]:
    """Numbers of the datagrams the node sends to the root namespace, in arrival order."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind((network.client_address, 0))
        receiver.settimeout(2.0)  # quiet this long after the sender ends: all are in
        port = receiver.getsockname()[1]
        sender = _in_node(network, _SEND, network.client_address, str(port), str(count))
        received: list[int] = []
        try:
            while len(received) < count:
                try:
                    data = receiver.recv(64)
                except TimeoutError:
                    if sender.poll() is not None:
                        break
                    continue
                received.append(struct.unpack(">I", data)[0])
        finally:
            sender.wait(30)
        return received


def _rules(network: NamespaceNetwork) -> str:
    ruleset = subprocess.run(
        network.wrap(NODE, ["nft", "list", "ruleset"]),
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return ruleset.stdout


@pytest.mark.timeout(120)
def test_a_round_trip_takes_at_least_the_delay_and_healing_restores_it(
    network: NamespaceNetwork,
) -> None:
    server = _echo_server(network)
    try:
        applied = network.slow(NODE, delay_ms=150, jitter_ms=0, seed=1, method="delayer")
        assert "delayer" in applied
        assert "delay 150ms" in applied
        delayer = network.delayer(NODE)
        assert delayer is not None
        assert delayer.running
        # Two of the node's packets wait: the SYN-ACK, then the echo (lower bounds only).
        assert min(_round_trip_s(network) for _ in range(3)) >= 2 * 0.150
        said = network.unslow(NODE)
        assert said is not None
        assert said.startswith("delayer: accepted ")
        assert not delayer.running
        assert network.delayer(NODE) is None
        assert "queue" not in _rules(network)
        assert _round_trip_s(network) < 10  # and it still works: the queue is gone
    finally:
        _stop_echo(network, server)


@pytest.mark.timeout(120)
def test_jitter_reorders_and_loss_drops_and_healing_restores_order(
    network: NamespaceNetwork,
) -> None:
    network.slow(NODE, delay_ms=30, jitter_ms=20, seed=2, method="delayer")
    jittered = _datagrams(network)
    said = network.unslow(NODE)
    log.info("jitter: %s", said)
    assert sorted(jittered) == list(range(DATAGRAMS))  # none lost: loss is 0
    assert jittered != sorted(jittered)  # and some overtaken
    assert said is not None
    assert "released out of order 0," not in said

    network.slow(NODE, delay_ms=5, jitter_ms=0, loss_percent=30, seed=3, method="delayer")
    lossy = _datagrams(network)
    log.info("loss: %s", network.unslow(NODE))
    assert 0 < len(lossy) < DATAGRAMS
    assert len(set(lossy)) == len(lossy)

    healed = _datagrams(network)
    assert healed == list(range(DATAGRAMS))


@pytest.mark.timeout(120)
def test_reorder_percent_lets_packets_jump_the_queue(network: NamespaceNetwork) -> None:
    network.slow(NODE, delay_ms=100, jitter_ms=0, reorder_percent=30, seed=4, method="delayer")
    received = _datagrams(network, 100)
    network.unslow(NODE)
    assert sorted(received) == list(range(100))
    assert received != sorted(received)


@pytest.mark.timeout(120)
def test_a_dead_delayer_does_not_blackhole_the_node(network: NamespaceNetwork) -> None:
    server = _echo_server(network)
    try:
        network.slow(NODE, delay_ms=100, jitter_ms=0, seed=5, method="delayer")
        delayer = network.delayer(NODE)
        assert delayer is not None
        assert delayer.pid is not None
        os.kill(delayer.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while delayer.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not delayer.running
        assert "queue" in _rules(network)  # the rule is still there, bound to nobody
        assert _round_trip_s(network) < 10  # bypass: packets pass
        assert _datagrams(network, 50) == list(range(50))
        network.unslow(NODE)
    finally:
        _stop_echo(network, server)


@pytest.mark.timeout(120)
def test_the_delayer_ends_itself_at_its_deadline(network: NamespaceNetwork) -> None:
    network.slow(NODE, delay_ms=20, jitter_ms=0, seed=6, deadline_s=1.0, method="delayer")
    delayer = network.delayer(NODE)
    assert delayer is not None
    deadline = time.monotonic() + 15
    while delayer.running and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not delayer.running
    assert _datagrams(network, 50) == list(range(50))
    said = network.unslow(NODE)
    assert said is not None
    assert "accepted" in said


@pytest.mark.timeout(120)
def test_auto_takes_netem_or_the_delayer_never_the_rate_limit_here(
    network: NamespaceNetwork,
) -> None:
    """On a kernel with netem, netem; on one without (this CI's), the delayer: the
    ``tbf`` fallback is for kernels with neither."""
    applied = network.slow(NODE, delay_ms=20, jitter_ms=5, loss_percent=1, seed=7)
    try:
        assert applied.startswith(("netem ", "delayer ")), applied
    finally:
        network.unslow(NODE)
    assert "queue" not in _rules(network)


# --- a short fault run of netem steps -------------------------------------------------------


@pytest.mark.extended  # the fault schedule's run (test_schedule.py) has slow links too
@pytest.mark.timeout(240)
def test_a_short_run_of_slow_links_is_valid(tmp_path: Path) -> None:
    _require(harness_missing())
    from tests.faults.run import run  # the harness pulls in the cluster: only here

    lines: list[str] = []
    result = run(30, 29, brokers=3, out=tmp_path / "run", kinds=["netem"], say=lines.append)
    text = "\n".join([*lines, *result.events])
    log.info("netem run:\n%s", text)
    assert result.schedule.kinds() == frozenset({"netem"})
    assert not result.harness_errors, text
    slow = [e for e in result.events if "slow link on" in e]
    assert slow, text
    assert all(": delayer " in e or ": netem " in e for e in slow), text
    assert result.report is not None
    assert result.report.valid, text
    assert result.report.counts.acknowledged > 100, text
    assert result.report.counts.acknowledged_checked == result.report.counts.acknowledged
