"""Topic administration forwarded to the controller (Kafka's KIP-590 Envelope idea).

In cluster mode only the controller changes topics. A topic admin call that reaches
another broker, on either listener, is forwarded by that broker to the controller over
the inter-broker gRPC channel (``Envelope``, ``InterBrokerChannels``: the same channel,
TLS and principal as the replica fetchers and ``ControlledShutdown``), and the answer, or
the error, comes back as if the receiving broker had run it. So a Kafka client that sends
AlterConfigs or IncrementalAlterConfigs to the least loaded broker (as Kafka's clients
do), or a Metadata that auto-creates a topic, succeeds on any broker.

The calls (``CALLS``), each a name plus a JSON object of arguments, so that a call gains
an argument without a new message: ``create_topic``, ``delete_topic``,
``create_partitions``, ``alter_topic_config``, ``elect_leaders``,
``alter_partition_reassignments``, ``list_partition_reassignments``, and the batches
``create_topics``, ``delete_topics`` and ``create_partitions_many`` (a whole CreateTopics,
DeleteTopics or CreatePartitions request as one call, ``broker.cluster.topic_batches``).
Kafka's clients send CreateTopics, DeleteTopics, CreatePartitions, ElectLeaders and the
reassignment calls to the controller anyway; forwarding them too costs nothing when they
arrive there and makes every broker answer them (Tidelog's own AdminClient needs no
controller routing). ``controlled_shutdown`` is not forwarded: it has its own RPC.

Decided:

* Authorization of the original caller is the receiving broker's (the request pipeline,
  on the original operation's policy); the controller accepts an ``Envelope`` only from a
  broker: ``CLUSTER_ACTION`` on the cluster, as ``ControlledShutdown`` and a follower's
  fetch (``broker.core.operations``). The original principal travels for the
  controller's log line only.
* Errors come back as the same neutral errors (``storage.errors.error_for_code`` of the
  code in the trailing metadata): unknown topic, policy violation, invalid config...
* The controller may move mid-call: an answer ``NOT_CONTROLLER``, or a controller that
  cannot be reached (``UNAVAILABLE``, nothing was run there), is retried once on the
  controller this broker's view shows next (waiting for the view to name another one);
  a second failure answers ``NOT_CONTROLLER`` (retriable: clients ask again).
* Every forwarded call has a deadline (``FORWARD_TIMEOUT_MS``, Kafka's default
  ``request.timeout.ms``), shared by both attempts. A call that runs out of time answers
  ``REQUEST_TIMED_OUT`` and is not retried: it may have been made.

The gRPC half (``ControllerClient``) is one of the cluster's wire adapters, beside the
replica fetcher (``tests/test_architecture.py``); the table of calls is plain Python.
Thread-safe: no state but the channels' options.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from tidelog.broker.cluster.controller import Controller, Reassignments
from tidelog.broker.cluster.metadata import ClusterMetadata, MetadataWatcher
from tidelog.broker.cluster.session import SessionFence
from tidelog.broker.cluster.topic_batches import (
    run_create_partitions,
    run_create_topics,
    run_delete_topics,
)
from tidelog.broker.tls import InterBrokerChannels
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.errors import (
    InvalidRequestError,
    KafkaTimeoutError,
    NotControllerError,
    error_for_code,
)

__all__ = [
    "CALLS",
    "FORWARD_TIMEOUT_MS",
    "ControllerAddress",
    "ControllerClient",
    "ControllerMovedError",
    "Forwarder",
    "decode_codes",
    "decode_reassignments",
    "encode_partitions",
    "encode_targets",
    "run_call",
]

log = logging.getLogger(__name__)

FORWARD_TIMEOUT_MS = 30_000  # Kafka's request.timeout.ms default
_ERROR_CODE_KEY = "tidelog-error-code"  # broker.grpc.errors.ERROR_CODE_METADATA_KEY

Json = Any


class ControllerMovedError(NotControllerError):
    """The broker forwarded to is not the controller (any more) or cannot be reached:
    nothing was run there, so the call may go to the next controller."""


# --- arguments and results as JSON ---------------------------------------------------------


def encode_partitions(partitions: Sequence[tuple[str, int]] | None) -> Json:
    return None if partitions is None else [[topic, p] for topic, p in partitions]


def _decode_partitions(value: Json) -> list[tuple[str, int]] | None:
    return None if value is None else [(str(t), int(p)) for t, p in value]


def encode_targets(targets: Mapping[tuple[str, int], Sequence[int] | None]) -> Json:
    return [[t, p, None if r is None else list(r)] for (t, p), r in targets.items()]


def _decode_targets(value: Json) -> dict[tuple[str, int], tuple[int, ...] | None]:
    return {(str(t), int(p)): None if r is None else tuple(int(b) for b in r) for t, p, r in value}


def _encode_codes(codes: Mapping[tuple[str, int], str]) -> Json:
    return [[t, p, code] for (t, p), code in codes.items()]


def decode_codes(value: Json) -> dict[tuple[str, int], str]:
    """``elect_leaders`` / ``alter_partition_reassignments``' answer, per partition."""
    return {(str(t), int(p)): str(code) for t, p, code in value}


