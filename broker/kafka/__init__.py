"""The Kafka wire-protocol listener (``kafka.listen``): a second listener over the core.

``KafkaListener`` (``listener``) serves Kafka clients on asyncio sockets; ``codec`` turns
frames into plain values through kio; ``handlers``, ``data``, ``offsets`` and ``groups``
answer each API over ``broker.core.facade.BrokerCore``; ``versions`` is the
advertised table; ``errors`` maps Tidelog's error codes to Kafka's numbers.
``docs/kafka.md`` says what is supported.
"""

from tidelog.broker.kafka.listener import KafkaListener, ListenerSettings

__all__ = ["KafkaListener", "ListenerSettings"]
