"""Security benchmark: throughput and latency over TLS + SCRAM against plaintext.

::

    python benchmarks/security_bench.py [--megabytes 128] [--rounds 3] [--quick]

Two broker processes (``python -m broker``, temporary data directories, 127.0.0.1,
metrics off) run side by side: one PLAINTEXT, one SASL_SSL with a SCRAM-SHA-512 user
(certificates from ``broker.testing_tls``, EC P-256, TLS 1.3 as grpc negotiates it). For
each of ``--rounds`` rounds, in turn on each broker (alternating which goes first), on a
fresh one-partition topic:

1. produce: one ``Producer`` (``acks=1``, ``batch_size`` and ``max_request_size`` 1 MiB,
   so each request carries 1 MiB of 16 KiB records) sends ``--megabytes`` MiB and flushes;
2. consume: one ``Consumer`` reads them back from offset zero (1 MiB per partition fetch).

The ratios are the medians over rounds of TLS+SCRAM MB/s over plaintext MB/s
(``tls_over_plain_produce``, ``tls_over_plain_consume``; 1.0 = no cost, target >= 0.8).
Then the latency of one produce (a 100-byte record, ``linger_ms=0``, ``acks=1``, waited
for) ``--latency-samples`` times on each: p50 and the p50 TLS+SCRAM adds. The login is
done once per client before timing starts (a session lasts as long as its connection).

A ceiling, measured in the same run: grpcio alone (no Tidelog), a server streaming the
same ``--megabytes`` as 1 MiB messages to a client in this process, over a plaintext and
a TLS port, alternating, ``--rounds`` times: ``grpc_tls_over_plain_stream`` is the median
ratio, what grpcio's own TLS leaves of a plaintext stream on this machine. Where it is
below 0.8, so is any gRPC consumer's (both ends share the machine's cores: the broker
encrypts and the client decrypts each byte).

The machine is shared and noisy: both sides are measured in the same minute. The last
line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidelog.broker.core.scram import credential_from_password  # noqa: E402
from tidelog.broker.core.users import FileUserStore  # noqa: E402
from tidelog.broker.testing_tls import TestPki  # noqa: E402
from tidelog.client import AdminClient, Consumer, Producer, TopicPartition  # noqa: E402

_MIB = 1024 * 1024
_RECORD_BYTES = 16 * 1024
_PASSWORD = "bench-secret"


def start_broker(directory: Path, settings: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    ready = directory / "ready"
    command = [
        sys.executable, "-m", "tidelog.broker", "--listen", "127.0.0.1:0",
        "--data-dir", str(directory / "data"), "--ready-file", str(ready),
        "--set", "metrics.port=-1", "--log-level", "WARNING",
    ]  # fmt: skip
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"broker did not start: {command}")
        time.sleep(0.05)
    return process, ready.read_text().strip()


def produce_mb_per_s(address: str, topic: str, megabytes: int, security: dict[str, Any]) -> float:
    value = b"v" * _RECORD_BYTES
    count = megabytes * _MIB // _RECORD_BYTES
    with Producer(
        address,
        acks=1,
        batch_size=_MIB,
        max_request_size=_MIB + 64 * 1024,
        buffer_memory=16 * _MIB,
        linger_ms=5,
        **security,
    ) as producer:
        producer.send(topic, b"warm-up").result(timeout=30)  # connects and logs in
        started = time.perf_counter()
        for _ in range(count):
            producer.send(topic, value)
        producer.flush(timeout_ms=300_000)
        elapsed = time.perf_counter() - started
    return count * _RECORD_BYTES / _MIB / elapsed


def consume_mb_per_s(address: str, topic: str, megabytes: int, security: dict[str, Any]) -> float:
    expected = megabytes * _MIB // _RECORD_BYTES + 1
    with Consumer(
        address,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=_MIB,
        max_poll_records=10_000,
        **security,
    ) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.poll(timeout_ms=1)  # connects and logs in
        consumer.seek(TopicPartition(topic, 0), 0)
        seen = 0
        size = 0
        started = time.perf_counter()
        while seen < expected:
            for record in consumer.poll(timeout_ms=1_000):
                seen += 1
                size += len(record.value or b"")
        elapsed = time.perf_counter() - started
    return size / _MIB / elapsed


def produce_p50_ms(address: str, topic: str, samples: int, security: dict[str, Any]) -> float:
    times: list[float] = []
    with Producer(address, acks=1, linger_ms=0, **security) as producer:
        producer.send(topic, b"warm-up").result(timeout=30)
        for _ in range(samples):
            started = time.perf_counter()
            producer.send(topic, b"x" * 100).result(timeout=30)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def grpc_stream_ratios(pki: TestPki, megabytes: int, rounds: int) -> list[float]:
    """TLS over plaintext MB/s of a bare grpcio stream of 1 MiB messages, per round."""
    import grpc  # only this measurement uses grpc directly

    payload = b"v" * _MIB

    def stream(_request: bytes, _context: object) -> Any:
        for _ in range(megabytes):
            yield payload

    handler = grpc.method_handlers_generic_handler(
        "bench.Stream",
        {
            "Get": grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=bytes, response_serializer=bytes
            )
        },
    )
    options = [
        ("grpc.max_send_message_length", 4 * _MIB),
        ("grpc.max_receive_message_length", 4 * _MIB),
    ]
    server = grpc.server(ThreadPoolExecutor(2), options=options)
    server.add_generic_rpc_handlers([handler])
    plain_port = server.add_insecure_port("127.0.0.1:0")
    key, cert = pki.server_key.read_bytes(), pki.server_cert.read_bytes()
    tls_port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()

    def mb_per_s(channel: grpc.Channel) -> float:
        call = channel.unary_stream("/bench.Stream/Get", response_deserializer=bytes)
        started = time.perf_counter()
        size = sum(len(message) for message in call(b"", timeout=120))
        return size / _MIB / (time.perf_counter() - started)

    ratios = []
    try:
        credentials = grpc.ssl_channel_credentials(pki.ca_cert.read_bytes())
        for _ in range(rounds):
            with grpc.insecure_channel(f"127.0.0.1:{plain_port}", options=options) as channel:
                plain = mb_per_s(channel)
            with grpc.secure_channel(
                f"localhost:{tls_port}", credentials, options=options
            ) as channel:
                tls = mb_per_s(channel)
            print(
                f"bare grpc stream: plain {plain:7.1f} MB/s, tls {tls:7.1f} MB/s", file=sys.stderr
            )
            ratios.append(tls / plain)
    finally:
        server.stop(None)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="32 MiB, 1 round, 100 samples")
    args = parser.parse_args()
    if args.quick:
        args.megabytes, args.rounds, args.latency_samples = 32, 1, 100
    with tempfile.TemporaryDirectory(prefix="tidelog-security-bench-") as temp:
        root = Path(temp)
        pki = TestPki.create(root / "pki")
        (root / "tls" / "data").mkdir(parents=True)
        FileUserStore.open(root / "tls" / "data").upsert(
            "bench", credential_from_password("SCRAM-SHA-512", _PASSWORD)
        )
        (root / "plain").mkdir()
        brokers = {
            "plain": (start_broker(root / "plain", {}), {}),
            "tls": (
                start_broker(root / "tls", pki.broker_settings("SASL_SSL")),
                {
                    **pki.client_settings("SASL_SSL"),
                    "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "bench",
                    "sasl_plain_password": _PASSWORD,
                },
            ),
        }
        try:
            results: dict[str, dict[str, list[float]]] = {
                name: {"produce": [], "consume": []} for name in brokers
            }
            for round_number in range(args.rounds):
                # Alternate which side goes first: the machine's load drifts.
                order = list(brokers.items())
                if round_number % 2:
                    order.reverse()
                for name, ((_, address), security) in order:
                    topic = f"bench-{round_number}"
                    with AdminClient(address, **security) as admin:
                        admin.create_topic(topic, partitions=1)
                    produced = produce_mb_per_s(address, topic, args.megabytes, security)
                    consumed = consume_mb_per_s(address, topic, args.megabytes, security)
                    results[name]["produce"].append(produced)
                    results[name]["consume"].append(consumed)
                    print(
                        f"round {round_number} {name:5}: produce {produced:7.1f} MB/s, "
                        f"consume {consumed:7.1f} MB/s",
                        file=sys.stderr,
                    )
            latency = {}
            for name, ((_, address), security) in brokers.items():
                with AdminClient(address, **security) as admin:
                    admin.create_topic("latency", partitions=1)
                latency[name] = produce_p50_ms(address, "latency", args.latency_samples, security)
        finally:
            for (process, _), _settings in brokers.values():
                process.terminate()
                process.wait(30)
        ceiling = grpc_stream_ratios(pki, args.megabytes, max(args.rounds, 3))

    def ratio(kind: str) -> float:
        return statistics.median(
            t / p for t, p in zip(results["tls"][kind], results["plain"][kind], strict=True)
        )

    summary = {
        "megabytes": args.megabytes,
        "rounds": args.rounds,
        "request_bytes": _MIB,
        "plain_produce_mb_per_s": round(statistics.median(results["plain"]["produce"]), 1),
        "tls_produce_mb_per_s": round(statistics.median(results["tls"]["produce"]), 1),
        "plain_consume_mb_per_s": round(statistics.median(results["plain"]["consume"]), 1),
        "tls_consume_mb_per_s": round(statistics.median(results["tls"]["consume"]), 1),
        "tls_over_plain_produce": round(ratio("produce"), 3),
        "tls_over_plain_consume": round(ratio("consume"), 3),
        "produce_p50_ms_plain": round(latency["plain"], 3),
        "produce_p50_ms_tls": round(latency["tls"], 3),
        "tls_added_p50_ms": round(latency["tls"] - latency["plain"], 3),
        "grpc_tls_over_plain_stream": round(statistics.median(ceiling), 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
