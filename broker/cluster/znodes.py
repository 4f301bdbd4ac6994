"""The cluster's znodes: paths and JSON, all under ``zookeeper.connect``'s chroot.

Kafka's ZooKeeper-era layout (``kafka.zk.ZkData``), trimmed to what Tidelog uses::

    /cluster/id                                    {"version":1,"id":"<uuid>"}
    /brokers/ids/<id>              ephemeral       {"version":1,"host":H,"port":P,"ts":ms,
                                                    "endpoints":["KAFKA://H:P"],
                                                    "listener_security_protocol_map":
                                                      {"KAFKA":"SASL_SSL"},
                                                    "previous_broker_epoch":E}
    /controller                    ephemeral       {"version":1,"brokerid":N,"ts":ms}
    /controller_epoch                              an integer, as text
    /brokers/topics/<t>                            {"version":1,"partitions":{"0":[1,2]},
                                                    "topic_id":"<uuid>",
                                                    "adding_replicas":{"0":[3]},
                                                    "removing_replicas":{"0":[1]}}
    /brokers/topics/<t>/partitions/<p>/state       {"version":1,"leader":L,"leader_epoch":E,
                                                    "isr":[..],"controller_epoch":C,
                                                    "elr":[..],"last_known_elr":[..],
                                                    "last_known_leader":L,
                                                    "brokers_zxid":Z}
    /config/topics/<t>                             {"version":1,"config":{...}}
    /config/brokers/<default>                      {"version":1,"config":{...}} (dynamic
    /config/brokers/<id>                            broker configs, broker.core.configs)
    /admin/delete_topics/<t>                       empty: the topic is being deleted
    /latest_producer_id_block                      {"version":1,"broker":N,"block_start":S,
                                                    "block_end":E}
    /tidelog/producer_keys/<quoted key>            {"version":1,"producer_id":P,
                                                    "producer_epoch":E,"last_used_ms":T}

A broker znode's ``host`` and ``port`` are its gRPC listener (the address other brokers
and Tidelog's clients dial). Its other listeners are Kafka's ``endpoints`` list
(``NAME://HOST:PORT``, an IPv6 host in brackets) with each name's security protocol in
``listener_security_protocol_map``, as Kafka registers several listeners per broker. The
one name Tidelog writes is ``KAFKA``, the Kafka wire-protocol listener
(``kafka.advertised.listen``), with the broker's ``security.protocol``. Both keys are
optional: a registration without them (written before the Kafka listener could run in a
cluster, or by a broker with ``kafka.listen`` off) reads as a broker with no other
listener. The document stays version 1 so a broker that does not know the keys still reads
it (Kafka bumps the version; every Tidelog reader refuses versions other than 1).

An ephemeral broker znode's creation zxid (``czxid``) is the broker's epoch (KIP-380): a
broker that restarted has a larger one. A partition state znode's version is the
compare-and-set token of every write to it. Leader -1 means no leader (offline).

Eligible leader replicas (KIP-966, ``broker.cluster.election``): a registration's
``previous_broker_epoch`` is the broker epoch its clean-shutdown marker held (KIP-966's
``PreviousBrokerEpoch``), -1 if the marker was missing (the last stop was not clean: the
broker may have lost its unsynced tail), 0 for a clean stop that recorded no epoch; a
registration without the key (an older broker) counts as clean, as before. A state's
``elr`` and ``last_known_elr`` are KIP-966's EligibleLeaderReplicas and LastKnownElr,
``last_known_leader`` the leader it had when it went offline (-1: none recorded), and
``brokers_zxid`` the ``/brokers/ids`` child zxid (``pzxid``) of the registrations the
controller had read when it wrote the state: every registration created after it is one
the writer did not know of. All four keys are optional and written only when not empty
(or -1, or 0), so a state without them reads as before (empty, -1, 0) and a state a
broker without ELR writes stays readable by one with it, and the other way round.

A topic's ``adding_replicas`` and ``removing_replicas`` (KIP-455's keys in Kafka's
ZooKeeper layout) name the partitions being reassigned (``broker.cluster.reassignment``):
while one is, its ``partitions`` entry is the union of the replicas it had and the target
ones; the target is that union less ``removing_replicas``, what it had is the union less
``adding_replicas``. Kafka writes them in a version-2 document; Tidelog keeps version 1 (its
readers refuse other versions) and writes the keys only while a reassignment is in
progress, so a topic that is not being reassigned reads byte for byte as before.

A broker registration's ``rack`` is Kafka's key (``broker.rack``), absent when unset.

``/latest_producer_id_block`` is Kafka's (``ProducerIdBlockZNode``): the last block of
producer ids a broker claimed, both ends inclusive; the next claim starts after
``block_end``, at the version read. Kafka writes the two ends as strings; both forms are
read. ``/tidelog/producer_keys`` is Tidelog's own (keyed producer ids, no Kafka
counterpart): one child per key, named by ``producer_key_name`` (the key percent-encoded,
so any key of up to 1,024 characters is one valid znode name).

Pure: bytes and values in and out; ``ZnodeError`` for a znode that does not parse.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

__all__ = [
    "ACLS",
    "ADMIN_DELETE_TOPICS",
    "BROKER_CONFIGS",
    "BROKER_IDS",
    "CLUSTER_ID",
    "CONTROLLER",
    "CONTROLLER_EPOCH",
    "KAFKA_LISTENER",
    "NO_LEADER",
    "PRODUCER_ID_BLOCK",
    "PRODUCER_KEYS",
    "TOPICS",
    "TOPIC_CONFIGS",
    "USERS_CONFIG",
    "BrokerRegistration",
    "KeyedProducerId",
    "ListenerEndpoint",
    "PartitionState",
    "ProducerIdBlock",
    "TopicAssignment",
    "ZnodeError",
    "broker_path",
    "decode_broker",
    "decode_controller",
    "decode_epoch",
    "decode_partition_state",
    "decode_producer_id_block",
    "decode_producer_key",
    "decode_topic",
    "decode_topic_config",
    "encode_broker",
    "encode_controller",
    "encode_epoch",
    "encode_partition_state",
    "encode_producer_id_block",
    "encode_producer_key",
    "encode_topic",
    "encode_topic_config",
    "partition_state_path",
    "partitions_path",
    "producer_key_name",
    "producer_key_path",
    "topic_config_path",
    "topic_path",
]

CLUSTER_ID = "/cluster/id"
BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
TOPIC_CONFIGS = "/config/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
ADMIN_DELETE_TOPICS = "/admin/delete_topics"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
PRODUCER_KEYS = "/tidelog/producer_keys"
BROKER_CONFIGS = "/config/brokers"  # dynamic broker configs, Kafka's layout
USERS_CONFIG = "/config/users"  # SCRAM credentials, Kafka's layout (broker.core.users)
ACLS = "/tidelog/acls"  # every ACL binding, one JSON document (broker.core.acl_store)
NO_LEADER = -1
KAFKA_LISTENER = "KAFKA"  # the Kafka wire-protocol listener's name in ``endpoints``
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ZnodeError(ValueError):
    """A znode's content does not parse as what its path holds."""


