"""Exactly once, by atomic commit: consume a topic, transform, produce to another, with the
consumer's offsets committed in the producer's transaction (issue #28).

Each batch of records read becomes one transaction: the transformed records and the
offsets after them are committed together, or not at all. Kill the process at any moment
and start it again with the same ``--transactional-id``: the new instance fences the old
one (InitProducerId bumps the epoch, aborting whatever it left open), resumes from the
offsets of the last committed transaction, and a read_committed reader of the output sees
every input record's transformation exactly once. The consumer is a static member
(``group.instance.id``, the transactional id): a restart takes its place in the group
without a rebalance wait.

Runs against the Kafka listener of a single node (``tidelog serve --set
kafka.listen=127.0.0.1:9092``) with confluent-kafka, unchanged Kafka client code::

    python examples/exactly_once_pipeline.py --bootstrap 127.0.0.1:9092 \\
        --input orders --output orders-upper --group upper --transactional-id upper-1

``--idle-exit-s``: stop once nothing new arrived for that long (0: run until killed).
``tests/kafka/test_exactly_once_example.py`` kills it at random and checks the output.
"""

from __future__ import annotations

import argparse
import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

_TIMEOUT_S = 30.0


def transform(value: bytes) -> bytes:
    """The pipeline's work: here, upper-case."""
    return value.upper()


def run(args: argparse.Namespace) -> int:
    """Copy ``args.input`` to ``args.output`` transformed; returns records copied."""
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            # Static membership (KIP-345): a restarted instance takes its old place in
            # the group at once, instead of waiting for the dead one's session to end.
            "group.instance.id": args.transactional_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "transaction.timeout.ms": 10_000,
        }
    )
    producer.init_transactions(_TIMEOUT_S)  # fences a previous instance, aborts its leftovers
    consumer.subscribe([args.input])
    copied = 0
    idle_since = time.monotonic()
    try:
        while True:
            messages = consumer.consume(args.batch, timeout=0.5)
            data = [m for m in messages if m.error() is None]
            for m in messages:
                error = m.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"consume failed: {error}")
            if not data:
                if args.idle_exit_s and time.monotonic() - idle_since > args.idle_exit_s:
                    return copied
                continue
            idle_since = time.monotonic()
            producer.begin_transaction()
            for m in data:
                producer.produce(args.output, transform(m.value() or b""), key=m.key())
            next_offsets: dict[tuple[str, int], int] = {}
            for m in data:
                next_offsets[(m.topic(), m.partition())] = m.offset() + 1
            producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in next_offsets.items()],
                consumer.consumer_group_metadata(),
                _TIMEOUT_S,
            )
            producer.commit_transaction(_TIMEOUT_S)
            copied += len(data)
    finally:
        consumer.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="the Kafka listener")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--transactional-id", required=True)
    p.add_argument("--batch", type=int, default=100, help="records per transaction, at most")
    p.add_argument("--idle-exit-s", type=float, default=0.0)
    print(f"copied {run(p.parse_args())} record(s)", flush=True)


if __name__ == "__main__":
    main()
