"""Tidelog broker: the networked daemon over the storage engine.

Run it with ``tidelog serve`` or ``python -m broker`` (``broker.cli``). Modules, from the
outside in: ``server`` (process lifecycle: gRPC server, health, reflection, metrics
endpoint, clean shutdown), ``service`` (the thin ``tidelog.v1.Broker`` servicer),
``errors`` (the one error-to-status table), ``core`` (one domain method per RPC),
``produce`` / ``produce_stream`` / ``fetch`` / ``fetch_waiters`` (the data path),
``producer_ids`` (idempotent producer ids), ``groups`` (the consumer-group coordinator
and the ``__consumer_offsets`` store), ``config`` (``BrokerConfig``), ``metrics``,
``malloc``, and ``testing`` (``InProcessBroker``, the public in-process harness).

The package itself exports nothing; import from the modules, e.g.
``from broker.testing import InProcessBroker``.
"""

__all__: list[str] = []
