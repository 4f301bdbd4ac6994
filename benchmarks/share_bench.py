"""Share-group benchmark (issue #32): what queues on the log buy, against a consumer group
of the same members on the same partitions, in the same run.

::

    python benchmarks/share_bench.py [--members 8] [--work-ms 5] [--seconds 10]
                                     [--backlog 20000] [--flat-backlog 300000]
                                     [--max-poll-records 10] [--flat-max-poll-records 500]
                                     [--quick] [--profile FILE]
                                     [--profile-phase share|share_flat] [--profile-native]

One broker process (``kafka_bench.start_broker``: 127.0.0.1, a temporary data directory,
heartbeats every 200 ms so groups settle quickly), a two-partition topic per phase, and
four phases, one after the other:

1. **Slow work, consumer group** (``group_records_per_s``): ``--members`` members of one
   consumer group (KIP-848 heartbeats; ``auto_offset_reset=earliest``) read the topic; each
   poll's records are worked on one by one (``time.sleep(--work-ms)``), then the positions
   committed (``commit()``), and the batch counts when the commit returns. Two partitions:
   two members work, the others hold nothing, as Kafka's.
2. **Slow work, share group** (``share_records_per_s``): as many ``ShareConsumer`` members
   of one share group, explicit acknowledgement: each record worked on, then
   ``acknowledge``d (ACCEPT), then ``commit_sync()``, and the batch counts when every
   partition's outcome is success. ``share_over_group_throughput`` = 2. / 1. (target >= 3;
   the ceiling is members / partitions = 4).
3. **No work, a plain group consumer** (``group_flat_records_per_s``): one member of a
   consumer group drains ``--flat-backlog`` records, committing after every poll.
4. **No work, the share group** (``share_flat_records_per_s``): the members drain the same
   backlog, acknowledging and committing after every poll. ``share_ack_over_group`` = 4. /
   3. (target >= 0.5): what per-record acquisition and acknowledgement (each a durable
   write of the share partition's state, `docs/share-groups.md`) cost against a consumer
   that only reads and commits an offset.

Every phase runs the same way: the members start, join and settle (the consumer group:
described with every member at the group's epoch and the two partitions held once; the
share group: each partition shared by ``ceil(members / 2)`` members, as the share
assignor spreads them, each having fetched once, which sets the share partitions' start
at the empty log's end); then they are told to hold (stop polling), the backlog is
produced (100-byte values, half to each partition), and "go". Both sides poll at most
``--max-poll-records`` (slow phases) or ``--flat-max-poll-records`` (no-work phases). A
member reports each completed batch with its time (``time.monotonic``, one clock for
every process on Linux) and how long its poll and its commit took (``*_poll_ms``,
``*_commit_ms``, means). Rate = records completed by the end of the window / the window,
where the window ends ``--seconds`` after "go" or when the backlog is done, whichever is
first. ``*_member_cpu_s`` and ``*_broker_cpu_s``: the CPU time the members and the broker
used in the window, to say where time goes; ``fsync_p50_ms``: a 100-byte append and
fsync in the broker's directory, the floor of every durable write. ``--profile FILE``
samples the broker with py-spy (``pip install py-spy``) in the slow share phase, or with
``--profile-phase share_flat`` the no-work one (collapsed stacks, GIL holders;
``--profile-native`` adds C frames).

**Members are processes, not threads**, one interpreter each, as deployed consumers are.
In threads of one process the members' own Python work (gRPC calls, decoding, the
heartbeat threads) would share one GIL: eight share members polling and acknowledging in
parallel would be serialized by the benchmark, not by Tidelog, while the group's two
working members hardly notice. As processes, the two cores are shared between the broker
and the members by the OS scheduler, as on a real two-core machine. The work is a sleep,
so it costs no CPU either way: the members' CPU is the client's overhead.

``--quick``: 3 members, 2 s windows, small backlogs (the smoke test). The machine is
shared and noisy: compare figures of one run only. The last line printed is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.kafka_bench import start_broker  # noqa: E402 - after the path entry above
from tidelog.client import AdminClient, Consumer, Producer, ShareConsumer  # noqa: E402

PARTITIONS = 2
VALUE_BYTES = 100
SETTLE_TIMEOUT_S = 60.0
BROKER_SETTINGS = {
    "group.consumer.heartbeat.interval.ms": 200,
    "group.share.min.heartbeat.interval.ms": 100,
    "group.share.heartbeat.interval.ms": 200,
    "group.initial.rebalance.delay.ms": 0,
}


# --- a member (its own process) -------------------------------------------------------------


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def member(raw: str) -> None:
    """One member: settle, hold, work from "go" until "stop" (commands on stdin)."""
    spec = json.loads(raw)
    commands: queue.Queue[str] = queue.Queue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("stop")

    threading.Thread(target=read_commands, daemon=True).start()
    work_s = spec["work_ms"] / 1000
    share = spec["kind"] == "share"
    consumer: Any
    if share:
        consumer = ShareConsumer(
            spec["address"],
            spec["group"],
            max_poll_records=spec["max_poll_records"],
            acknowledgement_mode="explicit",
        )
    else:
        consumer = Consumer(
            spec["address"],
            group_id=spec["group"],
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_poll_records=spec["max_poll_records"],
        )
    consumer.subscribe([spec["topic"]])
    ready = False
    assigned: list[int] = []
    command = ""
    while command != "hold":  # settle: the topic is empty until everyone holds
        if consumer.poll(timeout_ms=100):
            raise RuntimeError("records before the backlog was produced")
        if share:  # fetched once from what it holds (the share partitions start at 0)
            now = sorted(tp.partition for tp in consumer.assignment())
            if now != assigned:
                _emit({"e": "assigned", "p": now})
                assigned = now
        if not ready:
            _emit({"e": "ready"})
            ready = True
        command = _command(commands)
    _emit({"e": "held"})
    while (command := commands.get()) != "go":
        if command == "stop":
            consumer.close()
            return
    while _command(commands) != "stop":
        polled = time.monotonic()
        records = consumer.poll(timeout_ms=200)
        if not records:
            continue
        worked = time.monotonic()
        for record in records:
            if work_s:
                time.sleep(work_s)
            if share:
                consumer.acknowledge(record)
        committing = time.monotonic()
        if share:
            outcomes = consumer.commit_sync()
            failed = [str(error) for error in outcomes.values() if error is not None]
            if failed:
                _emit({"e": "failed", "errors": failed})
                continue
        else:
            consumer.commit()
        now = time.monotonic()
        _emit({"e": "done", "n": len(records), "t": now,
               "poll_s": worked - polled, "commit_s": now - committing})  # fmt: skip
    consumer.close()


def _command(commands: queue.Queue[str]) -> str:
    try:
        return commands.get_nowait()
    except queue.Empty:
        return ""


# --- the parent -----------------------------------------------------------------------------


@dataclass
class _Member:
    """A member process and what it reported (read by a thread of its own)."""

    process: subprocess.Popen[str]
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    done: list[tuple[int, float]] = field(default_factory=list)
    call_s: list[tuple[float, float]] = field(default_factory=list)  # (poll, commit) a batch
    assigned: list[int] = field(default_factory=list)  # a share member's partitions
    failures: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def close(self) -> None:
        """Wait for the process (killed after 30 s) and close its pipes."""
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.reader is not None:
            self.reader.join(10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:  # stdin: the flush of a pipe the member closed
                    pass

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def expect(self, word: str, deadline: float) -> None:
        while True:
            try:
                event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise RuntimeError(f"member {self.process.pid}: no {word!r}") from None
            if event["e"] == word:
                return
            if event["e"] == "exit":
                raise RuntimeError(f"member {self.process.pid} exited before {word!r}")


def _spawn(spec: dict[str, Any]) -> _Member:
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--member", json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    m = _Member(process)

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            event = json.loads(line)
            if event["e"] == "done":
                m.done.append((event["n"], event["t"]))
                m.call_s.append((event["poll_s"], event["commit_s"]))
            elif event["e"] == "assigned":
                m.assigned = event["p"]
            elif event["e"] == "failed":
                m.failures.extend(event["errors"])
            else:
                m.events.put(event)
        m.events.put({"e": "exit"})

    m.reader = threading.Thread(target=read, daemon=True)
    m.reader.start()
    return m


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _py_spy(pid: int, seconds: float, out: Path, native: bool = False) -> subprocess.Popen[bytes]:
    """py-spy sampling the broker for ``seconds`` (collapsed stacks, GIL holders only;
    ``native``: with C frames, which showed where the no-work phase's time outside Python
    goes: gRPC's own syscalls, made with the GIL held)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [spy, "record", "-p", str(pid), "-d", str(max(int(seconds), 1)), "-f", "raw",
         "-o", str(out), "--gil", "-r", "100" if native else "200",
         *(["--native"] if native else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def fsync_ms(directory: Path, samples: int = 200) -> float:
    """The median time of a 100-byte append and ``fsync`` in ``directory``: the floor of
    every durable share-state write."""
    times = []
    with (directory / "fsync-probe").open("ab") as out:
        for _ in range(samples):
            started = time.perf_counter()
            out.write(b"x" * VALUE_BYTES)
            out.flush()
            os.fsync(out.fileno())
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def _group_settled(admin: AdminClient, group: str, members: int) -> bool:
    described = admin.describe_group(group)
    held = [tp for m in described.members for tp in m.assignment]
    return (
        len(described.members) == members
        and sorted(tp.partition for tp in held) == list(range(PARTITIONS))
        and all(m.member_epoch == described.group_epoch for m in described.members)
    )


def _share_settled(procs: list[_Member]) -> bool:
    """Every member holds (and has fetched from) its share of the partitions: each
    partition ``ceil(members / partitions)`` members, as the share assignor spreads them."""
    sharing = -(-len(procs) // PARTITIONS)
    counts = [sum(p in m.assigned for m in procs) for p in range(PARTITIONS)]
    return all(m.assigned for m in procs) and counts == [sharing] * PARTITIONS


def _wait(condition: Any, what: str, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def run_phase(
    address: str,
    broker_pid: int,
    *,
    name: str,
    kind: str,
    members: int,
    work_ms: int,
    backlog: int,
    seconds: float,
    max_poll_records: int,
    profile: Path | None = None,
    profile_native: bool = False,
) -> dict[str, float]:
    """One phase (module docstring): records/s over the window, and the CPU it took."""
    topic = group = f"{name}-{kind}"
    with AdminClient(address) as admin:
        admin.create_topic(topic, PARTITIONS)
    spec = {
        "kind": kind, "address": address, "group": group, "topic": topic,
        "work_ms": work_ms, "max_poll_records": max_poll_records,
    }  # fmt: skip
    procs = [_spawn(spec) for _ in range(members)]
    try:
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        for m in procs:
            m.expect("ready", deadline)
        if kind == "group":
            with AdminClient(address) as admin:
                _wait(lambda: _group_settled(admin, group, members), f"group {group} to settle")
            time.sleep(0.5)  # the members' polls run the assignment they were given
        else:
            _wait(lambda: _share_settled(procs), f"share group {group} to settle")
        for m in procs:
            m.send("hold")
        for m in procs:
            m.expect("held", deadline)
        with Producer(address, acks="all", linger_ms=5) as producer:
            value = b"x" * VALUE_BYTES
            for i in range(backlog):
                producer.send(topic, value, partition=i % PARTITIONS)
            producer.flush()
        cpu_before = [_cpu_s(m.process.pid) for m in procs]
        broker_before = _cpu_s(broker_pid)
        go = time.monotonic()
        for m in procs:
            m.send("go")
        end = go + seconds
        spy = None if profile is None else _py_spy(broker_pid, seconds, profile, profile_native)

        def completed() -> int:
            return sum(n for m in procs for n, t in list(m.done) if t <= end)

        while time.monotonic() < end and completed() < backlog:
            time.sleep(0.05)
        if spy is not None:
            spy.wait(seconds + 30)
        member_cpu = sum(_cpu_s(m.process.pid) for m in procs) - sum(cpu_before)
        broker_cpu = _cpu_s(broker_pid) - broker_before
        finished = [t for m in procs for _, t in list(m.done) if t <= end]
        count = completed()
        window = (max(finished) if count >= backlog else end) - go
        failures = [f for m in procs for f in m.failures]
        if failures:
            raise RuntimeError(f"{name}: acknowledgements failed: {failures[:5]}")
        if count == 0:
            raise RuntimeError(f"{name}: nothing completed in {seconds} s")
        calls = [c for m in procs for c in list(m.call_s)]
        return {
            "records_per_s": count / window,
            "poll_ms": 1000 * statistics.mean(c[0] for c in calls),
            "commit_ms": 1000 * statistics.mean(c[1] for c in calls),
            "batches": len(calls),
            "records": count,
            "window_s": window,
            "member_cpu_s": member_cpu,
            "broker_cpu_s": broker_cpu,
            "working_members": sum(1 for m in procs if m.done),
        }
    finally:
        for m in procs:
            try:
                m.send("stop")
            except (BrokenPipeError, OSError):
                pass
        for m in procs:
            m.close()


@contextmanager
def _broker() -> Iterator[tuple[str, int, Path]]:
    """The broker process: its address, pid and work directory."""
    work = Path(tempfile.mkdtemp(prefix="tidelog-share-bench-"))
    process, address, _ = start_broker(work, BROKER_SETTINGS)
    try:
        yield address, process.pid, work
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--work-ms", type=int, default=5, help="sleep per record, slow phases")
    p.add_argument("--seconds", type=float, default=10.0, help="each phase's window at most")
    p.add_argument("--backlog", type=int, default=20_000, help="records, slow phases")
    p.add_argument("--flat-backlog", type=int, default=300_000, help="records, no-work phases")
    p.add_argument("--max-poll-records", type=int, default=10, help="slow phases")
    p.add_argument("--flat-max-poll-records", type=int, default=500, help="no-work phases")
    p.add_argument("--quick", action="store_true", help="3 members, 2 s, small backlogs")
    p.add_argument("--profile", type=Path, default=None,
                   help="py-spy the broker in a share phase (collapsed stacks)")  # fmt: skip
    p.add_argument("--profile-phase", choices=("share", "share_flat"), default="share",
                   help="what --profile samples: slow (share) or no-work (share_flat)")  # fmt: skip
    p.add_argument("--profile-native", action="store_true", help="--profile with C frames")
    p.add_argument("--member", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.member:
        member(args.member)
        return {}
    if args.quick:
        args.members, args.seconds, args.backlog, args.flat_backlog = 3, 2.0, 2_000, 5_000
    started = time.monotonic()
    results: dict[str, Any] = {
        "members": args.members,
        "partitions": PARTITIONS,
        "work_ms": args.work_ms,
        "max_poll_records": args.max_poll_records,
        "seconds": args.seconds,
        "loadavg_start": round(os.getloadavg()[0], 2),
    }
    slow = {"work_ms": args.work_ms, "backlog": args.backlog, "seconds": args.seconds,
            "max_poll_records": args.max_poll_records}  # fmt: skip
    flat = {"work_ms": 0, "backlog": args.flat_backlog, "seconds": args.seconds,
            "max_poll_records": args.flat_max_poll_records}  # fmt: skip
    profiles: dict[str, Path | None] = {"share": None, "share_flat": None}
    profiles[args.profile_phase] = args.profile
    with _broker() as (address, pid, work):
        results["fsync_p50_ms"] = round(fsync_ms(work), 3)
        phases = {
            "group": run_phase(address, pid, name="slow", kind="group",
                               members=args.members, **slow),
            "share": run_phase(address, pid, name="slow", kind="share", members=args.members,
                               profile=profiles["share"], profile_native=args.profile_native,
                               **slow),
            "group_flat": run_phase(address, pid, name="flat", kind="group", members=1, **flat),
            "share_flat": run_phase(address, pid, name="flat", kind="share",
                                    members=args.members, profile=profiles["share_flat"],
                                    profile_native=args.profile_native, **flat),
        }  # fmt: skip
    for phase, figures in phases.items():
        results[f"{phase}_records_per_s"] = round(figures["records_per_s"])
        results[f"{phase}_records"] = int(figures["records"])
        results[f"{phase}_window_s"] = round(figures["window_s"], 2)
        results[f"{phase}_member_cpu_s"] = round(figures["member_cpu_s"], 2)
        results[f"{phase}_broker_cpu_s"] = round(figures["broker_cpu_s"], 2)
        results[f"{phase}_working_members"] = int(figures["working_members"])
        results[f"{phase}_batches"] = int(figures["batches"])
        results[f"{phase}_poll_ms"] = round(figures["poll_ms"], 2)
        results[f"{phase}_commit_ms"] = round(figures["commit_ms"], 2)
    results["share_over_group_throughput"] = round(
        phases["share"]["records_per_s"] / phases["group"]["records_per_s"], 3
    )
    results["share_ack_over_group"] = round(
        phases["share_flat"]["records_per_s"] / phases["group_flat"]["records_per_s"], 3
    )
    results["loadavg_end"] = round(os.getloadavg()[0], 2)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
