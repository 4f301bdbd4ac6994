"""The request context: who is calling, handed to every handler of every listener.

A listener builds one ``RequestContext`` per call (per stream, for streams) from what its
transport knows, before any handler runs, and passes it down: to the limits (connections
per address), to the quotas and metrics (per client id) and to the logs. It is a plain
value, the same for every listener: the gRPC listener fills it from the peer address and
the ``tidelog-client-id`` metadata; the Kafka listener will fill it from the request
header's ``client_id``; replica fetchers from the follower's broker id; authentication
adds the principal.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestContext", "peer_host"]


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who made a request.

    Attributes:
        listener: which listener took it (``grpc``; later ``kafka``, ``replication``).
        peer: the connection's remote address as the listener names it (for gRPC
            ``ipv4:127.0.0.1:51234``): one value per connection.
        client_id: what the client calls itself ("" if it did not say).
        principal: the authenticated user (``User:NAME``); None without authentication.
    """

    listener: str
    peer: str
    client_id: str = ""
    principal: str | None = None

    @property
    def user(self) -> str | None:
        """The principal's name (``User:alice`` -> ``alice``); None without one."""
        if self.principal is None:
            return None
        return self.principal.removeprefix("User:")

    @property
    def host(self) -> str:
        """The peer's address without the port (limits per IP count by it)."""
        return peer_host(self.peer)


def peer_host(peer: str) -> str:
    """``ipv4:1.2.3.4:5`` -> ``1.2.3.4``; ``ipv6:%5B::1%5D:5`` -> ``::1``; else the text."""
    _, sep, rest = peer.replace("%5B", "[").replace("%5D", "]").partition(":")
    address = rest if sep else peer
    host, sep, _port = address.rpartition(":")
    if not sep:
        return address
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host
