"""Tidelog against the systems users would pick instead: NATS JetStream and Redis Streams.

::

    python benchmarks/run.py [--quick] [--peers tidelog,nats,redis]
                             [--workloads produce,consume,latency,end_to_end,partitions,backlog]
                             [--records N] [--samples N] [--value-sizes 100,1024]
                             [--partition-counts 1,4,16] [--backlog-bytes B]
                             [--backlog-step-bytes B] [--no-install] [--out DIR]

Starts every server itself on 127.0.0.1 (free ports, temporary data directories, each in a
process group of its own) and stops it when done, also on Ctrl-C or an error. NATS and
Redis come from Debian (``nats-server``, ``redis-server``): a missing one is installed with
``apt-get`` when running as root, unless ``--no-install``; otherwise that peer is skipped
with the reason in the report. Their Python clients come from the ``bench`` extra
(``pip install -e '.[bench]'``).

For each peer and value size a fresh server runs: produce throughput with durable
acknowledgement, consume throughput from the start, produce latency of single acknowledged
records, end-to-end latency to a waiting consumer. For Tidelog only: 1, 4 and 16 partitions,
and the append rate while the retained log grows to ``--backlog-bytes``. Each measurement is
a worker process of its own (``benchmarks.peers.worker``). Writes ``results.json``,
``results.md`` and PNG charts into ``--out`` (``benchmarks/results``; ``--quick`` writes to
``benchmarks/results/quick``); ``run.py --report-only [results.json]`` redraws the markdown
and charts from a results file. How each peer is configured: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# E402: these imports need ROOT on sys.path, which the lines above put there.
from benchmarks.peers import PEERS, report, tidelog_peer  # noqa: E402
from benchmarks.peers.common import (  # noqa: E402
    LATENCY_WARMUP,
    Workload,
    directory_bytes,
    ensure_debian_packages,
    process_cpu_s,
)

BASIC_WORKLOADS = ("produce", "consume", "latency", "end_to_end")
# A row of its own in the report: Tidelog with the durability the peers acknowledge with.
ACKS1_PEER = "tidelog-acks1"
ACKS1_WORKLOADS = ("produce", "latency", "end_to_end")
ALL_WORKLOADS = (*BASIC_WORKLOADS, "partitions", "backlog")
MACHINE_NOTE = (
    "The machine is shared with other engineers running tests: figures are noisy "
    "(run-to-run spread of 10-20% is normal here); compare peers within one run."
)


@dataclass(slots=True)
class Settings:
    """What to run; built from the command line."""

    peers: list[str]
    workloads: list[str]
    records: int
    samples: int
    value_sizes: list[int]
    partition_counts: list[int]
    partition_value_bytes: int
    backlog_bytes: int
    backlog_step_bytes: int
    backlog_value_bytes: int
    install: bool
    out_dir: Path
    quick: bool
    tidelog_acks1: bool = True
    worker_timeout_s: float = 1800.0
    command: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --- machine and versions -------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU count and model, memory, kernel, Python and library versions, load average."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_packages": {
            name: _package_version(name)
            for name in ("grpcio", "protobuf", "lz4", "nats-py", "redis", "hiredis", "matplotlib")
        },
        "loadavg_start": _loadavg(),
        "note": MACHINE_NOTE,
    }


def _client_description(name: str) -> str:
    if name == "tidelog":
        return f"client/ (grpcio {_package_version('grpcio')})"
    if name == "tidelog-kafka":
        return f"confluent-kafka {_package_version('confluent-kafka')}"
    if name == "nats":
        return f"nats-py {_package_version('nats-py')}"
    if name == "redis":
        hiredis = _package_version("hiredis")
        parser = f"hiredis {hiredis} parser" if hiredis else "pure-Python parser (no hiredis)"
        return f"redis-py {_package_version('redis')}, {parser}"
    return "unknown"


def _client_missing(name: str) -> str | None:
    needed = {
        "nats": ["nats-py"],
        "redis": ["redis", "hiredis"],
        "tidelog-kafka": ["confluent-kafka"],
    }.get(name, [])
    missing = [pkg for pkg in needed if _package_version(pkg) is None]
    if missing:
        return f"Python package(s) {', '.join(missing)} missing: pip install -e '.[bench]'"
    return None


# --- progress ---------------------------------------------------------------------------------


class Progress:
    """A tqdm bar when tqdm is installed, else one line per step on stderr."""

    def __init__(self, total: int) -> None:
        self.done = 0
        self.total = total
        self.started = time.monotonic()
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar: Any = None
        else:
            self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text)
        else:
            sys.stderr.write(f"[{self.done}/{self.total}] {text}\n")

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            sys.stderr.write(text + "\n")

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --- workers -----------------------------------------------------------------------------------


def run_worker(
    peer: str, address: str, workload: Workload, timeout_s: float, progress: Progress
) -> dict[str, Any]:
    """Run one workload in a worker process; its figures, or RuntimeError with its stderr."""
    argv = [
        sys.executable,
        "-m",
        "benchmarks.peers.worker",
        "--peer",
        peer,
        "--address",
        address,
        "--workload",
        json.dumps(asdict(workload)),
    ]
    tidelog = tidelog_peer
    with (
        tempfile.TemporaryFile() as out,
        subprocess.Popen(
            argv,
            cwd=tidelog.source_root,  # `-m` puts the cwd first on sys.path
            env=tidelog.python_env(),
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        ) as process,
    ):
        errors: list[str] = []

        def pump() -> None:  # progress lines to the bar, the rest kept for the error
            assert process.stderr is not None
            for line in process.stderr:
                if line.startswith("progress "):
                    progress.note(line.split(" ", 1)[1].strip())
                else:
                    errors.append(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            status = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise RuntimeError(f"timed out after {timeout_s:.0f} s") from None
        finally:
            reader.join(5)
        out.seek(0)
        stdout = out.read().decode(errors="replace").strip()
    if status != 0 or not stdout:
        tail = "".join(errors[-15:]).strip()
        raise RuntimeError(f"worker exited with status {status}: {tail}")
    figures: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    return figures


# --- the run -------------------------------------------------------------------------------


@dataclass(slots=True)
class Step:
    """One bar step: a workload to run against one server."""

    peer: str
    kind: str
    value_bytes: int
    partitions: int = 1
    acks: str = "all"

    @property
    def worker_peer(self) -> str:
        """The peer module that runs it: the acks=1 variant is Tidelog's own."""
        return "tidelog" if self.peer == ACKS1_PEER else self.peer


