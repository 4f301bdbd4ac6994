"""Share groups (issue #32, KIP-932 "queues for Kafka"): records of a topic handed out one
by one to the members of a group, each acquired under a time-limited lock, acknowledged,
released or rejected, and redelivered up to a limit.

``docs/share-groups.md`` describes the model and how far it is built. The package itself
exports nothing; import from the modules.
"""

__all__: list[str] = []
