"""The consumer-group coordinator (issue 5), after Kafka's KIP-848 consumer protocol.

Modules, from the pure core outwards: ``assignor`` (the even, sticky server-side
assignor), ``coordinator`` (membership, epochs, reconciliation, fencing, expiry: a pure
state machine taking ``now_ms``), ``offset_records`` (the ``__consumer_offsets`` record
format), ``offset_store`` (committed offsets: the internal compacted topic plus an
in-memory cache), ``classic`` (Kafka's classic JoinGroup/SyncGroup protocol, listener-
neutral, with ``consumer_protocol`` reading its "consumer" bytes for describe), and
``manager`` (the thread-safe facade ``BrokerCore`` calls, owning both protocols, with the
session-expiry timer). ``docs/groups.md`` describes the protocol as implemented.

The package itself exports nothing; import from the modules.
"""

__all__: list[str] = []