@dataclass(frozen=True, slots=True)
class ListenerEndpoint:
    """One of a broker's listeners besides gRPC: its name (``KAFKA``), the address its
    clients dial and its security protocol (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``,
    ``SASL_SSL``)."""

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A live broker as ``/brokers/ids/<id>`` announces it: ``host``/``port`` its gRPC
    listener, ``endpoints`` its other listeners (none in an older registration)."""

    broker_id: int
    host: str
    port: int
    registered_ms: int = 0
    endpoints: tuple[ListenerEndpoint, ...] = ()
    # KIP-966's PreviousBrokerEpoch: -1 after an unclean stop; None: not reported.
    previous_broker_epoch: int | None = None
    rack: str | None = None  # ``broker.rack``

    @property
    def shut_down_cleanly(self) -> bool:
        """False only if the broker reported that its last stop was not clean (its
        clean-shutdown marker was missing): it may have lost writes it never fsynced."""
        return self.previous_broker_epoch != -1

    def endpoint(self, name: str) -> ListenerEndpoint | None:
        """The listener called ``name`` (``KAFKA_LISTENER``), or None if it has none."""
        for found in self.endpoints:
            if found.name == name:
                return found
        return None


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A topic's replica lists, preferred leader first, and its id."""

    name: str
    topic_id: str
    replicas: Mapping[int, tuple[int, ...]]
    # KIP-455: partitions being reassigned (``replicas`` is then the union of the old and
    # the target replicas); empty when none is.
    adding: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.replicas)

    def target(self, partition: int) -> tuple[int, ...]:
        """The replicas ``partition`` ends with: its replicas less those being removed."""
        removing = self.removing.get(partition, ())
        return tuple(r for r in self.replicas[partition] if r not in removing)

    def original(self, partition: int) -> tuple[int, ...]:
        """The replicas ``partition`` had before its reassignment (a cancel returns to
        them): its replicas less those being added."""
        adding = self.adding.get(partition, ())
        return tuple(r for r in self.replicas[partition] if r not in adding)

    def reassigning(self, partition: int) -> bool:
        return bool(self.adding.get(partition) or self.removing.get(partition))


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leader, leader epoch and ISR of one partition, and the controller epoch that wrote them.

    With KIP-966's fields (``broker.cluster.election``): ``elr`` the eligible leader
    replicas (out of the ISR, but holding every committed record), ``last_known_elr``
    the ones that lost that standing by an unclean shutdown, ``last_known_leader`` the
    leader before the partition went offline (-1: none), ``brokers_zxid`` the
    registrations the controller knew of when it wrote this (0: not recorded).

    ``partition_epoch``: the znode version it was read at (KRaft's partition epoch; -1:
    not read from ZooKeeper). Not stored in the znode, not compared: it orders the views
    of one leader epoch, whose ISR the controller may shrink (``broker.cluster.election``).
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()
    last_known_leader: int = NO_LEADER
    brokers_zxid: int = 0
    partition_epoch: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Producer ids ``block_start..block_end`` (inclusive), claimed by broker ``broker_id``."""

    broker_id: int
    block_start: int
    block_end: int


@dataclass(frozen=True, slots=True)
class KeyedProducerId:
    """A producer key's id, the epoch it was given, and when a broker last handed it out."""

    producer_id: int
    producer_epoch: int
    last_used_ms: int


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    return f"{TOPIC_CONFIGS}/{topic}"


