"""The fault harness's entry point (issue #29): workloads under a seeded fault schedule, checked.

::

    python -m tests.faults.run --duration 300 --seed 7 [--brokers 3] [--out DIR] [--lossy]
        [--disk-mb 512] [--kinds disk-full,kill] [--workloads queue,append,txn]

Starts ZooKeeper and ``--brokers`` brokers, each in a network namespace of its own
(``netns``), the clients in the root namespace; creates two topics of three partitions,
RF 3 (at most the broker count), ``min.insync.replicas=2``: ``queue`` for the queue
workload and ``append`` for the list-append one (``workloads``). Runs both for a few
seconds, then the schedule of ``--seed`` (``schedule``) for ``--duration`` seconds
through the nemesis (``nemesis``), then heals everything, waits for every replica to be
back in sync (bounded), stops the workloads, reads every partition of both topics whole
(``FinalRead``) and checks the history (``checker``).

Prints the seed, the schedule, what each fault did, the counts (acknowledged, failed,
indeterminate sends, polls, commits) and the anomalies; writes into ``--out`` (default
a new directory under the system's temporary directory) ``history.jsonl``, the
``report.txt`` printed, and each broker's log (``broker-N.log``) and ZooKeeper's.
Findings the checker cannot see (a graceful shutdown that hangs, so the nemesis
SIGKILLs the broker) are printed as such and do not change the exit status.
Exit status: 0 valid, 1 anomalies, 2 the harness itself failed (a final read could
not complete, a workload thread died, the host lacks root, ``ip``, ``nft``, ``tc`` or
ZooKeeper).

Each broker's data directory is on a small file system of its own (``smalldisk``: a
tmpfs of ``--disk-mb`` MiB, mounted before the cluster starts, unmounted after it
stops), which the ``disk-full`` fault fills and frees. ``--lossy`` puts broker 1's data
directory on the lossy file system (``lossyfs``) instead and adds ``power-loss`` to the
fault kinds (``disk-full`` then aims at the other brokers). ``run(...)`` is the same
thing for tests. The namespaces, the mounts and every process are removed whatever
happens (``with`` blocks; children also die with this process, and a tmpfs still in
use is unmounted lazily). ``--kinds`` draws the schedule from the kinds named only
(``--kinds netem`` for slow links alone).

``--workloads`` picks the workloads (default ``queue,append``). ``txn`` adds the
transactional one (``txn_workload``: confluent-kafka transactional producers and
read_committed consumers through each broker's Kafka listener, on a topic ``txn`` of
three partitions, RF 3), whose partitions are read back read_committed once no
transaction is open on them. The ``queue`` topic is created whatever is picked: the
nemesis aims at its leaders.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults import history as history_module
from tests.faults.checker import Report, check
from tests.faults.history import Note, Recorder
from tests.faults.lossyfs import LossyFs
from tests.faults.lossyfs import missing as lossyfs_missing
from tests.faults.nemesis import LossyBroker, Nemesis, missing, move_data_dir_onto
from tests.faults.netns import BrokerNodes, NamespaceNetwork
from tests.faults.schedule import BASE_KINDS, FAULT_KINDS, Schedule, make_schedule
from tests.faults.smalldisk import DEFAULT_SIZE_BYTES, SmallDisks
from tests.faults.smalldisk import missing as smalldisk_missing
from tests.faults.txn_workload import TxnWorkload, final_read_committed
from tests.faults.workloads import AppendWorkload, QueueWorkload, final_read
from tidelog.broker.cluster.testing import LocalCluster, ZooKeeperServer
from tidelog.client import AdminClient

__all__ = ["RunResult", "main", "run"]

log = logging.getLogger(__name__)

QUEUE_TOPIC = "queue"
APPEND_TOPIC = "append"
TXN_TOPIC = "txn"
WORKLOADS = ("queue", "append", "txn")
DEFAULT_WORKLOADS = ("queue", "append")
PARTITIONS = 3
SESSION_TIMEOUT_MS = 6_000
WARMUP_S = 5.0
SETTLE_TIMEOUT_S = 90.0
# Short runs (CI) use short faults and gaps, so every kind fits in two minutes.
SHORT_RUN_S = 300.0
SHORT_FAULT_S = (4.0, 7.0)
SHORT_GAP_S = (3.0, 5.0)
LOSSY_BROKER = 1


@dataclass
class RunResult:
    """What a run found. ``harness_errors`` are failures of the harness, not of Tidelog."""

    schedule: Schedule
    report: Report | None
    out: Path
    events: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    harness_errors: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        if self.harness_errors or self.report is None:
            return 2
        return 0 if self.report.valid else 1


def schedule_for(
    seed: int, duration_s: float, *, lossy: bool = False, kinds: Sequence[str] | None = None
) -> Schedule:
    """The schedule a run of ``duration_s`` with ``seed`` follows: every kind the run can
    apply, or only ``kinds`` (``power-loss`` needs ``lossy``). Raises ``ValueError``."""
    if kinds is None:
        kinds = FAULT_KINDS if lossy else BASE_KINDS
    elif "power-loss" in kinds and not lossy:
        raise ValueError("power-loss needs --lossy")
    if duration_s < SHORT_RUN_S:
        return make_schedule(
            seed, duration_s, kinds=kinds, fault_s=SHORT_FAULT_S, gap_s=SHORT_GAP_S
        )
    return make_schedule(seed, duration_s, kinds=kinds)


def run(
    duration_s: float,
    seed: int,
    *,
    brokers: int = 3,
    out: Path | None = None,
    lossy: bool = False,
    disk_bytes: int = DEFAULT_SIZE_BYTES,
    kinds: Sequence[str] | None = None,
    workloads: Sequence[str] = DEFAULT_WORKLOADS,
    say: Callable[[str], object] = print,
) -> RunResult:
    """One run (module docstring); ``say`` gets every line of the report as it comes.

    Raises ``RuntimeError`` when the host cannot run it (``nemesis.missing``), and
    ``ValueError`` for an unknown workload."""
    unknown = set(workloads) - set(WORKLOADS)
    if unknown or not workloads:
        raise ValueError(f"workloads are some of {', '.join(WORKLOADS)}, not {sorted(unknown)}")
    topics = [QUEUE_TOPIC, *(t for w, t in _TOPICS.items() if w in workloads and t != QUEUE_TOPIC)]
    reason = missing() or smalldisk_missing() or (lossyfs_missing() if lossy else None)
    if reason is not None:
        raise RuntimeError(reason)
    if brokers < 3:
        raise ValueError("the harness needs at least three brokers")
    schedule = schedule_for(seed, duration_s, lossy=lossy, kinds=kinds)
    out = out or Path(tempfile.mkdtemp(prefix=f"tidelog-faults-{seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    result = RunResult(schedule, None, out)
    say(f"tidelog fault run: seed {seed}, {duration_s:.0f} s, {brokers} brokers, out {out}")
    say("schedule: " + schedule.describe())
    recorder = Recorder()
    _note(recorder, f"seed {seed}\n{schedule.describe()}")
    replication = min(3, brokers)
    with contextlib.ExitStack() as stack:
        network = stack.enter_context(
            NamespaceNetwork(["zk", *(f"b{b}" for b in range(1, brokers + 1))])
        )
        # Entered before the cluster: unmounted after every broker stopped.
        disks = stack.enter_context(
            SmallDisks(
                out / "disks",
                [b for b in range(1, brokers + 1) if not (lossy and b == LOSSY_BROKER)],
                disk_bytes,
            )
        )
        zookeeper = ZooKeeperServer(
            host=network.address("zk"), port=2181, wrap=lambda c: network.wrap("zk", c)
        )
        cluster = stack.enter_context(
            LocalCluster(
                brokers,
                settings={
                    "default.replication.factor": replication,
                    "min.insync.replicas": 2,
                    "offsets.topic.replication.factor": replication,
                    "replica.lag.time.max.ms": 4_000,
                },
                session_timeout_ms=SESSION_TIMEOUT_MS,
                zookeeper=zookeeper,
                network=BrokerNodes(network),
                data_dirs=disks.data_dirs(),
                kafka="txn" in workloads,
            )
        )
        stack.callback(_save_logs, cluster, out)
        lossy_broker = None
        if lossy:
            cluster.kill(LOSSY_BROKER)
            fs = stack.enter_context(LossyFs(out / "lossyfs"))
            # Runs before the file system is unmounted (the stack unwinds in reverse).
            stack.callback(_kill_quietly, cluster, LOSSY_BROKER)
            move_data_dir_onto(cluster, LOSSY_BROKER, fs)
            cluster.start_broker(LOSSY_BROKER)
            lossy_broker = LossyBroker(LOSSY_BROKER, fs)
        with AdminClient(cluster.bootstrap, request_timeout_ms=20_000) as admin:
            _eventually(lambda: len(admin.describe_cluster().brokers) == brokers, 60)
            for topic in topics:
                admin.create_topic(
                    topic,
                    PARTITIONS,
                    replication_factor=replication,
                    config={"min.insync.replicas": "2", "segment.bytes": str(1 << 20)},
                )
        nemesis = Nemesis(
            network, cluster, QUEUE_TOPIC, PARTITIONS, lossy=lossy_broker, disks=disks
        )
        stack.callback(nemesis.heal_all)
        running: list[QueueWorkload | AppendWorkload | TxnWorkload] = []
        if "queue" in workloads:
            running.append(
                QueueWorkload(recorder, cluster.bootstrap, QUEUE_TOPIC, PARTITIONS, seed=seed)
            )
        if "append" in workloads:
            running.append(AppendWorkload(recorder, cluster.bootstrap, APPEND_TOPIC, PARTITIONS))
        if "txn" in workloads:
            running.append(
                TxnWorkload(recorder, cluster.kafka_bootstrap, TXN_TOPIC, PARTITIONS, seed=seed)
            )
        for workload in running:
            workload.start()
        try:
            time.sleep(WARMUP_S)
            _follow(schedule, nemesis, recorder, result, say)
        finally:
            result.findings = nemesis.findings
            try:
                nemesis.heal_all()
            finally:
                _settle(cluster, topics, result, say)
                say("stopping the workloads")
                for workload in running:
                    stuck = workload.stop()
                    result.harness_errors += [f"thread {name} did not end" for name in stuck]
                    result.harness_errors += workload.errors
                    if isinstance(workload, TxnWorkload):
                        say(f"transactions: {workload.stats}")
                        if not workload.stats.committed:  # nothing to check: a failed run
                            result.harness_errors.append("no transaction committed")
        _settle(cluster, topics, result, say)
        for topic in topics:
            if topic == QUEUE_TOPIC and "queue" not in workloads:
                continue
            for partition in range(PARTITIONS):
                try:
                    if topic == TXN_TOPIC:
                        final_read_committed(
                            cluster.kafka_bootstrap, topic, partition, recorder, timeout_s=60
                        )
                    else:
                        final_read(cluster.bootstrap, topic, partition, recorder, timeout_s=60)
                except (TimeoutError, ValueError) as error:
                    result.harness_errors.append(str(error))
    history = recorder.history()
    history_module.save(history, out / "history.jsonl")
    result.report = check(history)
    tail = [
        _counts(result.report),
        result.report.summary(),
        *(f"finding (not a checker anomaly): {finding}" for finding in result.findings),
        *(f"harness error: {error}" for error in result.harness_errors),
        f"history: {out / 'history.jsonl'} ({len(history)} operations)",
    ]
    head = [f"seed {seed}", schedule.describe(), "faults applied:"]
    (out / "report.txt").write_text(
        "\n".join([*head, *("  " + event for event in result.events), *tail]) + "\n"
    )
    for line in tail:
        say(line)
    return result


_TOPICS = {"queue": QUEUE_TOPIC, "append": APPEND_TOPIC, "txn": TXN_TOPIC}


def _follow(
    schedule: Schedule,
    nemesis: Nemesis,
    recorder: Recorder,
    result: RunResult,
    say: Callable[[str], object],
) -> None:
    """Apply each step at its time (late steps start at once; nothing is skipped)."""
    began = time.monotonic()
    for step in schedule.steps:
        time.sleep(max(0.0, began + step.at_s - time.monotonic()))
        fault = nemesis.fault(step)
        at = time.monotonic() - began
        try:
            text = fault.start()
        except Exception as error:  # a fault that cannot start is a harness problem
            text = f"could not start {step.kind}: {error!r}"
            result.harness_errors.append(text)
        event = f"{at:7.1f}s {step.kind}: {text}"
        result.events.append(event)
        say(event)
        _note(recorder, event)
        time.sleep(max(0.0, began + step.end_s - time.monotonic()))
        said = None
        try:
            said = fault.heal()
        except Exception as error:
            result.harness_errors.append(f"could not heal {step.kind}: {error!r}")
            nemesis.heal_all()
        event = f"{time.monotonic() - began:7.1f}s healed {step.kind}"
        if said:
            event += f" ({said})"
        result.events.append(event)
        _note(recorder, event)
    time.sleep(max(0.0, began + schedule.duration_s - time.monotonic()))


def _settle(
    cluster: LocalCluster,
    topics: Sequence[str],
    result: RunResult,
    say: Callable[[str], object],
) -> None:
    """Wait (bounded) until every replica of ``topics`` is in sync again."""
    began = time.monotonic()
    try:
        cluster.wait_converged(SETTLE_TIMEOUT_S)
        with AdminClient(cluster.bootstrap, request_timeout_ms=10_000) as admin:

            def in_sync() -> bool:
                return all(
                    set(p.isr) == set(p.replicas) and p.leader >= 0
                    for topic in topics
                    for p in admin.describe_topic(topic).partitions
                )

            _eventually(in_sync, SETTLE_TIMEOUT_S)
        say(f"cluster settled in {time.monotonic() - began:.1f} s")
    except Exception as error:  # reported; the final reads say whether it mattered
        say(f"cluster did not settle: {error!r}")
        result.events.append(f"cluster did not settle: {error!r}")


def _eventually(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception as error:  # retried until the deadline
            last = error
        time.sleep(0.5)
    raise TimeoutError(f"not true within {timeout_s:.0f} s (last error: {last!r})")


def _note(recorder: Recorder, text: str) -> None:
    now = recorder.now_ns()
    recorder.record(Note(text=text, start_ns=now, end_ns=now))


def _counts(report: Report) -> str:
    counts = report.counts
    return (
        f"sends {counts.sends}: acknowledged {counts.acknowledged}, failed {counts.failed}, "
        f"indeterminate {counts.unknown} ({counts.unknown_appeared} appeared); "
        f"polls {counts.polls}, commits {counts.commits}; "
        f"acknowledged checked against final reads {counts.acknowledged_checked}"
    )


def _save_logs(cluster: LocalCluster, out: Path) -> None:
    for broker_id in cluster.broker_ids:
        (out / f"broker-{broker_id}.log").write_text(cluster.output(broker_id))
    (out / "zookeeper.log").write_text(cluster.zookeeper.output())


def _kill_quietly(cluster: LocalCluster, broker_id: int) -> None:
    with contextlib.suppress(Exception):
        cluster.kill(broker_id)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.run", description=__doc__)
    parser.add_argument("--duration", type=float, required=True, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--lossy", action="store_true", help="add power-loss (lossyfs)")
    parser.add_argument(
        "--disk-mb",
        type=int,
        default=DEFAULT_SIZE_BYTES // (1024 * 1024),
        help="size of each broker's small disk (tmpfs) for disk-full",
    )
    parser.add_argument(
        "--kinds",
        default=None,
        help="only these fault kinds, comma-separated (default: every kind the run can apply)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(DEFAULT_WORKLOADS),
        help=f"comma-separated, some of {','.join(WORKLOADS)} (txn: transactions)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    try:
        result = run(
            args.duration,
            seed,
            brokers=args.brokers,
            out=args.out,
            lossy=args.lossy,
            disk_bytes=args.disk_mb * 1024 * 1024,
            kinds=args.kinds.split(",") if args.kinds else None,
            workloads=[w for w in args.workloads.split(",") if w],
        )
    except (RuntimeError, ValueError) as error:
        print(f"cannot run: {error}", file=sys.stderr)  # noqa: T201  # the command line
        return 2
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
