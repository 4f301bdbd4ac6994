"""examples/cdc/event_sourcing.py against a real broker: the state a ``Bank`` keeps equals
the fold of its events topic from offset zero; a restart reads the latest snapshot and
then only the events after it, and arrives at the same state; the previous instance is
fenced. (Event sourcing needs no database: the log is the source of truth.)"""

from __future__ import annotations

import random

import pytest

from tests.cdc.views import examples
from tidelog.broker.testing import InProcessBroker
from tidelog.client import ProducerFencedError

pytestmark = pytest.mark.timeout(180)


def test_state_is_the_fold_and_a_restart_from_the_snapshot_equals_it(
    broker: InProcessBroker,
) -> None:
    with examples("event_sourcing") as modules:
        es = modules["event_sourcing"]
        topics = {"events_topic": "es.events", "snapshots_topic": "es.snapshots"}
        accounts = [f"acct-{n}" for n in range(8)]
        rng = random.Random(30)
        bank = es.Bank(broker.address, transactional_id="es-bank", snapshot_every=50, **topics)
        assert bank.start() == es.RestoreStats(0, 0)
        net, rejected = 0, 0
        try:
            for command in es.random_commands(rng, accounts, 400):
                try:
                    events = bank.handle(command)
                except es.CommandRejectedError:
                    rejected += 1
                    continue
                if command["type"] == "deposit":
                    net += command["amount"]
                elif command["type"] == "withdraw":
                    net -= command["amount"]
                assert len(events) == (2 if command["type"] == "transfer" else 1)
            assert rejected > 0  # overdrafts were refused, and appended nothing
            assert min(bank.balances.values()) >= 0
            assert sum(bank.balances.values()) == net  # transfers move money, never make it

            full = es.fold_from_zero(broker.address, topics["events_topic"])
            assert full.balances == bank.balances
            assert full.events == bank.ledger.events

            # A restart: the snapshot, then only the events after it.
            restarted = es.Bank(
                broker.address, transactional_id="es-bank", snapshot_every=50, **topics
            )
            try:
                stats = restarted.start()
                assert stats.from_snapshot > 0
                assert stats.from_snapshot + stats.replayed == full.events
                assert stats.replayed < 50 + 2  # at most one snapshot interval (+ a transfer)
                assert restarted.balances == full.balances

                # The old instance is fenced: its next command appends nothing.
                with pytest.raises(ProducerFencedError):
                    bank.handle({"type": "deposit", "account": accounts[0], "amount": 1})

                for command in es.random_commands(rng, accounts, 120)[len(accounts) :]:
                    try:
                        restarted.handle(command)
                    except es.CommandRejectedError:
                        continue
                again = es.fold_from_zero(broker.address, topics["events_topic"])
                assert again.balances == restarted.balances
                assert again.events == restarted.ledger.events
            finally:
                restarted.close()
        finally:
            bank.close()
