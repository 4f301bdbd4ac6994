"""Event sourcing on Tidelog: commands append events, state is a fold over the log, a
compacted snapshot topic keeps restarts fast.

Run (a broker on 127.0.0.1:7410)::

    python examples/cdc/event_sourcing.py --commands 500      # random commands, then a restart

The domain is a small bank: ``open``, ``deposit``, ``withdraw`` and ``transfer`` commands
on accounts. The pieces, each a plain function or a small class:

- ``decide(balances, command) -> events`` (pure): validates a command against the current
  state and answers the events it causes, or raises ``CommandRejectedError`` (an unknown account, an
  overdraft). A transfer is two events, ``withdrawn`` on one account and ``deposited`` on
  the other.
- ``evolve(balances, event)`` (pure): applies one event. The state is nothing but
  ``evolve`` folded over the events topic from offset zero (``fold_from_zero``).
- ``Bank``: the command handler. It appends a command's events in **one Tidelog
  transaction** (``Producer(transactional_id=...)``), so a transfer's two events (keyed by
  account, on different partitions) are seen together or not at all by ``read_committed``
  readers; then it folds them into its in-memory state. Every ``snapshot_every`` events it
  writes a snapshot, ``{"positions": {partition: next offset}, "balances": ..., "events":
  n}``, to a compacted topic under one key (compaction keeps only the latest).
- **Restart** (``Bank.start``): ``init_transactions`` first, which fences a previous
  instance with the same transactional id (a zombie's next commit fails with
  ``ProducerFencedError``) and aborts whatever it left open; then the latest snapshot, then
  only the events after its positions, read ``read_committed`` up to the last stable
  offset. The result equals the full fold (the test checks it), having read at most
  ``snapshot_every`` events instead of the whole history.

Decisions. The events topic keeps everything (``retention.ms=-1``, not compacted: it *is*
the history); the snapshot is only a cache of the fold, written in its own transaction
after the events it covers are committed, so it is never ahead of the log, and losing it
costs a slower restart, never a wrong state. One ``Bank`` writes at a time (the single
writer, enforced by fencing): it can fold its own events without reading them back, and
its positions are the offsets the broker gave its records plus one (the transaction's
commit marker after them is skipped by read_committed readers). Not thread-safe.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tidelog import (  # noqa: E402
    AdminClient,
    Consumer,
    Producer,
    TopicAlreadyExistsError,
    TopicPartition,
)

log = logging.getLogger(__name__)

Event = dict[str, Any]
Command = dict[str, Any]
SNAPSHOT_KEY = b"ledger"


class CommandRejectedError(Exception):
    """The command is not valid in the current state; nothing was appended."""


def decide(balances: Mapping[str, int], command: Command) -> list[Event]:
    """The events ``command`` causes in the state ``balances``; ``CommandRejectedError`` if none."""
    kind = command["type"]
    if kind == "open":
        if command["account"] in balances:
            raise CommandRejectedError(f"account {command['account']} exists")
        return [{"type": "opened", "account": command["account"]}]
    amount = int(command["amount"])
    if amount <= 0:
        raise CommandRejectedError("amounts are positive")
    accounts = [command["from"], command["to"]] if kind == "transfer" else [command["account"]]
    for account in accounts:
        if account not in balances:
            raise CommandRejectedError(f"no account {account}")
    if kind == "deposit":
        return [{"type": "deposited", "account": command["account"], "amount": amount}]
    source = command["from"] if kind == "transfer" else command["account"]
    if balances[source] < amount:
        raise CommandRejectedError(f"account {source} holds {balances[source]}, not {amount}")
    if kind == "withdraw":
        return [{"type": "withdrawn", "account": source, "amount": amount}]
    if kind == "transfer":
        return [
            {"type": "withdrawn", "account": source, "amount": amount},
            {"type": "deposited", "account": command["to"], "amount": amount},
        ]
    raise CommandRejectedError(f"unknown command {kind!r}")


def evolve(balances: dict[str, int], event: Event) -> None:
    """Apply one event to ``balances`` (in place)."""
    kind, account = event["type"], event["account"]
    if kind == "opened":
        balances[account] = 0
    elif kind == "deposited":
        balances[account] += int(event["amount"])
    elif kind == "withdrawn":
        balances[account] -= int(event["amount"])
    else:
        raise ValueError(f"unknown event {kind!r}")


@dataclass
class Ledger:
    """The fold's result: balances, events folded, and where the fold stopped."""

    balances: dict[str, int] = field(default_factory=dict)
    events: int = 0
    positions: dict[int, int] = field(default_factory=dict)


