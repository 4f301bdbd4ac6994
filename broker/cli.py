"""Command line of the broker daemon: ``tidelog serve`` / ``python -m broker``.

::

    python -m broker [serve] [--config FILE.toml] [--data-dir DIR] [--listen HOST:PORT]
                     [--set KEY=VALUE]... [--log-level LEVEL] [--ready-file PATH]
    python -m broker healthcheck [--address HOST:PORT] [--timeout-ms MS] [--cafile CA.pem]
    python -m broker add-user NAME --data-dir DIR [--mechanism M]... [--iterations N]
                     (the password on stdin; ``tidelog users add --data-dir`` calls this)
    python -m broker cluster-up [--brokers N] [--data-dir D] [--base-port B] [--set K=V]...
                     (``tidelog cluster up``: ZooKeeper and N brokers in the foreground,
                     ``broker.cluster_up``)

Settings: the embedded defaults, then the TOML file, then each ``--set`` (Kafka's broker
names, see ``broker.config``), then ``--data-dir`` / ``--listen``. ``--ready-file`` names a
file that receives ``HOST:PORT`` (written atomically) once the broker serves: scripts and
tests that start it on port 0 read the bound port from it.

``healthcheck`` asks a broker's standard gRPC health service and exits 0 if it is serving
(the Docker health check uses it). Exit status: 0 success, 1 failure at run time, 2 bad
arguments or settings. This is the only module of the broker that writes to the terminal.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidelog.broker.cluster.errors import StoreError
from tidelog.broker.cluster.testing import ZOOKEEPER_JAR
from tidelog.broker.cluster_up import (
    DEFAULT_BASE_PORT,
    DEFAULT_BROKERS,
    ClusterUpError,
    LocalClusterProcesses,
    existing_broker_ids,
)
from tidelog.broker.config import DEFAULT_LISTEN, BrokerConfig, load_toml
from tidelog.broker.core.audit import audit
from tidelog.broker.core.scram import MIN_ITERATIONS, ScramError, credential_from_password
from tidelog.broker.core.users import FileUserStore, check_user_name
from tidelog.broker.gc_freeze import GcFreezer
from tidelog.broker.loop_watchdog import ProcessStallDump, register_dump_signal
from tidelog.broker.malloc import tune_malloc
from tidelog.broker.server import BrokerServer, ListenError, run_until_signalled
from tidelog.storage.errors import InvalidConfigError, InvalidRequestError, StorageError
from tidelog.storage.files import atomic_write

__all__ = ["main"]

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidelog serve",
        description=(
            "Run the Tidelog broker daemon. Security: the listener's scheme decides, as in "
            "Kafka: security.protocol (or listeners=SCHEME://HOST:PORT) picks PLAINTEXT, SSL, "
            "SASL_PLAINTEXT or SASL_SSL; ssl.* settings are ignored without SSL/SASL_SSL and "
            "sasl.* without SASL_*, each with a warning at start (docs/security.md)."
        ),
        epilog="`python -m broker healthcheck --help` for the health probe.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file of broker settings")
    parser.add_argument("--data-dir", metavar="DIR", help="data directory (log.dirs)")
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help=f"gRPC address (listeners); {DEFAULT_LISTEN}"
    )
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a broker setting by its Kafka name, e.g. log.retention.ms=3600000 (repeatable)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    parser.add_argument("--ready-file", metavar="PATH", help="write HOST:PORT here once serving")
    return parser


def _health_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m broker healthcheck", description="Probe a broker's health service."
    )
    parser.add_argument("--address", default=DEFAULT_LISTEN, metavar="HOST:PORT")
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument(
        "--cafile", metavar="FILE", help="the listener speaks TLS: verify it with this CA"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    """Merge file, ``--set`` and flags into a ``BrokerConfig``.

    Raises:
        InvalidConfigError: a bad file, key or value.
    """
    settings: dict[str, object] = {}
    if args.config:
        settings.update(load_toml(args.config))
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidConfigError(f"--set expects KEY=VALUE, got {item!r}")
        settings[key.strip()] = value
    if args.data_dir is not None:
        settings.pop("log.dir", None)
        settings["log.dirs"] = args.data_dir
    if args.listen is not None:
        settings["listeners"] = args.listen
    return BrokerConfig.from_mapping(settings)


def serve(argv: Sequence[str]) -> int:
    """``tidelog serve``: run until SIGTERM/SIGINT; returns the exit status."""
    args = _parser().parse_args(list(argv))
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
    except InvalidConfigError as exc:
        sys.stderr.write(f"tidelog serve: {exc}\n")
        return 2
    tune_malloc()
    try:
        server = BrokerServer.start(config)
    except (StorageError, ListenError, OSError, InvalidConfigError, StoreError) as exc:
        sys.stderr.write(f"tidelog serve: cannot start: {exc}\n")
        return 1
    register_dump_signal()
    stall_dump = ProcessStallDump().start()
    # The loaded logs frozen out of the collector's walks (issue #34: full collections
    # of 300-500 ms every few seconds at 10,000 partitions); this process only.
    freezer = GcFreezer().start()
    if args.ready_file:
        atomic_write(args.ready_file, f"{server.address}\n".encode())
    try:
        run_until_signalled(server)
    finally:
        freezer.stop()
        stall_dump.stop()
    return 0


def healthcheck(argv: Sequence[str]) -> int:
    """``healthcheck``: 0 if the broker at ``--address`` reports SERVING, else 1."""
    args = _health_parser().parse_args(list(argv))
    if args.cafile:  # health needs no login, but a TLS listener needs TLS
        credentials = grpc.ssl_channel_credentials(Path(args.cafile).read_bytes())
        channel = grpc.secure_channel(args.address, credentials)
    else:
        channel = grpc.insecure_channel(args.address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout_ms / 1000.0
            )
        except grpc.RpcError as exc:
            sys.stderr.write(f"unhealthy: {exc.code().name}\n")
            return 1
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        sys.stderr.write(f"unhealthy: {status}\n")
        return 1
    return 0


def add_user(argv: Sequence[str]) -> int:
    """``add-user``: store a SCRAM user in a data directory before the broker starts (the
    first super user). The password is the first line of stdin; only its salted hashes
    are written (``broker.core.users``)."""
    parser = argparse.ArgumentParser(prog="tidelog users add --data-dir")
    parser.add_argument("name")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--mechanism", action="append", default=[])
    parser.add_argument("--iterations", type=int, default=MIN_ITERATIONS)
    args = parser.parse_args(list(argv))
    password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        sys.stderr.write("tidelog users add: empty password\n")
        return 2
    try:
        check_user_name(args.name)
        Path(args.data_dir).mkdir(parents=True, exist_ok=True)
        store = FileUserStore.open(args.data_dir)
        for mechanism in args.mechanism or ["SCRAM-SHA-256", "SCRAM-SHA-512"]:
            store.upsert(
                args.name, credential_from_password(mechanism.upper(), password, args.iterations)
            )
    except (ScramError, InvalidConfigError, InvalidRequestError, OSError) as exc:
        sys.stderr.write(f"tidelog users add: {exc}\n")
        return 2
    audit({"event": "user_upserted", "user": args.name, "principal": None, "peer": "offline"})
    return 0


def _cluster_up_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidelog cluster up",
        description=(
            "Run a local cluster to try cluster mode: a ZooKeeper and N brokers on "
            "127.0.0.1, in the foreground until Ctrl-C or SIGTERM. Everything is kept in "
            "the data directory: the same --data-dir brings the same cluster back (same "
            "broker ids, same data). ZooKeeper comes from Debian's libzookeeper-java "
            f"({ZOOKEEPER_JAR}) on Java 17: apt-get install libzookeeper-java."
        ),
        epilog=(
            "Ports from the base port B: ZooKeeper B; broker i's gRPC B+10*i, Kafka "
            "B+10*i+1, metrics B+10*i+2."
        ),
    )
    parser.add_argument(
        "--brokers",
        type=int,
        metavar="N",
        help=f"how many brokers (ids 1..N); default: as many as DIR holds, else {DEFAULT_BROKERS}",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        default="tidelog-cluster",
        help="the cluster's directory (ZooKeeper's data, one per broker, logs); "
        "default ./tidelog-cluster",
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        metavar="B",
        help=f"first port of the block the cluster uses (default {DEFAULT_BASE_PORT})",
    )
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a setting for every broker, by its Kafka name (repeatable)",
    )
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ERROR")
    return parser


def cluster_up(argv: Sequence[str]) -> int:
    """``tidelog cluster up``: start, print the addresses, wait for SIGTERM/SIGINT, stop.

    Exit status 0 after a clean stop, 1 when the cluster could not start, 2 bad arguments.
    """
    args = _cluster_up_parser().parse_args(list(argv))
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings: dict[str, str] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            sys.stderr.write(f"tidelog cluster up: --set expects KEY=VALUE, got {item!r}\n")
            return 2
        settings[key.strip()] = value
    data_dir = Path(args.data_dir)
    brokers = args.brokers or len(existing_broker_ids(data_dir)) or DEFAULT_BROKERS
    try:
        cluster = LocalClusterProcesses(
            data_dir, brokers=brokers, base_port=args.base_port, settings=settings
        )
    except ValueError as exc:
        sys.stderr.write(f"tidelog cluster up: {exc}\n")
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # SIGHUP too: a closed terminal stops the cluster cleanly rather than leaving the
    # children to die with this process (SIGKILL, ZooKeeper sessions left to expire).
    stopping = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in stopping}
    try:
        sys.stdout.write(f"Starting ZooKeeper and {brokers} broker(s) in {cluster.data_dir}...\n")
        sys.stdout.flush()
        try:
            cluster.start()
        except ClusterUpError as exc:
            sys.stderr.write(f"tidelog cluster up: cannot start: {exc}\n")
            return 1
        _print_cluster(cluster)
        left = [i for i in existing_broker_ids(data_dir) if i not in cluster.broker_ids]
        if left:
            sys.stderr.write(
                f"note: {data_dir} also holds broker(s) {left}, not started (--brokers {brokers})\n"
            )
        reported: set[int] = set()
        while not stop.wait(0.5):
            for broker_id, code in cluster.exited().items():
                if broker_id not in reported:
                    reported.add(broker_id)
                    log_file = cluster.addresses(broker_id).log_file
                    sys.stderr.write(
                        f"broker {broker_id} exited with status {code} (its log: {log_file})\n"
                    )
        sys.stdout.write("Stopping the brokers, then ZooKeeper...\n")
        sys.stdout.flush()
        cluster.stop()
        sys.stdout.write(f"Stopped. The data stays in {cluster.data_dir}.\n")
        return 0
    finally:
        cluster.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _print_cluster(cluster: LocalClusterProcesses) -> None:
    lines = [f"ZooKeeper: {cluster.zookeeper_connect}"]
    for broker_id in cluster.broker_ids:
        a = cluster.addresses(broker_id)
        lines.append(
            f"broker {broker_id}: gRPC {a.grpc}  Kafka {a.kafka}  metrics {a.metrics}  "
            f"data {a.data_dir}  log {a.log_file}"
        )
    lines += [
        f"gRPC bootstrap: {cluster.bootstrap}",
        f"Kafka bootstrap: {cluster.kafka_bootstrap}",
        "Ctrl-C or SIGTERM stops the cluster; the same --data-dir starts it again.",
        "",
    ]
    sys.stdout.write("\n".join(lines))
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``[serve] ARGS``, ``healthcheck ARGS``, ``add-user ARGS`` or
    ``cluster-up ARGS``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "cluster-up":
        return cluster_up(args[1:])
    if args and args[0] == "healthcheck":
        return healthcheck(args[1:])
    if args and args[0] == "add-user":
        return add_user(args[1:])
    if args and args[0] == "serve":
        args = args[1:]
    return serve(args)
