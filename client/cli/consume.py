"""``tidelog consume``: print the records of a topic, one formatted line each.

::

    tidelog consume TOPIC [--from-beginning] [--partition P [--offset N|earliest|latest]]
                          [--max-messages N] [--format FMT] [--print-timestamps]
                          [--idle-timeout-ms MS] [--group G]
                          [--isolation-level read_uncommitted|read_committed]

Records go to stdout, the closing count to stderr. Without ``--partition`` the consumer
subscribes (with ``--group``: joins the group and commits what was printed); with it, the
consumer is assigned that one partition. Ctrl-C ends the command with status 0; a reader
that goes away (``| head``) ends it quietly. ``--isolation-level read_committed`` prints
only records of committed transactions (and non-transactional ones), up to the last
stable offset; the default, as Kafka's console consumer, is read_uncommitted.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time

from tidelog.client.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    non_negative_int,
    positive_int,
    print_info,
    quiet_broken_pipe,
    security_settings,
    timeout_ms,
)
from tidelog.client.consumer import Consumer
from tidelog.client.types import ConsumerRecord, TopicPartition

__all__ = ["register"]

_POLL_MS = 500
_FORMAT_FIELDS = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "sent_timestamp",
    "received_timestamp",
    "corrected_timestamp",
    "key",
    "value",
    "headers",
)
# --print-timestamps: the four times of a record before its formatted line.
_TIMESTAMPS_PREFIX = (
    "timestamp={timestamp}\tsent={sent_timestamp}\treceived={received_timestamp}\t"
    "corrected={corrected_timestamp}\t"
)


def register(commands: Subcommands, common: argparse.ArgumentParser) -> None:
    """Add ``consume`` to ``commands``; ``common`` is its parent parser."""
    consume = commands.add_parser("consume", parents=[common], help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument(
        "--from-beginning", action="store_true", help="start at the oldest record, not new ones"
    )
    consume.add_argument("--partition", type=non_negative_int, help="read only this partition")
    consume.add_argument(
        "--offset", help="with --partition: start here (an offset, 'earliest' or 'latest')"
    )
    consume.add_argument("--max-messages", type=positive_int, help="stop after N records")
    consume.add_argument(
        "--format",
        default="{value}",
        help="output per record, with {topic} {partition} {offset} {timestamp} "
        "{sent_timestamp} {received_timestamp} {corrected_timestamp} {key} {value} "
        "{headers}; \\t and \\n work (default {value})",
    )
    consume.add_argument(
        "--print-timestamps",
        action="store_true",
        help="start each line with the record's four times in ms: timestamp (its own), "
        "sent (producer clock), received (broker clock), corrected (timestamp + received "
        "- sent); null when unknown",
    )
    consume.add_argument(
        "--idle-timeout-ms",
        type=non_negative_int,
        help="stop after this long without a record (default: wait forever)",
    )
    consume.add_argument(
        "--group",
        help="join this consumer group (share the partitions, commit what was printed); "
        "with --partition: read outside the group, from its committed offset",
    )
    consume.add_argument(
        "--isolation-level",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed: only records of committed transactions, up to the last "
        "stable offset (default read_uncommitted: every data record)",
    )
    consume.set_defaults(handler=_consume)


def _consume(args: argparse.Namespace) -> int:
    template = _decode_escapes(args.format)
    _check_format(template)
    if args.print_timestamps:
        template = _TIMESTAMPS_PREFIX + template
    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    try:
        consumer = Consumer(
            args.bootstrap,
            group_id=args.group,
            auto_offset_reset="earliest" if args.from_beginning else "latest",
            enable_auto_commit=args.group is not None,
            isolation_level=args.isolation_level,
            request_timeout_ms=max(timeout_ms(args), 1_000),
            **security_settings(args),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    count = 0
    out = sys.stdout
    try:
        with consumer:
            if args.partition is None:
                consumer.partitions_for_topic(args.topic, timeout_ms=timeout_ms(args))
                consumer.subscribe([args.topic])
            else:
                tp = TopicPartition(args.topic, args.partition)
                if args.partition not in consumer.partitions_for_topic(
                    args.topic, timeout_ms=timeout_ms(args)
                ):
                    raise UsageError(f"topic {args.topic!r} has no partition {args.partition}")
                consumer.assign([tp])
                _seek(consumer, tp, args.offset)
            limit: int | None = args.max_messages
            idle_ms: int | None = args.idle_timeout_ms
            last_record = time.monotonic()
            while limit is None or count < limit:
                # Never take more than will be printed: a group commits what poll returned.
                records = consumer.poll(
                    timeout_ms=_POLL_MS, max_records=None if limit is None else limit - count
                )
                if not records:
                    if idle_ms is not None and (time.monotonic() - last_record) * 1000 >= idle_ms:
                        break
                    continue
                last_record = time.monotonic()
                if limit is not None:
                    records = records[: limit - count]
                out.write("".join(_format_record(template, r) + "\n" for r in records))
                out.flush()
                count += len(records)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            out.flush()
        except BrokenPipeError:
            quiet_broken_pipe()
    print_info(f"Processed a total of {count} message(s).")
    return EXIT_OK


def _seek(consumer: Consumer, tp: TopicPartition, offset: str | None) -> None:
    if offset is None:
        return
    if offset == "earliest":
        consumer.seek_to_beginning(tp)
    elif offset == "latest":
        consumer.seek_to_end(tp)
    else:
        try:
            value = int(offset)
        except ValueError:
            raise UsageError(
                f"--offset must be an offset, 'earliest' or 'latest', got {offset!r}"
            ) from None
        if value < 0:
            raise UsageError(f"--offset must not be negative, got {value}")
        consumer.seek(tp, value)


def _decode_escapes(text: str) -> str:
    try:
        return codecs.decode(text, "unicode_escape")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--format: bad escape sequence ({exc.reason})") from None


def _check_format(template: str) -> None:
    sample = dict.fromkeys(_FORMAT_FIELDS, "")
    try:
        template.format_map(sample)
    except (KeyError, IndexError, ValueError) as exc:
        known = " ".join(f"{{{f}}}" for f in _FORMAT_FIELDS)
        raise UsageError(
            f"--format: unknown field or bad template ({exc}); known: {known}"
        ) from None


def _text(data: bytes | None) -> str:
    if data is None:
        return "null"
    return data.decode("utf-8", errors="backslashreplace")


def _ms_or_null(value: int | None) -> str:
    return "null" if value is None else str(value)


def _format_record(template: str, record: ConsumerRecord) -> str:
    return template.format_map(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp_ms,
            "sent_timestamp": _ms_or_null(record.sent_timestamp_ms),
            "received_timestamp": _ms_or_null(record.received_timestamp_ms),
            "corrected_timestamp": _ms_or_null(record.corrected_timestamp_ms),
            "key": _text(record.key),
            "value": _text(record.value),
            "headers": ",".join(f"{k}={_text(v)}" for k, v in record.headers),
        }
    )
