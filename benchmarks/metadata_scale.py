"""The scale half of ``metadata_bench.py`` (issue #34, step 2): one cluster holding
``partitions`` partitions at replication factor 3, and what it costs to serve, fail over,
restart and stop it.

Each step is timed from its action to the moment a client (confluent-kafka's
AdminClient, Metadata from a live broker) sees its effect, polling every 50 ms:

* ``metadata_p99_ms``: ``--samples`` Metadata requests for every topic, one after the
  other, their 99th percentile (nearest rank: of 100, the second largest; librdkafka's
  decode and the client's Python objects included, so an upper bound of the broker's
  time);
* ``controller_failover_s``: SIGKILL the controller; until every partition it led shows
  another leader (the ZooKeeper session timeout, ``session_timeout_ms``, is most of it:
  only then is the broker's registration gone); ``failover_controller_elected_s``,
  ``failover_first_leadership_s`` and ``failover_last_leadership_s`` say where the time
  went, from the survivors' logs (a new controller; the first and the last new
  leadership a survivor took, ``Partition.make_leader`` done);
* ``broker_restart_s``: the same broker started again; until it serves (its ready file)
  and it is back in the ISR of every partition it is a replica of;
* ``controlled_shutdown_s``: SIGTERM a broker that leads partitions and is not the
  controller; until its process has exited (its controlled shutdown moves its
  leaderships first, ``broker.cluster.node``); ``controlled_shutdown_logged`` is what it
  logged of that (moved, or failed at its 15 s bound and stopped anyway).

Besides, ``idle_cpu_per_broker``: the busiest broker's CPU (a fraction of one core) over
10 s with every partition led and no client traffic; and each broker's open files and
resident memory with every partition led (from ``/proc``), per partition it holds a log
of (every broker keeps a log of every partition, ``docs/cluster.md`` "Known gaps"):
``docs/cluster.md`` reports them.

``measure_election_writes`` times one broker failure's elections in ZooKeeper alone
(no broker running): one fenced transaction at a time, and as one pipelined batch.
"""

from __future__ import annotations

import datetime
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, ClusterMetadata, NewTopic

from tidelog.broker.cluster.store import ClusterStore
from tidelog.broker.cluster.testing import LocalCluster, ZooKeeperServer
from tidelog.broker.cluster.znodes import PartitionState, TopicAssignment

__all__ = ["measure_election_writes", "measure_scale"]

_WAIT_S = 900.0
_PER_TOPIC = 50  # partitions per topic: 10,000 partitions are 200 topics


def _metadata(admin: AdminClient) -> ClusterMetadata:
    return admin.list_topics(timeout=60)


def _until(check: Callable[[], bool], started: float, what: str) -> float:
    while True:
        try:
            done = check()
        except Exception:  # a broker restarting or gone: ask again
            done = False
        if done:
            return time.monotonic() - started
        if time.monotonic() - started > _WAIT_S:
            raise SystemExit(f"{what}: not done after {_WAIT_S:.0f} s")
        time.sleep(0.05)


def _proc_figures(pid: int) -> tuple[int, int]:
    """(open files, resident KiB) of a process, from ``/proc``."""
    files = len(os.listdir(f"/proc/{pid}/fd"))
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return files, rss


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_cpu(cluster: LocalCluster, window_s: float = 10.0) -> float:
    """The busiest broker's CPU (a fraction of one core) over ``window_s`` of no client
    traffic: what holding the partitions costs (replica fetches, background scans)."""
    pids = [cluster.pid(b) for b in cluster.broker_ids]
    before = [_cpu_s(pid) for pid in pids]
    started = time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - started
    return round(max(_cpu_s(pid) - b for pid, b in zip(pids, before, strict=True)) / elapsed, 3)


def _mmaps(pid: int) -> int:
    return sum(
        1
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
        if any(line.endswith(s) for s in (".index", ".timeindex", ".log"))
    )