def plan(settings: Settings, peers: list[str]) -> list[list[Step]]:
    """Steps grouped by server lifetime: each group runs against one fresh server."""
    groups: list[list[Step]] = []
    basic = [kind for kind in BASIC_WORKLOADS if kind in settings.workloads]
    for peer in peers:
        for size in settings.value_sizes:
            if not basic:
                continue
            group = [Step(peer, kind, size) for kind in basic]
            if peer == "tidelog" and settings.tidelog_acks1:
                group += [
                    Step(ACKS1_PEER, kind, size, acks="1")
                    for kind in basic
                    if kind in ACKS1_WORKLOADS
                ]
            groups.append(group)
        if peer != "tidelog":
            continue
        if "partitions" in settings.workloads:
            groups.append(
                [
                    Step(peer, "partitions", settings.partition_value_bytes, count)
                    for count in settings.partition_counts
                ]
            )
        if "backlog" in settings.workloads:
            groups.append([Step(peer, "backlog", settings.backlog_value_bytes)])
    return groups


def _workloads_for(step: Step, settings: Settings, tag: str) -> list[Workload]:
    stream = f"bench-{step.kind.replace('_', '-')}-{step.value_bytes}-{step.acks}-{tag}"
    if step.kind in ("produce", "consume"):
        stream = f"bench-throughput-{step.value_bytes}-{step.acks}-{tag}"
        planned = [
            Workload(step.kind, stream, step.value_bytes, records=settings.records, acks=step.acks)
        ]
        if step.kind == "consume" and step.peer == "tidelog":
            # The same records over a bare FetchStream right after: the transport's ceiling.
            planned.append(replace(planned[0], kind="consume_bare"))
        return planned
    if step.kind in ("latency", "end_to_end"):
        return [
            Workload(step.kind, stream, step.value_bytes, samples=settings.samples, acks=step.acks)
        ]
    if step.kind == "partitions":
        stream = f"bench-partitions-{step.partitions}-{tag}"
        return [
            Workload(
                kind, stream, step.value_bytes, records=settings.records, partitions=step.partitions
            )
            for kind in ("produce", "consume")
        ]
    if step.kind == "backlog":
        return [
            Workload(
                "backlog",
                f"bench-backlog-{tag}",
                step.value_bytes,
                step_bytes=settings.backlog_step_bytes,
                total_bytes=settings.backlog_bytes,
            )
        ]
    raise ValueError(step.kind)


