"""``tidelog produce``: lines of stdin become records of a topic.

::

    tidelog produce TOPIC [--key-separator SEP] [--partition P] [--acks 0|1|all|-1]
                          [--compression C] [--linger-ms MS] [--header KEY=VALUE]...

Each line (without its newline) is a record's value, or ``KEY SEP VALUE`` with
``--key-separator``. A line without the separator stops the command (status 2) after the
lines before it were sent. A record not delivered makes the status 1; the summary goes to
stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tidelog.client.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    Subcommands,
    UsageError,
    describe_error,
    non_negative_int,
    parse_pairs,
    print_error,
    print_info,
    security_settings,
    timeout_ms,
)
from tidelog.client.producer import Producer
from tidelog.client.types import RecordMetadata

__all__ = ["register"]


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``produce`` to ``commands``; ``common`` is its parent parser."""
    produce = commands.add_parser(
        "produce", parents=[common], help="send lines of stdin as records"
    )
    produce.add_argument("topic")
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each line at the first SEP into key and value",
    )
    produce.add_argument("--partition", type=non_negative_int, help="send to this partition")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    produce.add_argument(
        "--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none"
    )
    produce.add_argument("--linger-ms", type=non_negative_int, default=5)
    produce.add_argument(
        "--header", metavar="KEY=VALUE", action="append", default=[], help="header on every record"
    )
    produce.set_defaults(handler=_produce)


def _produce(args: argparse.Namespace) -> int:
    separator: str | None = args.key_separator
    if separator == "":
        raise UsageError("--key-separator must not be empty")
    headers = [(k, v.encode()) for k, v in parse_pairs(args.header, "--header").items()]
    failures: list[BaseException] = []
    sent = 0

    def on_delivery(metadata: RecordMetadata | None, error: BaseException | None) -> None:
        if error is not None:
            failures.append(error)

    try:
        producer = Producer(
            args.bootstrap,
            acks=args.acks,
            compression=None if args.compression == "none" else args.compression,
            linger_ms=args.linger_ms,
            enable_idempotence=args.acks != "0",
            max_block_ms=timeout_ms(args),
            request_timeout_ms=timeout_ms(args),
            delivery_timeout_ms=max(timeout_ms(args) + args.linger_ms, 2 * timeout_ms(args)),
            **security_settings(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        with producer:
            # Fail fast on a missing topic instead of after max_block_ms per record.
            producer.partitions_for(args.topic, timeout_ms=timeout_ms(args))
            for number, raw in enumerate(_stdin_lines(), start=1):
                line = raw[:-1] if raw.endswith(b"\n") else raw
                key: bytes | None = None
                if separator is not None:
                    key_part, sep, value_part = line.partition(separator.encode())
                    if not sep:
                        raise UsageError(f"line {number} has no key separator {separator!r}")
                    key, line = key_part, value_part
                producer.send(
                    args.topic,
                    value=line,
                    key=key,
                    headers=headers,
                    partition=args.partition,
                    callback=on_delivery,
                )
                sent += 1
            producer.flush()
    except UsageError:
        print_info(f"Stopped: {sent} record(s) before the bad line were sent.")
        raise
    if failures:
        print_error(
            f"{len(failures)} of {sent} record(s) not delivered: {describe_error(failures[0])}"
        )
        return EXIT_ERROR
    print_info(f'Produced {sent} record(s) to "{args.topic}".')
    return EXIT_OK


def _stdin_lines() -> Any:
    return iter(sys.stdin.buffer.readline, b"")
