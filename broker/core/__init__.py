"""The broker's domain, free of wire types: ``BrokerCore`` (``broker.core.facade``), the
produce and fetch paths, the purgatories, the request pipeline and its policy table, the
errors' neutral classification, quotas, limits, ACLs, authentication and the metrics.

Nothing here imports grpc, protobuf, ``proto`` or the Kafka codec
(``tests/test_architecture.py`` checks it); the listeners (``broker.grpc``,
``broker.kafka``) convert their wire requests into calls of this package and render the
results. See ``docs/architecture.md``.
"""

__all__: list[str] = []