def run(settings: Settings) -> dict[str, Any]:
    """Run everything ``settings`` asks for; returns the results document (also written)."""
    doc: dict[str, Any] = {
        "schema": 1,
        "created_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": settings.command,
        "quick": settings.quick,
        "machine": machine_info(),
        "settings": {
            "records": settings.records,
            "samples": settings.samples,
            "warmup": LATENCY_WARMUP,
            "key_bytes": 16,
            "value_sizes": settings.value_sizes,
            "workloads": settings.workloads,
            "partition_counts": settings.partition_counts,
            "partition_value_bytes": settings.partition_value_bytes,
            "backlog_bytes": settings.backlog_bytes,
            "backlog_step_bytes": settings.backlog_step_bytes,
            "backlog_value_bytes": settings.backlog_value_bytes,
        },
        "peers": {},
        "results": [],
        "errors": [],
    }
    ready: list[str] = []
    for name in settings.peers:
        module: ModuleType = PEERS[name]
        missing = ensure_debian_packages(module.BINARIES, settings.install)
        reason = "; ".join(missing.values()) or _client_missing(name)
        doc["peers"][name] = {
            "label": module.LABEL,
            "version": module.version(),
            "client": _client_description(name),
            "configuration": module.CONFIGURATION,
            "skipped": reason,
        }
        if reason:
            sys.stderr.write(f"skipping {module.LABEL}: {reason}\n")
        else:
            ready.append(name)
    if "tidelog" in ready and settings.tidelog_acks1:
        acks1 = {
            **doc["peers"]["tidelog"],
            "label": PEERS["tidelog"].ACKS1_LABEL,
            "configuration": PEERS["tidelog"].ACKS1_CONFIGURATION,
        }
        names = list(doc["peers"])  # the acks=1 row right below Tidelog's
        names.insert(names.index("tidelog") + 1, ACKS1_PEER)
        doc["peers"] = {name: doc["peers"].get(name, acks1) for name in names}

    groups = plan(settings, ready)
    floor = "tidelog" in ready and bool({"latency", "end_to_end"} & set(settings.workloads))
    progress = Progress(sum(len(group) for group in groups) + floor)
    work_root = Path(tempfile.mkdtemp(prefix="tidelog-peers-"))
    try:
        if floor:
            progress.describe("bare gRPC round trip (Tidelog's transport floor)")
            doc["reference"] = {"grpc_floor": grpc_floor(work_root, settings.samples)}
            progress.advance()
        for index, group in enumerate(groups):
            _run_group(settings, doc, group, work_root / f"server-{index}", progress)
    finally:
        progress.close()
        shutil.rmtree(work_root, ignore_errors=True)
    doc["machine"]["loadavg_end"] = _loadavg()
    doc["machine"]["elapsed_s"] = round(time.monotonic() - progress.started, 1)
    write_outputs(doc, settings.out_dir)
    return doc


