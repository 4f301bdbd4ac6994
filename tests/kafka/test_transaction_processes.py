"""Transactional producers as separate processes (issue #28 "Must show"): one SIGKILLed
mid-transaction, and two processes sharing one ``transactional.id``.

- A producer process killed with its transaction open (records flushed to the log):
  the partition's last stable offset stays before them until the coordinator aborts the
  transaction at its ``transaction.timeout.ms``; then read_committed readers move on and
  never see its records, while a transaction committed after it becomes readable.
- Zombie fencing: process A initialises an id and opens a transaction; process B
  initialises the same id; A's next write and its commit are refused (fenced) and nothing
  A wrote is ever read committed, while B's transaction commits.

The producers are confluent-kafka in a child Python process, driven over stdin/stdout
one command per line, so the test decides when each step happens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka.conftest import KafkaBroker, unique
from tests.kafka.test_transactions import TIMEOUT_S, producer, quick_aborts, read_all

pytestmark = pytest.mark.timeout(180)

__all__ = ["quick_aborts"]

# The child: reads JSON commands, answers one JSON line each ({"ok": true} or the error).
CHILD = textwrap.dedent(
    """
    import json, sys
    from confluent_kafka import KafkaException, Producer

    config = json.loads(sys.argv[1])
    producer = Producer(config)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            what = command["do"]
            if what == "init":
                producer.init_transactions(30)
            elif what == "begin":
                producer.begin_transaction()
            elif what == "send":
                producer.produce(command["topic"], command["value"].encode(), partition=0)
                if producer.flush(30) != 0:
                    raise RuntimeError("not delivered in 30 s")
            elif what == "commit":
                producer.commit_transaction(30)
            answer = {"ok": True}
        except KafkaException as exc:
            error = exc.args[0]
            answer = {"ok": False, "name": error.name(), "fatal": error.fatal()}
        except Exception as exc:  # noqa: BLE001 - reported to the test
            answer = {"ok": False, "name": type(exc).__name__, "fatal": False}
        print(json.dumps(answer), flush=True)
    """
)


class ProducerProcess:
    """A confluent-kafka producer in its own process, one command at a time."""

    def __init__(self, config: dict[str, object]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def do(self, what: str, **arguments: object) -> dict[str, object]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps({"do": what, **arguments}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the producer process died during {what!r}"
        answer: dict[str, object] = json.loads(line)
        return answer

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.kill()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def processes() -> Iterator[list[ProducerProcess]]:
    started: list[ProducerProcess] = []
    yield started
    for each in started:
        each.close()


def topic_on(broker: KafkaBroker) -> str:
    name = unique("proc")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=3)])[name].result(timeout=TIMEOUT_S)
    return name


def test_a_producer_killed_mid_transaction_is_aborted_at_its_timeout(
    quick_aborts: KafkaBroker, processes: list[ProducerProcess]
) -> None:
    topic = topic_on(quick_aborts)
    dying = ProducerProcess(
        {
            "bootstrap.servers": quick_aborts.bootstrap,
            "transactional.id": unique("killed"),
            "transaction.timeout.ms": 2_000,
        }
    )
    processes.append(dying)
    for step, arguments in [("init", {}), ("begin", {}), ("send", {"value": "orphan"})]:
        assert dying.do(step, topic=topic, **arguments) == {"ok": True}, step
    dying.kill()  # its transaction is open in the log, and nobody will end it
    survivor = producer(quick_aborts, unique("survivor"))
    survivor.begin_transaction()
    survivor.produce(topic, b"after", partition=0)
    survivor.commit_transaction(TIMEOUT_S)
    # Readable once the coordinator aborts the killed one's transaction (about 2 s).
    assert read_all(quick_aborts, topic, "read_committed", 1) == [b"after"]
    assert sorted(read_all(quick_aborts, topic, "read_uncommitted", 2)) == [b"after", b"orphan"]


def test_a_zombie_process_is_fenced_by_the_next_instance(
    kafka_broker: KafkaBroker, processes: list[ProducerProcess]
) -> None:
    topic = topic_on(kafka_broker)
    config = {"bootstrap.servers": kafka_broker.bootstrap, "transactional.id": unique("app")}
    zombie, successor = ProducerProcess(config), ProducerProcess(config)
    processes += [zombie, successor]
    for step, arguments in [("init", {}), ("begin", {}), ("send", {"value": "zombie-1"})]:
        assert zombie.do(step, topic=topic, **arguments) == {"ok": True}, step
    for step, arguments in [("init", {}), ("begin", {}), ("send", {"value": "successor"})]:
        assert successor.do(step, topic=topic, **arguments) == {"ok": True}, step
    # The zombie's epoch is fenced: its next write fails, and so does its commit.
    late = zombie.do("send", topic=topic, value="zombie-2")
    commit = zombie.do("commit")
    assert late["ok"] is False or commit["ok"] is False
    assert commit["ok"] is False
    assert commit["name"] in {"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"}, commit
    assert successor.do("commit") == {"ok": True}
    assert read_all(kafka_broker, topic, "read_committed", 1) == [b"successor"]
