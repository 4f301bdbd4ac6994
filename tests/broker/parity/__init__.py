"""One request pipeline for every listener (issue #26): the operation tables cover every
API either listener serves, and the same operation done through the gRPC listener and
the Kafka listener of one broker (TLS, SCRAM, the authorizer on) gives the same
authorization decision, the same audit lines (normalised for the listener), the same
request-metric samples and the same quota accounting.

The Kafka side speaks the wire protocol on a raw TLS socket (SCRAM-SHA-256 done here),
so that no client library adds requests of its own; the gRPC side uses the client's
``Transport`` (one Authenticate call, then exactly the calls made here).

One broker serves the whole package (``conftest.py``: the fixtures ``secure`` and
``both``, scope ``package``); the drivers and the observation live in ``support.py``.
The tests, by area:

- ``test_tables.py``: the operation and policy tables cover every API either listener
  serves, and no authorization is decided outside them;
- ``test_operations.py``: the common operations through both listeners (produce, fetch,
  commit, groups, topics) and each API's authorization rules;
- ``test_operations_admin.py``: configs, reassignments, manual assignments and the
  inter-broker ``Envelope``;
- ``test_transactions.py``: the transaction coordinator's APIs and WriteTxnMarkers;
- ``test_share_groups.py``: share groups and their offset admin.
"""
