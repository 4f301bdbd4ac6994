"""What the inline produce's append costs in Python, without a socket (issue #31).

::

    python benchmarks/append_cost_bench.py [--appends 3000] [--rounds 7]

An in-process broker (metrics off); one topic, one partition. Each round calls
``BrokerCore.append_inline`` then ``complete`` (``acks=1``) ``--appends`` times with one
100 B record (16 B key) in one batch, as the Kafka listener does for a small produce on
its loop, and divides the wall time by the appends. The last line is one JSON object:
the fastest round and the median round, in microseconds. ``limits_bench.py --latency``
measures the same append through a socket, where the loopback and the scheduler of a
shared machine move the figure by more than the append costs; this one shows a change to
the append's own Python. The machine is shared: run both trees in turn, a few times
each, and compare the fastest rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tidelog.broker.core.produce import Acks, PartitionProduced, PartitionRecords
from tidelog.broker.testing import InProcessBroker
from tidelog.storage.batch_builder import BatchBuilder
from tidelog.storage.batch_times import NO_TIME, BatchTimes


def append_cost(appends: int, rounds: int) -> dict[str, float]:
    """Microseconds per inline append and ``acks=1`` answer: the fastest and the median
    round. An append the core leaves to the pool (the log manager held the partition
    lock for a moment) is appended there, untimed apart from the attempt."""
    builder = BatchBuilder()
    builder.append(int(time.time() * 1000), b"k" * 16, os.urandom(100))
    records = builder.build()
    data = Path(tempfile.mkdtemp(prefix="tidelog-append-cost-"))
    delivered: list[list[PartitionProduced]] = []
    per_round = []
    try:
        settings = {"kafka.listen": "127.0.0.1:0", "metrics.port": -1}
        with InProcessBroker(data_dir=data, settings=settings) as broker:
            core = broker.server.core
            core.create_topic("cost", 1, {})
            pooled = 0
            for _ in range(rounds):
                started = time.perf_counter()
                for _ in range(appends):
                    parts = [PartitionRecords("cost", 0, records, BatchTimes(NO_TIME, 1))]
                    done = core.append_inline(parts)
                    if not done:
                        pooled += 1
                        done = core.append(parts)
                    core.complete(done, Acks.LEADER, delivered.append)
                    delivered.clear()
                per_round.append((time.perf_counter() - started) / appends * 1e6)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return {
        "append_us_min": round(min(per_round), 1),
        "append_us_median": round(statistics.median(per_round), 1),
        "pooled": pooled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=3000, help="appends per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds")
    args = parser.parse_args()
    print(json.dumps(append_cost(args.appends, args.rounds)))


if __name__ == "__main__":
    main()