def _encode_reassignments(found: Reassignments) -> Json:
    return [[t, p, list(r), list(a), list(d)] for (t, p), (r, a, d) in found.items()]


def decode_reassignments(value: Json) -> Reassignments:
    """``list_partition_reassignments``' answer."""
    return {(str(t), int(p)): (tuple(r), tuple(a), tuple(d)) for t, p, r, a, d in value}


# --- the calls, run on the controller --------------------------------------------------------


def _create_topic(controller: Controller, a: Mapping[str, Json]) -> Json:
    given = a.get("assignment")  # JSON object keys are strings: partition numbers back to ints
    controller.create_topic(
        str(a["name"]),
        int(a["partitions"]),
        int(a["replication_factor"]),
        dict(a["config"]),
        assignment=(
            None if given is None else {int(p): [int(r) for r in rs] for p, rs in given.items()}
        ),
    )
    return None


def _delete_topic(controller: Controller, a: Mapping[str, Json]) -> Json:
    controller.delete_topic(str(a["name"]))
    return None


def _create_partitions(controller: Controller, a: Mapping[str, Json]) -> Json:
    given = a.get("assignment")
    controller.create_partitions(
        str(a["name"]),
        int(a["total"]),
        assignment=None if given is None else [[int(r) for r in rs] for rs in given],
    )
    return None


def _alter_topic_config(controller: Controller, a: Mapping[str, Json]) -> Json:
    controller.alter_topic_config(str(a["name"]), dict(a["config"]))
    return None


def _elect_leaders(controller: Controller, a: Mapping[str, Json]) -> Json:
    return _encode_codes(
        controller.elect_leaders(bool(a["unclean"]), _decode_partitions(a["partitions"]))
    )


def _alter_reassignments(controller: Controller, a: Mapping[str, Json]) -> Json:
    return _encode_codes(controller.alter_partition_reassignments(_decode_targets(a["targets"])))


def _list_reassignments(controller: Controller, a: Mapping[str, Json]) -> Json:
    found = controller.list_partition_reassignments(_decode_partitions(a["partitions"]))
    return _encode_reassignments(found)


# Call name -> what the controller runs: its arguments as JSON in, its answer as JSON out.
CALLS: dict[str, Callable[[Controller, Mapping[str, Json]], Json]] = {
    "create_topic": _create_topic,
    "delete_topic": _delete_topic,
    "create_partitions": _create_partitions,
    "alter_topic_config": _alter_topic_config,
    "elect_leaders": _elect_leaders,
    "alter_partition_reassignments": _alter_reassignments,
    "list_partition_reassignments": _list_reassignments,
    "create_topics": run_create_topics,
    "delete_topics": run_delete_topics,
    "create_partitions_many": run_create_partitions,
}


def run_call(controller: Controller, call: str, arguments: Mapping[str, Json]) -> Json:
    """Run ``call`` on the local ``controller``. Raises ``InvalidRequestError`` for an
    unknown call or arguments that do not fit it; otherwise what the controller raises."""
    run = CALLS.get(call)
    if run is None:
        raise InvalidRequestError(f"no such controller call {call!r}")
    try:
        return run(controller, arguments)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"bad arguments for {call}: {exc!r}") from None


# --- the forwarding broker's side ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControllerAddress:
    """Where this broker's view says the controller is."""

    broker_id: int
    host: str
    port: int


