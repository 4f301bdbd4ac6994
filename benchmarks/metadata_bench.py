"""Cluster metadata at scale (issue #34): how fast a cluster creates and leads partitions.

::

    python benchmarks/metadata_bench.py [--topics 250] [--partitions 4]

On one three-broker cluster (``LocalCluster(kafka=True)``: a throwaway ZooKeeper and
three broker processes on 127.0.0.1), confluent-kafka's AdminClient sends **one**
CreateTopics of ``--topics`` topics of ``--partitions`` partitions at replication
factor 3 (``operation_timeout`` 120 s, so the broker answers when the topics are led),
and the clock runs from the request until a Metadata from the client shows every
partition with a leader. ``create_partitions_per_s`` is the partitions over that time
(target: at least 200). Then one DeleteTopics of all of them, timed until Metadata
lists none (``delete_topics_s``).

Then, on a fresh cluster of ``--scale-partitions`` partitions (default 10,000, RF=3,
topics of 50; ``benchmarks/metadata_scale.py`` says how each is timed):
``metadata_p99_ms_at_10k`` (target <= 100), ``controller_failover_s_at_10k`` (target
<= the session timeout + 5 s), ``broker_restart_s_at_10k`` (<= 60 s) and
``controlled_shutdown_s_at_10k`` (<= 30 s), with the brokers' open files and memory per
partition. At another partition count the ``_at_10k`` keys say so and the plain keys
(``metadata_p99_ms``...) hold the figures: never extrapolated. ``--scale-partitions 0``
skips it; ``--scale-only`` skips the creation run. ``election_writes_serial_s`` and
``election_writes_batched_s`` time one broker's share of elections (``--election-writes``
partitions) in ZooKeeper alone, one transaction at a time and pipelined.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from benchmarks.metadata_scale import measure_election_writes, measure_scale  # noqa: E402
from tidelog.broker.cluster.testing import LocalCluster  # noqa: E402

_NOT_YET = "not measured"
_AT_10K = {
    "metadata_p99_ms_at_10k": "metadata_p99_ms",
    "controller_failover_s_at_10k": "controller_failover_s",
    "broker_restart_s_at_10k": "broker_restart_s",
    "controlled_shutdown_s_at_10k": "controlled_shutdown_s",
}
_WAIT_S = 300.0


def _led(admin: AdminClient, names: list[str], partitions: int) -> bool:
    found = admin.list_topics(timeout=30).topics
    for name in names:
        topic = found.get(name)
        if topic is None or topic.error is not None or len(topic.partitions) != partitions:
            return False
        if any(p.leader < 0 for p in topic.partitions.values()):
            return False
    return True


def _gone(admin: AdminClient, names: list[str]) -> bool:
    found = admin.list_topics(timeout=30).topics
    return not any(name in found for name in names)


def _errors(futures: dict[str, object]) -> dict[str, str]:
    out = {}
    for name, future in futures.items():
        try:
            future.result()  # type: ignore[attr-defined]
        except Exception as exc:
            out[name] = str(exc)
    return out


def _until(check: object, started: float) -> float:
    while not check():  # type: ignore[operator]
        if time.monotonic() - started > _WAIT_S:
            raise SystemExit(f"not done after {_WAIT_S:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - started


def measure(topics: int, partitions: int, data_root: Path | None = None) -> dict[str, object]:
    names = [f"meta-{i:05d}" for i in range(topics)]
    root = None if data_root is None else Path(tempfile.mkdtemp(dir=data_root))
    dirs = None if root is None else {b: root / f"broker-{b}" for b in (1, 2, 3)}
    try:
        return _measure(names, partitions, dirs)
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _measure(names: list[str], partitions: int, dirs: dict[int, Path] | None) -> dict[str, object]:
    topics = len(names)
    with LocalCluster(3, kafka=True, data_dirs=dirs) as cluster:
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        admin.list_topics(timeout=30)  # connected before the clock starts
        started = time.monotonic()
        futures = admin.create_topics(
            [NewTopic(n, partitions, 3) for n in names],
            request_timeout=120,
            operation_timeout=120,
        )
        failed = _errors(futures)
        answered_s = time.monotonic() - started
        if failed:
            raise SystemExit(f"{len(failed)} topics failed, e.g. {next(iter(failed.items()))}")
        led_s = _until(lambda: _led(admin, names, partitions), started)
        started = time.monotonic()
        failed = _errors(admin.delete_topics(names, request_timeout=120, operation_timeout=120))
        deleted_answered_s = time.monotonic() - started
        if failed:
            raise SystemExit(f"{len(failed)} deletions failed, e.g. {next(iter(failed.items()))}")
        deleted_s = _until(lambda: _gone(admin, names), started)
    return {
        "topics": topics,
        "partitions_per_topic": partitions,
        "replication_factor": 3,
        "create_answered_s": round(answered_s, 2),
        "create_led_s": round(led_s, 2),
        "create_partitions_per_s": round(topics * partitions / led_s, 1),
        "delete_answered_s": round(deleted_answered_s, 2),
        "delete_topics_s": round(deleted_s, 2),
    }


def scale(
    partitions: int, samples: int, session_timeout_ms: int, data_root: Path | None
) -> dict[str, object]:
    """``metadata_scale.measure_scale`` with the ``_at_10k`` keys filled honestly."""
    if partitions <= 0:
        return dict.fromkeys(_AT_10K, _NOT_YET)
    root = None if data_root is None else Path(tempfile.mkdtemp(dir=data_root))
    dirs = None if root is None else {b: root / f"scale-broker-{b}" for b in (1, 2, 3)}
    try:
        out = measure_scale(partitions, samples, dirs, session_timeout_ms)
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    at = out["scale_partitions"]
    for key, plain in _AT_10K.items():
        out[key] = out[plain] if at == 10_000 else f"not measured at 10,000 ({plain} at {at})"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=250)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--data-root",
        type=Path,
        help="where the brokers' data directories go (default: the system's temp "
        "directory); /dev/shm (tmpfs) shows what the run costs without the disk's fsyncs",
    )
    parser.add_argument("--scale-partitions", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=100, help="Metadata requests timed")
    parser.add_argument("--session-timeout-ms", type=int, default=4_000)
    parser.add_argument("--scale-only", action="store_true")
    parser.add_argument(
        "--election-writes",
        type=int,
        default=3_000,
        help="partitions whose elections are timed in ZooKeeper alone, serial and batched "
        "(a third of 9,000: one broker's share; 0 skips)",
    )
    args = parser.parse_args()
    result: dict[str, object] = {}
    if not args.scale_only:
        result.update(measure(args.topics, args.partitions, args.data_root))
    if args.election_writes > 0:
        result.update(measure_election_writes(args.election_writes))
    result.update(
        scale(args.scale_partitions, args.samples, args.session_timeout_ms, args.data_root)
    )
    result["data_root"] = str(args.data_root or tempfile.gettempdir())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