def ensure_topics(bootstrap: str, events_topic: str, snapshots_topic: str, partitions: int) -> None:
    with AdminClient(bootstrap) as admin:
        for name, count, config in (
            (events_topic, partitions, {"retention.ms": "-1"}),
            (snapshots_topic, 1, {"cleanup.policy": "compact"}),
        ):
            try:
                admin.create_topic(name, count, config)
            except TopicAlreadyExistsError:
                pass


def _read_to_end(
    bootstrap: str, topic: str, positions: Mapping[int, int] | None = None
) -> tuple[list[Any], dict[int, int]]:
    """Records of ``topic`` (read_committed) from ``positions`` (else each partition's
    start) to the last stable offsets as of the call, and the positions after them
    (markers included: where a later read continues)."""
    records: list[Any] = []
    with Consumer(
        bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    ) as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        for tp in tps:
            if positions is not None and tp.partition in positions:
                consumer.seek(tp, positions[tp.partition])
            else:
                consumer.seek_to_beginning(tp)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for record in consumer.poll(timeout_ms=500):
                if record.offset < ends[TopicPartition(topic, record.partition)]:
                    records.append(record)
        return records, {tp.partition: ends[tp] for tp in tps}  # records past it: not taken


def fold(bootstrap: str, events_topic: str, start: Ledger | None = None) -> Ledger:
    """``start`` (empty if None) with every committed event after its positions folded in."""
    ledger = start or Ledger()
    balances = dict(ledger.balances)
    records, positions = _read_to_end(bootstrap, events_topic, ledger.positions or None)
    for record in records:
        evolve(balances, json.loads(record.value))
    return Ledger(balances, ledger.events + len(records), positions)


def fold_from_zero(bootstrap: str, events_topic: str) -> Ledger:
    """The state by definition: every committed event from offset zero."""
    return fold(bootstrap, events_topic)


def latest_snapshot(bootstrap: str, snapshots_topic: str) -> Ledger | None:
    snapshot = None
    for record in _read_to_end(bootstrap, snapshots_topic)[0]:
        if record.key == SNAPSHOT_KEY and record.value is not None:
            snapshot = json.loads(record.value)
    if snapshot is None:
        return None
    return Ledger(
        {str(k): int(v) for k, v in snapshot["balances"].items()},
        int(snapshot["events"]),
        {int(p): int(o) for p, o in snapshot["positions"].items()},
    )


@dataclass(frozen=True)
class RestoreStats:
    from_snapshot: int  # events the snapshot covered
    replayed: int  # events read after it


