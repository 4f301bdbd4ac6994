"""The channels a broker keeps to its peers for broker-to-broker gRPC calls, shared by the
transaction calls (``txn_peers``: markers, verification) and the share-group state calls
(``share_peers``): one channel per peer address, opened on first use over the
inter-broker TLS and principal (``InterBrokerChannels``), all closed together when the
broker stops; after that every lookup answers None, which each caller turns into its own
"unreachable" answer. Also how a peer's answered error code is read back from a failed
call (the trailing metadata ``broker.grpc.errors`` writes). Thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from tidelog.broker.tls import InterBrokerChannels
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc

__all__ = ["PeerStubs", "answered_code"]

_ERROR_CODE_KEY = "tidelog-error-code"  # broker.grpc.errors.ERROR_CODE_METADATA_KEY


class PeerStubs:
    """A stub per peer broker, by id through ``address_of`` (its gRPC HOST:PORT in the
    view now; None: not in the view)."""

    def __init__(
        self, channels: InterBrokerChannels, address_of: Callable[[int], str | None]
    ) -> None:
        self._channels = channels
        self._address_of = address_of
        self._lock = threading.Lock()
        self._open: dict[str, grpc.Channel] = {}
        self._closed = False

    def stub(self, broker_id: int) -> pb_grpc.BrokerStub | None:
        """The stub for ``broker_id``; None if it is not in the view or after ``close``."""
        address = self._address_of(broker_id)
        if address is None:
            return None
        with self._lock:
            if self._closed:
                return None
            channel = self._open.get(address)
            if channel is None:
                channel = self._channels.channel(address)
                self._open[address] = channel
        return pb_grpc.BrokerStub(channel)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            found = list(self._open.values())
            self._open.clear()
        for channel in found:
            channel.close()


def answered_code(exc: grpc.RpcError) -> str | None:
    """The error code the other broker answered with (trailing metadata), if any."""
    failed: Any = exc  # failed calls are both RpcError and Call (the stubs cannot say so)
    if not hasattr(failed, "trailing_metadata"):
        return None
    for key, value in failed.trailing_metadata() or ():
        if key == _ERROR_CODE_KEY:
            return value if isinstance(value, str) else bytes(value).decode()
    return None