def _run_group(
    settings: Settings, doc: dict[str, Any], group: list[Step], work: Path, progress: Progress
) -> None:
    first = group[0]
    module = PEERS[first.worker_peer]
    label = module.LABEL
    work.mkdir(parents=True)
    progress.describe(f"{label}: starting")
    try:
        server = module.start(work)
    except Exception as exc:  # a server that cannot start is reported, the rest runs
        for step in group:
            _error(doc, step, f"server did not start: {exc}", progress)
            progress.advance()
        return
    try:
        tag = work.name
        for step in group:
            size = f"{step.value_bytes} B"
            detail = f" x{step.partitions}" if step.kind == "partitions" else ""
            variant = " acks=1" if step.peer == ACKS1_PEER else ""
            progress.describe(f"{label}{variant}: {step.kind}{detail} {size}")
            progress.note("")
            entry: dict[str, Any] = {
                "peer": step.peer,
                "workload": step.kind,
                "value_bytes": step.value_bytes,
                "partitions": step.partitions,
                "loadavg": _loadavg(),
            }
            try:
                figures = []
                for planned in _workloads_for(step, settings, tag):
                    workload = replace(planned, server_pid=server.process.process.pid)
                    # Write back what earlier runs left dirty in the page cache first, so
                    # their writeback does not land in this run's fsyncs or latencies.
                    os.sync()
                    server_cpu = process_cpu_s(server.process.process.pid)
                    answer = run_worker(
                        step.worker_peer,
                        server.address,
                        workload,
                        settings.worker_timeout_s,
                        progress,
                    )
                    cpu = process_cpu_s(server.process.process.pid) - server_cpu
                    answer["server_cpu_s"] = round(cpu, 3)
                    figures.append(answer)
            except RuntimeError as exc:
                _error(doc, step, str(exc), progress)
            else:
                if step.kind == "partitions":
                    entry["figures"] = {"produce": figures[0], "consume": figures[1]}
                elif len(figures) == 2:  # Tidelog's consume, then the bare FetchStream
                    entry["figures"] = {**figures[0], "bare_fetch_stream": figures[1]}
                elif step.kind == "backlog":
                    entry["figures"] = figures[0]
                    entry["figures"]["data_dir_bytes"] = directory_bytes(server.data_dir)
                    entry["figures"]["summary"] = report.backlog_summary(figures[0]["steps"])
                else:
                    entry["figures"] = figures[0]
                doc["results"].append(entry)
                progress.write(_one_line(label + variant, step, entry["figures"]))
            progress.advance()
    finally:
        progress.describe(f"{label}: stopping")
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def grpc_floor(work: Path, samples: int) -> dict[str, Any]:
    """A bare grpcio round trip to an echo server, no Tidelog (``client_bench``'s floor).

    Tidelog's single-record latency cannot go below it: it is what the transport costs in
    Python before the broker does anything.
    """
    from benchmarks import client_bench

    work.mkdir(parents=True, exist_ok=True)
    echo, address = client_bench.start_echo_server(work)
    try:
        os.sync()
        figures = client_bench._run_role(
            "--role", "grpc-floor", "--address", address, "--count", str(samples)
        )
    finally:
        client_bench.stop(echo)
        if echo.stdout is not None:  # client_bench's stop leaves the pipe to its caller
            echo.stdout.close()
    return {key: round(value, 3) for key, value in figures.items()}


def _error(doc: dict[str, Any], step: Step, message: str, progress: Progress) -> None:
    doc["errors"].append(
        {
            "peer": step.peer,
            "workload": step.kind,
            "value_bytes": step.value_bytes,
            "partitions": step.partitions,
            "error": message,
        }
    )
    progress.write(
        f"{PEERS[step.worker_peer].LABEL} {step.kind} {step.value_bytes} B failed: {message}"
    )


def _one_line(label: str, step: Step, figures: dict[str, Any]) -> str:
    head = f"{label:18} {step.kind:10} {step.value_bytes:>5} B"
    if step.kind in ("produce", "consume"):
        line = f"{head}: {figures['records_per_s']:>9,} records/s {figures['mb_per_s']:>7.1f} MB/s"
        bare = figures.get("bare_fetch_stream")
        if bare:
            line += f" (bare FetchStream {bare['mb_per_s']:.1f} MB/s)"
        return line
    if step.kind in ("latency", "end_to_end"):
        return (
            f"{head}: p50 {figures['p50_ms']:.3f} p99 {figures['p99_ms']:.3f} "
            f"p99.9 {figures['p999_ms']:.3f} ms"
        )
    if step.kind == "partitions":
        return (
            f"{head} x{step.partitions}: produce {figures['produce']['records_per_s']:,}"
            f" consume {figures['consume']['records_per_s']:,} records/s"
        )
    summary = figures["summary"]
    return (
        f"{head}: {summary['steps']} steps, {summary['first_mb_per_s']} -> "
        f"{summary['last_mb_per_s']} MB/s"
    )


