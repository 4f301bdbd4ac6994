"""Command line of the broker daemon: ``tidelog serve`` / ``python -m broker``.

::

    python -m broker [serve] [--config FILE.toml] [--data-dir DIR] [--listen HOST:PORT]
                     [--set KEY=VALUE]... [--log-level LEVEL] [--ready-file PATH]
    python -m broker healthcheck [--address HOST:PORT] [--timeout-ms MS] [--cafile CA.pem]
    python -m broker add-user NAME --data-dir DIR [--mechanism M]... [--iterations N]
                     (the password on stdin; ``tidelog users add --data-dir`` calls this)

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
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidelog.broker.cluster.errors import StoreError
from tidelog.broker.config import DEFAULT_LISTEN, BrokerConfig, load_toml
from tidelog.broker.core.audit import audit
from tidelog.broker.core.scram import MIN_ITERATIONS, ScramError, credential_from_password
from tidelog.broker.core.users import FileUserStore, check_user_name
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
    if args.ready_file:
        atomic_write(args.ready_file, f"{server.address}\n".encode())
    try:
        run_until_signalled(server)
    finally:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``[serve] ARGS``, ``healthcheck ARGS`` or ``add-user ARGS``; returns
    the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "healthcheck":
        return healthcheck(args[1:])
    if args and args[0] == "add-user":
        return add_user(args[1:])
    if args and args[0] == "serve":
        args = args[1:]
    return serve(args)
