"""A group consumer in its own process, for the consumer-group tests.

``python -m tests.client.group_worker BOOTSTRAP GROUP TOPIC [--no-auto-commit]
[--session-timeout-ms MS]`` subscribes with ``group_id=GROUP`` and polls until told to
stop. It reports on stdout, one JSON object per line, flushed at once:

- ``{"e": "assign"|"revoke"|"lost", "p": [partitions]}`` from the rebalance callbacks;
- ``{"e": "recs", "r": [[partition, offset], ...]}`` for every non-empty poll;
- ``{"e": "committed"}`` after a ``commit`` command, ``{"e": "closed"}`` after ``close``.

Commands arrive on stdin, one per line: ``commit`` (commit the positions) and ``close``
(close the consumer, which leaves the group, and exit). The consumer is used from the
main thread only; a reader thread just queues the commands.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading

from tidelog.client import Consumer, TopicPartition
from tidelog.client.consumer import PartitionsCallback


def _say(**fields: object) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def _reporter(kind: str) -> PartitionsCallback:
    def report(partitions: list[TopicPartition]) -> None:
        _say(e=kind, p=[tp.partition for tp in partitions])

    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("--no-auto-commit", action="store_true")
    parser.add_argument("--session-timeout-ms", type=int, default=3_000)
    args = parser.parse_args()
    commands: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("close")  # the test went away

    threading.Thread(target=read_commands, daemon=True).start()
    consumer = Consumer(
        args.bootstrap,
        group_id=args.group,
        client_id=f"worker-{args.group}",
        auto_offset_reset="earliest",
        enable_auto_commit=not args.no_auto_commit,
        auto_commit_interval_ms=200,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=100,
        request_timeout_ms=5_000,
    )
    consumer.subscribe(
        [args.topic],
        on_assign=_reporter("assign"),
        on_revoke=_reporter("revoke"),
        on_lost=_reporter("lost"),
    )
    while True:
        records = consumer.poll(timeout_ms=50)
        if records:
            _say(e="recs", r=[[r.partition, r.offset] for r in records])
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command == "commit":
            consumer.commit()
            _say(e="committed")
        elif command == "close":
            consumer.close()
            _say(e="closed")
            return


if __name__ == "__main__":
    main()