class ControllerClient:
    """Sends one call to a controller over the inter-broker channel. Thread-safe."""

    def __init__(self, broker_id: int, channels: InterBrokerChannels) -> None:
        self._broker_id = broker_id
        self._channels = channels

    def send(
        self,
        target: ControllerAddress,
        call: str,
        arguments: Mapping[str, Json],
        timeout_s: float,
        principal: str = "",
    ) -> Json:
        """The controller's answer to ``call``.

        Raises ``ControllerMovedError`` (not the controller, or unreachable: nothing ran),
        ``KafkaTimeoutError`` (no answer in ``timeout_s``: it may have run), or the
        error the controller answered, rebuilt from its code.
        """
        request = pb.EnvelopeRequest(
            call=call,
            arguments=json.dumps(arguments).encode(),
            principal=principal,
            broker_id=self._broker_id,
        )
        with self._channels.channel(f"{target.host}:{target.port}") as channel:
            try:
                answer = pb_grpc.BrokerStub(channel).Envelope(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                raise _rebuilt(exc, target, call) from None
        return json.loads(answer.result) if answer.result else None


def _rebuilt(exc: grpc.RpcError, target: ControllerAddress, call: str) -> Exception:
    status = None
    details = ""
    code = None
    failed: Any = exc  # failed calls are both RpcError and Call (the stubs cannot say so)
    if hasattr(failed, "code") and hasattr(failed, "trailing_metadata"):
        status = failed.code()
        details = failed.details() or ""
        for key, value in failed.trailing_metadata() or ():
            if key == _ERROR_CODE_KEY:
                code = value if isinstance(value, str) else value.decode()
    where = f"controller {target.broker_id} ({target.host}:{target.port})"
    if code == NotControllerError.code:
        return ControllerMovedError(f"{where}: {details}")
    if code is not None:
        return error_for_code(code, details)
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return KafkaTimeoutError(
            f"{call} forwarded to {where}: no answer in time; it may or may not have been made"
        )
    if status == grpc.StatusCode.UNAVAILABLE:
        return ControllerMovedError(f"{where} cannot be reached: {details}")
    log.warning("%s forwarded to %s failed: %s %s", call, where, status, details)
    return NotControllerError(f"{call} forwarded to {where} failed: {status}: {details}")


class Forwarder:
    """Runs a topic admin call on the controller: on the local one if this broker holds
    the lease, else forwarded (the module docstring's rules). Thread-safe."""

    def __init__(
        self,
        broker_id: int,
        channels: InterBrokerChannels,
        controller: Controller,
        fence: SessionFence,
        watcher: MetadataWatcher,
        timeout_ms: int = FORWARD_TIMEOUT_MS,
    ) -> None:
        self._broker_id = broker_id
        self._client = ControllerClient(broker_id, channels)
        self._controller = controller
        self._fence = fence
        self._watcher = watcher
        self._timeout_ms = timeout_ms

    def run(self, call: str, arguments: Mapping[str, Json]) -> Json:
        """The controller's answer to ``call`` (JSON).

        Cut off from ZooKeeper: ``NotControllerError`` at once (this broker's view, and
        so where it would forward, cannot be trusted). Otherwise at most two failed
        attempts (the first controller and the next), within one deadline; then
        ``NotControllerError``. Other errors are the controller's, or
        ``KafkaTimeoutError``.
        """
        me = self._broker_id
        deadline = time.monotonic() + self._timeout_ms / 1000
        avoid: int | None = None  # the controller that just failed
        last: NotControllerError | None = None
        failures = 0
        while failures < 2:
            reason = self._fence.reason
            if reason is not None:
                raise NotControllerError(
                    f"broker {me} cannot reach the controller: {reason}; ask another broker"
                )
            if avoid != me and self._controller.is_controller:
                try:
                    return run_call(self._controller, call, arguments)
                except NotControllerError as exc:  # the lease went mid-call
                    avoid, last, failures = me, exc, failures + 1
                    continue
            target = self._controller_address(avoid, deadline)
            if target is None:
                break
            if target.broker_id == me:
                # This broker was just elected (or just lost it): its lease follows the
                # view in a moment, or the view moves on.
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
                continue
            try:
                return self._client.send(
                    target, call, arguments, max(deadline - time.monotonic(), 0.1)
                )
            except ControllerMovedError as exc:
                log.info("broker %d: forwarding %s: %s", me, call, exc)
                avoid, last, failures = target.broker_id, exc, failures + 1
        raise NotControllerError(
            f"broker {me} found no controller to run {call}"
            + (f" (last: {last})" if last is not None else "")
        )

    def _controller_address(self, avoid: int | None, deadline: float) -> ControllerAddress | None:
        """The controller of this broker's view, other than ``avoid``: waits (up to the
        deadline) for the view to name one; None if it does not."""

        def named(view: ClusterMetadata) -> bool:
            found = view.controller_id
            return found is not None and found != avoid and found in view.brokers

        left_ms = max(int((deadline - time.monotonic()) * 1000), 0)
        if not self._watcher.wait_for(named, left_ms):
            return None
        view = self._watcher.snapshot
        if view.controller_id is None or view.controller_id not in view.brokers:
            return None
        found = view.brokers[view.controller_id]
        return ControllerAddress(found.broker_id, found.host, found.port)
