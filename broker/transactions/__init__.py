"""Transactions (issue #28), after Kafka's KIP-98 with KIP-890's transactions v2.

Modules, from the pure core outwards: ``log_records`` (the ``__transaction_state`` record
format), ``state`` (the coordinator's state machine for one transactional id: a pure
function of the current state and a request, taking ``now_ms``), ``txn_log`` (every id's
state: the internal compacted topic plus an in-memory cache, written before it is acted
on) and ``coordinator`` (the thread-safe coordinator the core calls: one transition at a
time per id, markers and completion on its own thread, timeouts and expiry).
``docs/transactions.md`` describes the protocol as built and what is still to come.

The package itself exports nothing; import from the modules.
"""

__all__: list[str] = []