def producer_key_name(key: str) -> str:
    """The child of ``PRODUCER_KEYS`` that holds ``key``: one name per key, reversible.

    Percent-encoding (UTF-8) of everything but letters, digits and ``-_.~:``, so the name
    has no ``/`` and none of the characters ZooKeeper refuses; ``.`` and ``..`` (reserved
    names) are encoded too. ``urllib.parse.unquote`` gives the key back.
    """
    name = quote(key, safe=":")
    if name in (".", ".."):
        name = name.replace(".", "%2E")
    return name


def producer_key_path(name: str) -> str:
    """The znode of a key's ``producer_key_name``."""
    return f"{PRODUCER_KEYS}/{name}"


def _dump(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ZnodeError(f"{what}: not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("version") != 1:
        raise ZnodeError(f"{what}: not a version-1 document: {data[:200]!r}")
    return document


def _int(document: Mapping[str, Any], key: str, what: str) -> int:
    value = document.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ZnodeError(f"{what}: {key!r} is not an integer: {value!r}")
    return value


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ZnodeError(f"{what}: not a list of integers: {value!r}")
    return tuple(value)


def encode_broker(registration: BrokerRegistration) -> bytes:
    document: dict[str, Any] = {
        "version": 1,
        "host": registration.host,
        "port": registration.port,
        "ts": registration.registered_ms,
    }
    if registration.endpoints:
        document["endpoints"] = [
            f"{e.name}://{_bracketed(e.host)}:{e.port}" for e in registration.endpoints
        ]
        document["listener_security_protocol_map"] = {
            e.name: e.security_protocol for e in registration.endpoints
        }
    if registration.previous_broker_epoch is not None:
        document["previous_broker_epoch"] = registration.previous_broker_epoch
    if registration.rack is not None:
        document["rack"] = registration.rack
    return _dump(document)


def decode_broker(broker_id: int, data: bytes) -> BrokerRegistration:
    what = broker_path(broker_id)
    document = _load(data, what)
    host = document.get("host")
    if not isinstance(host, str) or not host:
        raise ZnodeError(f"{what}: no host")
    return BrokerRegistration(
        broker_id,
        host,
        _int(document, "port", what),
        _int(document, "ts", what),
        _endpoints(document, what),
        _int(document, "previous_broker_epoch", what)
        if "previous_broker_epoch" in document
        else None,
        _rack(document, what),
    )


def _rack(document: Mapping[str, Any], what: str) -> str | None:
    rack = document.get("rack")
    if rack is not None and not isinstance(rack, str):
        raise ZnodeError(f"{what}: rack is not a string: {rack!r}")
    return rack


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _endpoints(document: Mapping[str, Any], what: str) -> tuple[ListenerEndpoint, ...]:
    """Kafka's ``endpoints`` and ``listener_security_protocol_map``; absent: none.

    A name missing from the map is ``PLAINTEXT`` (Kafka's default map names each protocol
    after itself, and older registrations had no map)."""
    listed = document.get("endpoints", [])
    protocols = document.get("listener_security_protocol_map", {})
    if not isinstance(listed, list) or not all(isinstance(e, str) for e in listed):
        raise ZnodeError(f"{what}: endpoints is not a list of strings: {listed!r}")
    if not isinstance(protocols, dict) or not all(
        isinstance(v, str) and v in SECURITY_PROTOCOLS for v in protocols.values()
    ):
        raise ZnodeError(f"{what}: bad listener_security_protocol_map: {protocols!r}")
    endpoints = []
    for text in listed:
        name, separator, address = text.partition("://")
        host, colon, port = address.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not separator or not name or not colon or not host or not port.isdigit():
            raise ZnodeError(f"{what}: endpoint {text!r} is not NAME://HOST:PORT")
        endpoints.append(ListenerEndpoint(name, host, int(port), protocols.get(name, "PLAINTEXT")))
    return tuple(endpoints)


def encode_controller(broker_id: int, now_ms: int) -> bytes:
    return _dump({"version": 1, "brokerid": broker_id, "ts": now_ms})


def decode_controller(data: bytes) -> int:
    """The controller's broker id."""
    return _int(_load(data, CONTROLLER), "brokerid", CONTROLLER)


def encode_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_epoch(data: bytes) -> int:
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise ZnodeError(f"{CONTROLLER_EPOCH}: not an integer: {data[:50]!r}") from None


def encode_topic(assignment: TopicAssignment) -> bytes:
    document: dict[str, Any] = {
        "version": 1,
        "topic_id": assignment.topic_id,
        "partitions": {str(p): list(r) for p, r in sorted(assignment.replicas.items())},
    }
    for key, lists in (
        ("adding_replicas", assignment.adding),
        ("removing_replicas", assignment.removing),
    ):
        kept = {str(p): list(r) for p, r in sorted(lists.items()) if r}
        if kept:
            document[key] = kept
    return _dump(document)


def _partition_lists(value: object, what: str) -> dict[int, tuple[int, ...]]:
    if not isinstance(value, dict):
        raise ZnodeError(f"{what}: not a map of partitions: {value!r}")
    out: dict[int, tuple[int, ...]] = {}
    for key, replicas in value.items():
        try:
            partition = int(key)
        except ValueError:
            raise ZnodeError(f"{what}: partition {key!r} is not a number") from None
        out[partition] = _ints(replicas, f"{what} partition {key}")
    return out


def decode_topic(name: str, data: bytes) -> TopicAssignment:
    what = topic_path(name)
    document = _load(data, what)
    partitions = document.get("partitions")
    topic_id = document.get("topic_id")
    if not isinstance(partitions, dict) or not isinstance(topic_id, str):
        raise ZnodeError(f"{what}: no partitions or topic_id")
    replicas: dict[int, tuple[int, ...]] = {}
    for key, value in partitions.items():
        try:
            partition = int(key)
        except ValueError:
            raise ZnodeError(f"{what}: partition {key!r} is not a number") from None
        replicas[partition] = _ints(value, f"{what} partition {key}")
    if sorted(replicas) != list(range(len(replicas))):
        raise ZnodeError(f"{what}: partitions are not 0..{len(replicas) - 1}")
    adding = _partition_lists(document.get("adding_replicas", {}), f"{what} adding_replicas")
    removing = _partition_lists(document.get("removing_replicas", {}), f"{what} removing_replicas")
    return TopicAssignment(name, topic_id, dict(sorted(replicas.items())), adding, removing)


def encode_partition_state(state: PartitionState) -> bytes:
    document: dict[str, Any] = {
        "version": 1,
        "leader": state.leader,
        "leader_epoch": state.leader_epoch,
        "isr": list(state.isr),
        "controller_epoch": state.controller_epoch,
    }
    # KIP-966's keys only when set: a state without them is byte for byte what a broker
    # without ELR writes.
    if state.elr:
        document["elr"] = list(state.elr)
    if state.last_known_elr:
        document["last_known_elr"] = list(state.last_known_elr)
    if state.last_known_leader != NO_LEADER:
        document["last_known_leader"] = state.last_known_leader
    if state.brokers_zxid:
        document["brokers_zxid"] = state.brokers_zxid
    return _dump(document)


def decode_partition_state(
    data: bytes, what: str = "partition state", version: int = -1
) -> PartitionState:
    """The state in ``data``, read at znode ``version`` (its ``partition_epoch``)."""
    document = _load(data, what)
    return PartitionState(
        _int(document, "leader", what),
        _int(document, "leader_epoch", what),
        _ints(document.get("isr"), what),
        _int(document, "controller_epoch", what),
        _ints(document.get("elr", []), what),
        _ints(document.get("last_known_elr", []), what),
        _int(document, "last_known_leader", what) if "last_known_leader" in document else NO_LEADER,
        _int(document, "brokers_zxid", what) if "brokers_zxid" in document else 0,
        version,
    )


def encode_topic_config(config: Mapping[str, str]) -> bytes:
    return _dump({"version": 1, "config": dict(config)})


def decode_topic_config(name: str, data: bytes) -> dict[str, str]:
    what = topic_config_path(name)
    config = _load(data, what).get("config")
    if not isinstance(config, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config.items()
    ):
        raise ZnodeError(f"{what}: config is not a string map")
    return dict(config)


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    return _dump(
        {
            "version": 1,
            "broker": block.broker_id,
            "block_start": block.block_start,
            "block_end": block.block_end,
        }
    )


def _int_or_text(document: Mapping[str, Any], key: str, what: str) -> int:
    value = document.get(key)
    if isinstance(value, str) and value.isdigit():  # Kafka writes the ends as strings
        return int(value)
    return _int(document, key, what)


def decode_producer_id_block(data: bytes) -> ProducerIdBlock:
    what = PRODUCER_ID_BLOCK
    document = _load(data, what)
    block = ProducerIdBlock(
        _int(document, "broker", what),
        _int_or_text(document, "block_start", what),
        _int_or_text(document, "block_end", what),
    )
    if not 0 <= block.block_start <= block.block_end:
        raise ZnodeError(f"{what}: not a block: {block}")
    return block


def encode_producer_key(entry: KeyedProducerId) -> bytes:
    return _dump(
        {
            "version": 1,
            "producer_id": entry.producer_id,
            "producer_epoch": entry.producer_epoch,
            "last_used_ms": entry.last_used_ms,
        }
    )


def decode_producer_key(data: bytes, what: str = "producer key") -> KeyedProducerId:
    document = _load(data, what)
    return KeyedProducerId(
        _int(document, "producer_id", what),
        _int(document, "producer_epoch", what),
        _int(document, "last_used_ms", what),
    )
