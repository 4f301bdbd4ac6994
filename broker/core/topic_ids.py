"""Topic ids: the UUID a topic is known by where Kafka's protocol names topics by id
(KIP-516: Fetch v13+, the KIP-848 and KIP-932 records and APIs, ``__share_group_state``
keys).

Tidelog keeps no topic id in its metadata; a topic's id is derived from its name
(``uuid5`` in Tidelog's namespace): stable across restarts and brokers, never all zero. A
topic deleted and created again under the same name gets the same id (Kafka would give it
a new one); nothing here relies on the difference yet.

Pure; thread-safe.
"""

from __future__ import annotations

import uuid

__all__ = ["TOPIC_ID_NAMESPACE", "topic_id"]

TOPIC_ID_NAMESPACE = uuid.UUID("5f0c1a4e-6d1b-4a8e-9a57-1d0e7c4b2f11")


def topic_id(name: str) -> uuid.UUID:
    """The id Kafka clients see for topic ``name`` (stable, never all zero)."""
    return uuid.uuid5(TOPIC_ID_NAMESPACE, name)
