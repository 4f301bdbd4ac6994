"""A work queue on the log: slow, failure-prone jobs spread over more workers than the
topic has partitions, retried, and dead-lettered when they keep failing (issue #32).

A share group (KIP-932, "queues for Kafka") hands each job to one worker at a time under a
lock; the worker accepts it when done, releases it when the failure may pass (any worker
gets it again at once, its delivery counted), or rejects it when it never can. A job
delivered ``--max-deliveries`` times without success, or rejected, is archived and, with
the group's ``errors.deadletterqueue.topic.name`` set, copied to the dead-letter topic
(with headers naming the group, the source offset, the reason and the delivery count) in
the same transaction that archives it: each such job lands there exactly once. A worker
that dies holding jobs loses nothing: their locks expire and others take them.

One command against a broker (``tidelog serve``, or ``make run``)::

    python examples/work_queue.py --bootstrap 127.0.0.1:7410 --jobs 200 --workers 6

It creates the topics if missing (``jobs``: 2 partitions, so 6 workers share them, which a
consumer group cannot do), sets the group's configs, produces ``--jobs`` jobs, runs the
workers until every job is done or dead-lettered, and prints what happened. Job ``i``
fails transiently with probability ``--flaky`` on each attempt, and is poison (never
succeeds: rejected at once) when ``i`` is a multiple of ``--poison-every``.
``tests/client/test_work_queue_example.py`` runs it against a real broker.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidelog import (
    AdminClient,
    Consumer,
    Producer,
    ShareConsumer,
    TopicAlreadyExistsError,
    TopicPartition,
)
from tidelog.client.types import AlterConfigOp, ConfigResource


class PoisonJobError(Exception):
    """A job that can never succeed."""


class FlakyJobError(Exception):
    """A failure that may pass on another attempt."""


@dataclass
class Tally:
    """What the workers did, shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: Counter[int] = field(default_factory=Counter)
    by_worker: Counter[str] = field(default_factory=Counter)
    released: int = 0
    rejected: int = 0

    def add(self, worker: str, job: int | None = None, kind: str = "accept") -> None:
        with self.lock:
            if kind == "accept" and job is not None:
                self.done[job] += 1
                self.by_worker[worker] += 1
            elif kind == "release":
                self.released += 1
            else:
                self.rejected += 1


def work(job: int, args: argparse.Namespace, rng: random.Random) -> None:
    """The job itself: ``--work-ms`` of work, then success or one of the failures."""
    time.sleep(args.work_ms / 1000)
    if args.poison_every and job % args.poison_every == 0:
        raise PoisonJobError(f"job {job} cannot be done")
    if rng.random() < args.flaky:
        raise FlakyJobError(f"job {job} failed this time")


def worker(name: str, args: argparse.Namespace, tally: Tally, stop: threading.Event) -> None:
    """One member of the share group: poll, work, acknowledge each job explicitly."""
    rng = random.Random(f"{args.seed}-{name}")
    consumer = ShareConsumer(
        args.bootstrap, args.group, client_id=name, max_poll_records=args.batch
    )
    try:
        consumer.subscribe([args.topic])
        while not stop.is_set():
            for record in consumer.poll(timeout_ms=500):
                job = json.loads(record.value or b"{}")["job"]
                try:
                    work(job, args, rng)
                except FlakyJobError:
                    consumer.acknowledge(record, kind="release")  # anyone may retry it now
                    tally.add(name, kind="release")
                except PoisonJobError:
                    consumer.acknowledge(record, kind="reject")  # never again: dead-lettered
                    tally.add(name, kind="reject")
                else:
                    consumer.acknowledge(record)
                    tally.add(name, job)
            consumer.commit_sync(timeout_ms=10_000)
    finally:
        consumer.close(timeout_ms=10_000)


def prepare(args: argparse.Namespace) -> None:
    """The topics and the group's configs: delivery limit and dead-letter topic."""
    with AdminClient(args.bootstrap) as admin:
        for name, partitions in ((args.topic, 2), (args.dead_letter, 1)):
            try:
                admin.create_topic(name, partitions)
            except TopicAlreadyExistsError:
                pass
        admin.incremental_alter_configs(
            ConfigResource.group(args.group),
            [
                AlterConfigOp("share.auto.offset.reset", "set", "earliest"),
                AlterConfigOp("share.delivery.count.limit", "set", str(args.max_deliveries)),
                AlterConfigOp("errors.deadletterqueue.topic.name", "set", args.dead_letter),
            ],
        )


def produce_jobs(args: argparse.Namespace) -> None:
    with Producer(args.bootstrap, acks="all") as producer:
        for job in range(args.jobs):
            producer.send(args.topic, key=b"%d" % job, value=json.dumps({"job": job}).encode())
        producer.flush(timeout_ms=30_000)


def dead_lettered(args: argparse.Namespace) -> dict[int, dict[str, str]]:
    """Every job in the dead-letter topic (committed copies only), with our headers."""
    tp = TopicPartition(args.dead_letter, 0)
    found: dict[int, dict[str, str]] = {}
    with Consumer(args.bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp], timeout_ms=10_000)[tp]
        consumer.seek(tp, 0)
        while consumer.position(tp, timeout_ms=10_000) < end:
            for record in consumer.poll(timeout_ms=1_000):
                headers = {k: v.decode() for k, v in record.headers if k.startswith("tidelog.dlq")}
                found[json.loads(record.value or b"{}")["job"]] = headers
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:7410")
    p.add_argument("--topic", default="jobs")
    p.add_argument("--dead-letter", default="jobs.dead-letter")
    p.add_argument("--group", default="workers")
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--work-ms", type=float, default=20.0)
    p.add_argument("--flaky", type=float, default=0.2, help="chance an attempt fails")
    p.add_argument("--poison-every", type=int, default=25, help="0: no poison jobs")
    p.add_argument("--max-deliveries", type=int, default=4)
    p.add_argument("--batch", type=int, default=5, help="jobs a worker takes per poll")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=32)
    args = p.parse_args(argv)

    prepare(args)
    tally = Tally()
    stop = threading.Event()
    threads = [
        threading.Thread(target=worker, args=(f"worker-{i}", args, tally, stop), daemon=True)
        for i in range(args.workers)
    ]
    for thread in threads:
        thread.start()
    produce_jobs(args)
    deadline = time.monotonic() + args.timeout_s
    settled: dict[int, dict[str, str]] = {}
    while time.monotonic() < deadline:
        settled = dead_lettered(args)
        with tally.lock:
            finished = set(tally.done) | set(settled)
        if len(finished) >= args.jobs:
            break
        time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)

    reasons = Counter(h.get("tidelog.dlq.reason", "?") for h in settled.values())
    report = {
        "jobs": args.jobs,
        "done": len(tally.done),
        "done_twice": sorted(j for j, n in tally.done.items() if n > 1),
        "dead_lettered": sorted(settled),
        "dead_letter_reasons": dict(reasons),
        "released": tally.released,
        "rejected": tally.rejected,
        "workers": dict(sorted(tally.by_worker.items())),
        "missing": sorted(set(range(args.jobs)) - set(tally.done) - set(settled)),
    }
    print(json.dumps(report, indent=2))  # the example's output
    return 0 if not report["missing"] else 1


if __name__ == "__main__":
    sys.exit(main())