def measure_scale(
    partitions: int, samples: int, data_dirs: dict[int, Path] | None, session_timeout_ms: int
) -> dict[str, object]:
    """Every scale key, on a fresh three-broker cluster of ``partitions`` partitions."""
    topics = max(1, partitions // _PER_TOPIC)
    names = [f"scale-{i:05d}" for i in range(topics)]
    out: dict[str, object] = {
        "scale_partitions": topics * _PER_TOPIC,
        "session_timeout_ms": session_timeout_ms,
    }
    with LocalCluster(
        3, kafka=True, data_dirs=data_dirs, session_timeout_ms=session_timeout_ms
    ) as cluster:
        try:
            _steps(cluster, names, samples, out)
        except BaseException:
            for broker_id in cluster.broker_ids:  # what went wrong, before the logs go
                tail = cluster.output(broker_id)[-3000:]
                print(f"--- broker {broker_id}:\n{tail}", file=sys.stderr)
            raise
    return out


def _steps(cluster: LocalCluster, names: list[str], samples: int, out: dict[str, object]) -> None:
    topics = len(names)
    # librdkafka ends any request after socket.timeout.ms (60 s by default, 300 s at most)
    # whatever the call's own timeout: a loaded machine took over 60 s to create 9,000.
    admin = AdminClient(
        {"bootstrap.servers": cluster.kafka_bootstrap, "socket.timeout.ms": 300_000}
    )
    _metadata(admin)
    # Before: each broker's files and memory with no topic (internal topics aside).
    before = {b: _proc_figures(cluster.pid(b)) for b in cluster.broker_ids}
    started = time.monotonic()
    futures = admin.create_topics(
        [NewTopic(n, _PER_TOPIC, 3) for n in names],
        request_timeout=900,
        operation_timeout=900,
    )
    for future in futures.values():
        future.result()
    out["scale_create_answered_s"] = round(time.monotonic() - started, 1)

    def led() -> bool:
        found = _metadata(admin).topics
        return all(
            n in found
            and len(found[n].partitions) == _PER_TOPIC
            and all(p.leader >= 0 for p in found[n].partitions.values())
            for n in names
        )

    out["scale_create_led_s"] = round(_until(led, started, "create"), 1)
    time.sleep(5)  # the followers' first fetches, the ISR settled
    after = {b: _proc_figures(cluster.pid(b)) for b in cluster.broker_ids}
    held = topics * _PER_TOPIC
    out["open_files_per_partition"] = round(
        max((after[b][0] - before[b][0]) / held for b in after), 3
    )
    out["rss_kib_per_partition"] = round(max((after[b][1] - before[b][1]) / held for b in after), 1)
    out["rss_mib_per_broker"] = round(max(after[b][1] for b in after) / 1024, 1)
    out["log_file_mmaps_per_broker"] = max(_mmaps(cluster.pid(b)) for b in after)
    out["idle_cpu_per_broker"] = _idle_cpu(cluster)

    timings = []
    for _ in range(samples):
        begun = time.perf_counter()
        _metadata(admin)
        timings.append((time.perf_counter() - begun) * 1000)
    timings.sort()
    out["metadata_p50_ms"] = round(_percentile(timings, 0.50), 1)
    out["metadata_p99_ms"] = round(_percentile(timings, 0.99), 1)

    # Controller failover.
    view = _metadata(admin)
    controller = view.controller_id
    led_by = [
        (n, p.id)
        for n in names
        for p in view.topics[n].partitions.values()
        if p.leader == controller
    ]
    started = time.monotonic()
    killed_at = datetime.datetime.now()
    cluster.kill(controller)

    def moved() -> bool:
        found = _metadata(admin).topics
        return all(found[n].partitions[p].leader not in (-1, controller) for n, p in led_by)

    out["controller_failover_s"] = round(_until(moved, started, "failover"), 2)
    out["controller_failover_partitions"] = len(led_by)
    survivors = [b for b in cluster.broker_ids if b != controller]
    out.update(_failover_steps(cluster, survivors, killed_at))

    # Broker restart (the old controller).
    started = time.monotonic()
    cluster.start_broker(controller, wait=False)
    cluster.wait_ready(controller, timeout_s=_WAIT_S)
    out["broker_restart_serving_s"] = round(time.monotonic() - started, 2)

    def back_in_isr() -> bool:
        found = _metadata(admin).topics
        return all(
            controller in p.isrs
            for n in names
            for p in found[n].partitions.values()
            if controller in p.replicas
        )

    out["broker_restart_s"] = round(_until(back_in_isr, started, "restart"), 2)

    # Controlled shutdown of a broker that leads partitions and is not the controller.
    view = _metadata(admin)
    leaders = [p.leader for n in names for p in view.topics[n].partitions.values()]
    candidates = [b for b in cluster.broker_ids if b != view.controller_id]
    stopping = max(candidates, key=leaders.count)
    out["controlled_shutdown_led_partitions"] = leaders.count(stopping)
    started = time.monotonic()
    os.kill(cluster.pid(stopping), signal.SIGTERM)
    out["controlled_shutdown_s"] = round(
        _until(lambda: not cluster.is_running(stopping), started, "controlled shutdown"), 2
    )
    view = _metadata(admin)
    out["controlled_shutdown_still_leading"] = sum(
        1 for n in names for p in view.topics[n].partitions.values() if p.leader == stopping
    )
    # What the stopping broker logged: its controlled shutdown moved the leaderships, or
    # failed (bounded at 15 s, ``broker.cluster.node``) and its session's end moved them.
    lines = cluster.output(stopping).splitlines()
    said = [i for i, line in enumerate(lines) if "controlled shutdown" in line]
    out["controlled_shutdown_logged"] = (
        " ".join(line.strip() for line in lines[said[-1] : said[-1] + 4]).split(": ", 1)[-1]
        if said
        else "nothing"
    )


def _percentile(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted ``ordered``: the smallest value with at
    least ``fraction`` of the values at or below it (of 100 samples, p99 is the 99th;
    this took the 100th, the maximum, before)."""
    return ordered[max(0, math.ceil(len(ordered) * fraction) - 1)]


def _logged_at(line: str) -> datetime.datetime | None:
    """When a broker logged ``line`` (its ``%(asctime)s`` prefix), None if it has none."""
    try:
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None


def _failover_steps(
    cluster: LocalCluster, survivors: list[int], killed_at: datetime.datetime
) -> dict[str, object]:
    """Where a failover's time went, from the survivors' logs (seconds after the kill):
    a new controller elected (``is the controller``: the session timeout is most of
    it), and the last new leadership a survivor took (``leader at epoch``: the
    controller's reconciliation and writes, and the brokers applying the view)."""
    elected: list[float] = []
    led: list[float] = []
    for broker_id in survivors:
        for line in cluster.output(broker_id).splitlines():
            at = _logged_at(line)
            if at is None or at < killed_at:
                continue
            seconds = (at - killed_at).total_seconds()
            if "is the controller (epoch" in line:
                elected.append(seconds)
            elif ": leader at epoch" in line:
                led.append(seconds)
    return {
        "failover_controller_elected_s": round(min(elected), 2) if elected else None,
        "failover_first_leadership_s": round(min(led), 2) if led else None,
        "failover_last_leadership_s": round(max(led), 2) if led else None,
    }


def measure_election_writes(partitions: int) -> dict[str, object]:
    """What one broker failure's elections cost the controller in ZooKeeper alone: the
    state of ``partitions`` partitions written one fenced transaction at a time (before
    issue #34's step 2) and as one pipelined batch (``BatchOps.set_partition_states``),
    against a throwaway ZooKeeper, no broker running."""
    with ZooKeeperServer() as zookeeper:
        store = ClusterStore.connect(f"{zookeeper.connect_string}/bench")
        try:
            lease = store.try_become_controller(1, now_ms=0)
            assert lease is not None
            per_topic = 100
            names = [f"w-{i}" for i in range(max(1, partitions // per_topic))]
            first = PartitionState(1, 0, (1, 2, 3), lease.epoch)
            store.create_topics(
                lease,
                [
                    (
                        TopicAssignment(n, n, dict.fromkeys(range(per_topic), (1, 2, 3))),
                        {},
                        dict.fromkeys(range(per_topic), first),
                    )
                    for n in names
                ],
            )
            keys = [(n, p) for n in names for p in range(per_topic)]
            second = PartitionState(2, 1, (2, 3), lease.epoch)
            started = time.perf_counter()
            for topic, partition in keys:
                store.set_partition_state(lease, topic, partition, second, 0)
            serial_s = time.perf_counter() - started
            third = PartitionState(3, 2, (3,), lease.epoch)
            started = time.perf_counter()
            outcome = store.set_partition_states(lease, [(t, p, third, 1) for t, p in keys])
            batched_s = time.perf_counter() - started
            assert not any(outcome.values()), "a batched write failed"
        finally:
            store.close()
    return {
        "election_writes_partitions": len(keys),
        "election_writes_serial_s": round(serial_s, 2),
        "election_writes_batched_s": round(batched_s, 2),
    }