def write_outputs(doc: dict[str, Any], out_dir: Path) -> None:
    """``results.json``, the PNG charts and ``results.md`` (which links the charts)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for entry in doc["results"]:
        if entry["workload"] == "backlog":
            entry["figures"]["summary"] = report.backlog_summary(entry["figures"]["steps"])
    written = report.charts(doc, out_dir)
    doc["charts"] = [path.name for path in written]
    (out_dir / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "results.md").write_text(report.markdown(doc))


# --- command line --------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _names(text: str, allowed: tuple[str, ...] | list[str], what: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what}: {', '.join(unknown)}")
    return names


def parse_settings(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke check in under two minutes: 20k records, 300 samples, a 32 MB backlog",
    )
    parser.add_argument(
        "--peers", default=",".join(PEERS), type=lambda t: _names(t, list(PEERS), "peer")
    )
    parser.add_argument(
        "--workloads",
        default=",".join(ALL_WORKLOADS),
        type=lambda t: _names(t, ALL_WORKLOADS, "workload"),
    )
    parser.add_argument("--records", type=int, help="records a throughput run (1,000,000)")
    parser.add_argument("--samples", type=int, help="samples a latency run (10,000)")
    parser.add_argument("--value-sizes", type=_int_list, default=[100, 1024])
    parser.add_argument("--partition-counts", type=_int_list, default=[1, 4, 16])
    parser.add_argument("--backlog-bytes", type=int, help="bytes to retain (5 GB)")
    parser.add_argument("--backlog-step-bytes", type=int, help="bytes a step (250 MB)")
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="never apt-get install a missing server: skip that peer",
    )
    parser.add_argument("--out", type=Path, help="output directory (benchmarks/results)")
    parser.add_argument(
        "--tidelog-root",
        type=Path,
        help="take storage/ broker/ client/ proto/ from this directory instead of this "
        "checkout (e.g. a `git archive HEAD` snapshot)",
    )
    parser.add_argument(
        "--no-tidelog-acks1", action="store_true", help="skip the Tidelog acks=1 reference rows"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    records = args.records or (20_000 if quick else 1_000_000)
    backlog = args.backlog_bytes or (32_000_000 if quick else 5_000_000_000)
    step = args.backlog_step_bytes or (backlog // 8 if quick else 250_000_000)
    out = args.out or (ROOT / "benchmarks" / "results" / ("quick" if quick else ""))
    if args.tidelog_root is not None:
        if not (args.tidelog_root / "tidelog" / "__init__.py").exists():
            # Without it `tidelog` would come from this checkout: a silent self-comparison.
            # A tree from before the installed name (issue #26) needs tidelog/ added: the
            # five links and an empty __init__.py (docs/benchmarks.md).
            parser.error(f"--tidelog-root {args.tidelog_root}: no tidelog/ package there")
        tidelog_peer.source_root = args.tidelog_root.resolve()
    return Settings(
        peers=args.peers,
        workloads=args.workloads,
        records=records,
        samples=args.samples or (300 if quick else 10_000),
        value_sizes=args.value_sizes,
        partition_counts=args.partition_counts,
        partition_value_bytes=100,
        backlog_bytes=backlog,
        backlog_step_bytes=min(step, backlog),
        backlog_value_bytes=1024,
        install=not args.no_install,
        out_dir=out,
        quick=quick,
        tidelog_acks1=not args.no_tidelog_acks1,
        # A quick run's workers take seconds: one stuck for minutes is a hang to report.
        worker_timeout_s=300.0 if quick else 1800.0,
        command="python benchmarks/run.py" + "".join(f" {a}" for a in argv),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--report-only"]:
        # Redraw results.md and the charts from a results.json (after changing the report).
        source = (
            Path(args[1]) if len(args) > 1 else ROOT / "benchmarks" / "results" / "results.json"
        )
        doc = json.loads(source.read_text())
        write_outputs(doc, source.parent)
        print(f"rewrote {source.parent}/results.md and {len(doc['charts'])} charts")
        return 0
    settings = parse_settings(args)
    try:
        doc = run(settings)
    except KeyboardInterrupt:  # the servers were stopped and their data removed on the way
        sys.stderr.write("\ninterrupted: every server stopped, temporary data removed\n")
        return 130
    print((settings.out_dir / "results.md").read_text())
    print(f"wrote {settings.out_dir}/results.json, results.md and {len(doc['charts'])} charts")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
