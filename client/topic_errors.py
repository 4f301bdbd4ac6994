"""Why a topic is missing from a metadata listing: ask the broker for it by name.

The producer and the consumer route by a listing of every topic (a ``Metadata`` request
without names). Such a listing leaves out, silently, the topics the caller may not
DESCRIBE, as Kafka's does, so a topic missing from it may be one that does not exist yet
(retriable: it may be being created), one the caller may not see, or a name no topic can
have. Only a request naming the topic tells them apart: the broker answers
``TOPIC_AUTHORIZATION_FAILED`` for a topic the caller may not describe, whether it exists
or not (nothing leaks), and ``INVALID_TOPIC_EXCEPTION`` for an illegal name. Those two are
not retriable, so the caller fails at once what waits for the topic instead of waiting
out its timeout, as Kafka's clients do.

``topic_errors`` asks only for topics already missing from a listing, so a client that
uses known topics never makes the extra call. Plain functions, thread-safe as
``ClusterConnections`` is.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.client.routing import ClusterConnections
from tidelog.storage.errors import (
    InvalidTopicError,
    TidelogError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    error_for_code,
)

__all__ = ["first_refusal", "missing_topic_error", "topic_errors"]


def missing_topic_error(topic: str, code: str) -> TidelogError:
    """The exception for ``topic`` answered with error ``code`` in a Metadata answer,
    with a message that says what the code means for that topic."""
    if code == TopicAuthorizationFailedError.code:
        return TopicAuthorizationFailedError(
            f"not authorized to describe topic {topic!r} (the principal needs DESCRIBE on it)"
        )
    if code == InvalidTopicError.code:
        return InvalidTopicError(
            f"{topic!r} is not a legal topic name: 1 to 249 ASCII letters, digits, "
            "'.', '_' and '-', and not '.' or '..'"
        )
    if code == UnknownTopicOrPartitionError.code:
        return UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    return error_for_code(code, f"topic {topic!r}")


def topic_errors(
    connections: ClusterConnections, topics: Sequence[str], *, timeout_ms: int
) -> dict[str, TidelogError]:
    """Ask one broker for ``topics`` by name; the error of each that has one.

    A topic the answer finds has no entry; one it leaves out (an older broker, a test
    transport that ignores names) counts as unknown. Blocking: one ``Metadata`` call, at
    most ``timeout_ms``, routed as ``ClusterConnections.run`` routes (retried on routing
    errors).

    Raises the call's error (``BrokerUnavailableError``, ``KafkaTimeoutError``...).
    """
    wanted = list(dict.fromkeys(topics))
    if not wanted:
        return {}
    answer = connections.run(
        connections.route_any(),
        lambda connection, timeout: connection.metadata(
            wanted, include_internal=True, timeout_ms=timeout
        ),
        what=f"Metadata {', '.join(wanted)}",
        timeout_ms=timeout_ms,
    )
    out: dict[str, TidelogError] = {}
    for topic in wanted:
        found = answer.topics.get(topic)
        if found is None:
            out[topic] = missing_topic_error(topic, UnknownTopicOrPartitionError.code)
        elif found.error_code:
            out[topic] = missing_topic_error(topic, found.error_code)
    return out


def first_refusal(errors: dict[str, TidelogError]) -> TidelogError | None:
    """The first error of ``errors`` that no retry can cure (None: all may yet pass)."""
    for error in errors.values():
        if not error.retriable:
            return error
    return None