class Bank:
    """The command handler (single writer per ``transactional_id``)."""

    def __init__(
        self,
        bootstrap: str,
        *,
        events_topic: str = "bank.events",
        snapshots_topic: str = "bank.snapshots",
        transactional_id: str = "bank",
        snapshot_every: int = 100,
        partitions: int = 2,
    ) -> None:
        self.bootstrap = bootstrap
        self.events_topic = events_topic
        self.snapshots_topic = snapshots_topic
        self.snapshot_every = snapshot_every
        ensure_topics(bootstrap, events_topic, snapshots_topic, partitions)
        self.producer = Producer(bootstrap, transactional_id=transactional_id, acks="all")
        self.ledger = Ledger()
        self._snapshot_at = 0

    def start(self) -> RestoreStats:
        """Fence older instances, then restore: latest snapshot + the events after it."""
        self.producer.init_transactions()
        snapshot = latest_snapshot(self.bootstrap, self.snapshots_topic)
        self.ledger = fold(self.bootstrap, self.events_topic, snapshot)
        covered = snapshot.events if snapshot else 0
        self._snapshot_at = self.ledger.events
        return RestoreStats(covered, self.ledger.events - covered)

    def close(self) -> None:
        self.producer.close()

    @property
    def balances(self) -> dict[str, int]:
        return self.ledger.balances

    def handle(self, command: Command) -> list[Event]:
        """Decide, append the events in one transaction, fold them in. ``CommandRejectedError``
        appends nothing; a broker error aborts the transaction and re-raises."""
        events = decide(self.ledger.balances, command)
        self._append(
            self.events_topic, [(e["account"].encode(), json.dumps(e).encode()) for e in events]
        )
        for event in events:
            evolve(self.ledger.balances, event)
        self.ledger.events += len(events)
        if self.ledger.events - self._snapshot_at >= self.snapshot_every:
            self.snapshot()
        return events

    def snapshot(self) -> None:
        """Write the current fold and its positions to the snapshot topic."""
        ledger = self.ledger
        value = {
            "positions": {str(p): o for p, o in sorted(ledger.positions.items())},
            "balances": ledger.balances,
            "events": ledger.events,
        }
        self._append(self.snapshots_topic, [(SNAPSHOT_KEY, json.dumps(value).encode())])
        self._snapshot_at = ledger.events

    def _append(self, topic: str, records: list[tuple[bytes, bytes]]) -> None:
        producer = self.producer
        producer.begin_transaction()
        try:
            futures = [producer.send(topic, value, key=key) for key, value in records]
            producer.commit_transaction()  # flushes first; raises ProducerFencedError if fenced
            written = [f.result() for f in futures]
        except BaseException:
            try:
                producer.abort_transaction()
            except Exception as abort_error:  # fenced or broken: the first error is the cause
                log.warning("abort after a failed append failed too: %s", abort_error)
            raise
        if topic == self.events_topic:
            for metadata in written:
                current = self.ledger.positions.get(metadata.partition, 0)
                self.ledger.positions[metadata.partition] = max(current, metadata.offset + 1)


def random_commands(rng: random.Random, accounts: list[str], count: int) -> list[Command]:
    """Opens for every account, then ``count`` random deposits, withdrawals, transfers."""
    commands: list[Command] = [{"type": "open", "account": a} for a in accounts]
    for _ in range(count):
        kind = rng.choice(["deposit", "deposit", "withdraw", "transfer", "transfer"])
        amount = rng.randint(1, 500)
        if kind == "transfer":
            source, target = rng.sample(accounts, 2)
            commands.append({"type": kind, "from": source, "to": target, "amount": amount})
        else:
            commands.append({"type": kind, "account": rng.choice(accounts), "amount": amount})
    return commands


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="event sourcing on Tidelog: a small bank")
    p.add_argument("--bootstrap", default="127.0.0.1:7410")
    p.add_argument("--commands", type=int, default=500)
    p.add_argument("--snapshot-every", type=int, default=100)
    args = p.parse_args(argv)
    bank = Bank(args.bootstrap, snapshot_every=args.snapshot_every)
    stats = bank.start()
    print(f"restored {stats.from_snapshot} events from the snapshot, replayed {stats.replayed}")
    rejected = 0
    try:
        accounts = [f"acct-{n}" for n in range(10)]
        for command in random_commands(random.Random(), accounts, args.commands):
            try:
                bank.handle(command)
            except CommandRejectedError:
                rejected += 1
    finally:
        bank.close()
    print(f"{bank.ledger.events} events, {rejected} commands rejected; balances {bank.balances}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
