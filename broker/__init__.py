"""Tidelog broker: the networked daemon over the storage engine.

Run it with ``tidelog serve`` or ``python -m broker`` (``broker.cli``). Modules, from the
outside in: ``server`` (process lifecycle: listener, health, reflection, metrics
endpoint, clean shutdown), ``grpc_async`` (the gRPC serving model: ``grpc.aio``, waiting
calls hold no thread; the threaded model was retired in issue #26, ``docs/broker.md``),
``service`` (one handler per ``tidelog.v1.Broker`` RPC),
``context`` (who is calling), ``limits`` (refusing instead of stalling), ``errors`` (the
one error-to-status table), ``core`` (one listener-neutral method per operation),
``delayed`` (the purgatory of parked operations), ``produce`` /
``group_fsync`` / ``fetch`` (the data path),
``producer_ids`` (idempotent producer ids), ``groups`` (the consumer-group coordinator
and the ``__consumer_offsets`` store), ``config`` (``BrokerConfig``), ``metrics``,
``malloc``, and ``testing`` (``InProcessBroker``, the public in-process harness).

The package itself exports nothing; import from the modules, e.g.
``from broker.testing import InProcessBroker``.
"""

__all__: list[str] = []
