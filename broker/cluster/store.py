"""The cluster's state in ZooKeeper: the one module that talks to it (kazoo).

Kafka's ZooKeeper-era mechanisms (``reference/replication.md`` sections 2 and 5):

* **Registration.** A broker creates the ephemeral ``/brokers/ids/<id>`` once its logs are
  recovered; the znode's creation zxid is its broker epoch, and its data reports whether
  its last stop was clean (``previous_broker_epoch``, KIP-966; ``live_brokers_view``
  reads them with a zxid that bounds them, for ``broker.cluster.election``). A node left
  by the broker's own previous life (kill -9 and a quick restart: the old session has not
  expired yet) is waited out until ``timeout_ms``, never treated as ours and never
  deleted: that is what KAFKA-6584 and KAFKA-14845 got wrong.
* **Controller election.** In one ZooKeeper transaction a candidate creates the
  ephemeral ``/controller`` and bumps ``/controller_epoch`` at the version it read. The
  winner gets a ``ControllerLease`` (its epoch and that znode's version); **every**
  controller write is a transaction that first checks ``/controller_epoch`` is still at
  that version, so a deposed controller that has not noticed (paused, partitioned) fails
  with ``ControllerMovedError`` instead of writing.
* **Compare-and-set.** Partition state is written at the znode version last read;
  ``StaleStateError`` means someone else wrote in between: re-read, never apply a diff.
* **Producer ids** (``broker/cluster/producer_ids.py``): a block of ids is claimed by a
  compare-and-set on ``/latest_producer_id_block`` (Kafka's ``ZkProducerIdManager``);
  a keyed id's znode is created if absent and refreshed or replaced by compare-and-set.

kazoo does not retry by default; reads here go through ``KazooRetry`` (idempotent), writes
do not (a create or a transaction retried after a lost connection may have happened).
Callbacks registered with ``watch_*`` run on kazoo's event thread: they must only hand
the event on (the controller's single event thread re-reads the state).

Reads and writes of many znodes at once (the metadata watcher's image, the controller's
batches of topics) are ``store_batch.BatchOps``', which this class inherits: pipelined
asynchronous calls instead of a round trip each (issue #34).

Thread-safe: kazoo's client is, and this class keeps no other mutable state.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.retry import KazooRetry

from tidelog.broker.cluster.errors import ControllerMovedError, StaleStateError, StoreError
from tidelog.broker.cluster.store_batch import BatchOps, raise_for_fenced, stage_topic_creation
from tidelog.broker.cluster.zk_handler import PollingHandler
from tidelog.broker.cluster.znodes import (
    ADMIN_DELETE_TOPICS,
    BROKER_IDS,
    CLUSTER_ID,
    CONTROLLER,
    CONTROLLER_EPOCH,
    PRODUCER_ID_BLOCK,
    PRODUCER_KEYS,
    TOPIC_CONFIGS,
    TOPICS,
    USERS_CONFIG,
    BrokerRegistration,
    KeyedProducerId,
    PartitionState,
    ProducerIdBlock,
    TopicAssignment,
    broker_path,
    decode_broker,
    decode_controller,
    decode_epoch,
    decode_partition_state,
    decode_producer_id_block,
    decode_producer_key,
    decode_topic,
    decode_topic_config,
    encode_broker,
    encode_controller,
    encode_epoch,
    encode_partition_state,
    encode_producer_id_block,
    encode_producer_key,
    encode_topic,
    encode_topic_config,
    partition_state_path,
    partitions_path,
    producer_key_path,
    topic_config_path,
    topic_path,
)

__all__ = [
    "ClusterStore",
    "ControllerLease",
    "ControllerMovedError",
    "LiveBrokers",
    "StaleStateError",
    "StateRead",
    "StoreError",
    "reconnect_retry",
    "split_connect_string",
]

log = logging.getLogger(__name__)

_BASE_PATHS = (BROKER_IDS, TOPICS, TOPIC_CONFIGS, ADMIN_DELETE_TOPICS, "/cluster", PRODUCER_KEYS)
_REGISTRATION_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class ControllerLease:
    """Proof of an election: the epoch won and the ``/controller_epoch`` version it left."""

    broker_id: int
    epoch: int
    epoch_version: int


def split_connect_string(connect: str) -> tuple[str, str]:
    """``"h1:p1,h2:p2/chroot"`` -> ``("h1:p1,h2:p2", "/chroot")`` (``""`` if none).

    Raises ``ValueError`` for an empty host list or a chroot that is ``/`` or ends in ``/``.
    """
    hosts, slash, chroot = connect.partition("/")
    if not hosts.strip():
        raise ValueError(f"zookeeper.connect: no hosts in {connect!r}")
    if slash:
        chroot = "/" + chroot
        if chroot == "/" or chroot.endswith("/"):
            raise ValueError(f"zookeeper.connect: bad chroot in {connect!r}")
    return hosts, chroot


class LiveBrokers(NamedTuple):
    """One read of the registrations: each live broker's, its epoch (the znode's
    creation zxid), and a zxid that bounds them (``PartitionState.brokers_zxid``): every
    live registration created at or before it is among these."""

    registrations: dict[int, BrokerRegistration]
    epochs: dict[int, int]
    brokers_zxid: int

    @property
    def uncleanly_restarted(self) -> set[int]:
        """Live brokers whose registration reports an unclean last stop (KIP-966)."""
        return {b for b, r in self.registrations.items() if not r.shut_down_cleanly}


class StateRead(NamedTuple):
    """A partition state znode as read: its content, version and last write's zxid."""

    state: PartitionState
    version: int
    written_zxid: int


def reconnect_retry(session_timeout_ms: int) -> KazooRetry:
    """How kazoo reconnects after a lost connection: forever, 100 ms doubling up to a third
    of the session timeout (at most 1 s). Kazoo's default doubles up to an hour: after
    ZooKeeper was away for a few minutes a broker would wait that long before trying
    again, its session long expired, fenced and unable to serve."""
    cap_s = min(session_timeout_ms / 3000, 1.0)
    return KazooRetry(
        max_tries=-1, delay=min(0.1, cap_s), backoff=2, max_jitter=0.1, max_delay=cap_s
    )


class ClusterStore(BatchOps):
    """The cluster's znodes through one kazoo session. Build with ``connect``."""

    def __init__(self, client: KazooClient, retry: KazooRetry) -> None:
        self._client = client
        self._retry = retry

    @classmethod
    def connect(
        cls, connect: str, *, session_timeout_ms: int = 18_000, connect_timeout_ms: int = 15_000
    ) -> ClusterStore:
        """Open a session (creating the chroot and the base paths if needed).

        Raises:
            StoreError: ZooKeeper did not answer within ``connect_timeout_ms``.
            ValueError: a malformed connect string.
        """
        hosts, chroot = split_connect_string(connect)
        timeout_s = connect_timeout_ms / 1000
        if chroot:
            bootstrap = KazooClient(
                hosts=hosts, timeout=session_timeout_ms / 1000, handler=PollingHandler()
            )
            try:
                bootstrap.start(timeout=timeout_s)
                bootstrap.ensure_path(chroot)
            except Exception as exc:
                raise StoreError(f"zookeeper.connect {connect}: {exc}") from exc
            finally:
                bootstrap.stop()
                bootstrap.close()
        client = KazooClient(
            hosts=hosts + chroot,
            timeout=session_timeout_ms / 1000,
            connection_retry=reconnect_retry(session_timeout_ms),
            handler=PollingHandler(),
        )
        try:
            client.start(timeout=timeout_s)
            for path in _BASE_PATHS:
                client.ensure_path(path)
        except Exception as exc:
            client.stop()
            client.close()
            raise StoreError(f"zookeeper.connect {connect}: {exc}") from exc
        retry = KazooRetry(max_tries=3, delay=0.1, max_delay=1.0, ignore_expire=False)
        return cls(client, retry)

    def close(self) -> None:
        """End the session: this broker's ephemeral znodes go at once."""
        self._client.stop()
        self._client.close()

    @property
    def connected(self) -> bool:
        return bool(self._client.connected)

    @property
    def session_id(self) -> int:
        session = self._client.client_id
        return int(session[0]) if session else 0

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """``listener("CONNECTED" | "SUSPENDED" | "LOST")`` on each session change.

        Runs on kazoo's thread and must not call ZooKeeper (kazoo forbids it there).
        """

        def forward(state: KazooState) -> None:
            listener(str(state))

        self._client.add_listener(forward)

    # --- the cluster id ---------------------------------------------------------------

    def cluster_id(self) -> str:
        """The cluster's id, created by the first broker that asks."""
        candidate = str(uuid.uuid4())
        try:
            self._client.create(CLUSTER_ID, candidate.encode())
            return candidate
        except NodeExistsError:
            data, _ = self._read(CLUSTER_ID)
            return data.decode()

    # --- brokers ---------------------------------------------------------------------

    def register_broker(self, registration: BrokerRegistration, *, timeout_ms: int) -> int:
        """Create ``/brokers/ids/<id>`` for this session; return the broker epoch (czxid).

        Waits out a node another session holds (this broker's previous life, or a second
        broker configured with the same id) for up to ``timeout_ms``.

        Raises:
            StoreError: the id stayed taken, or ZooKeeper failed.
        """
        path = broker_path(registration.broker_id)
        deadline = time.monotonic() + timeout_ms / 1000
        waited = False
        while True:
            try:
                self._client.create(path, encode_broker(registration), ephemeral=True)
            except NodeExistsError:
                try:
                    _, stat = self._client.get(path)
                except NoNodeError:
                    continue  # it just went: try again at once
                if stat.ephemeralOwner == self.session_id:
                    return int(stat.czxid)
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"broker id {registration.broker_id} is registered by another "
                        f"session (a previous life of this broker not yet expired, or "
                        f"another broker with broker.id={registration.broker_id})"
                    ) from None
                if not waited:
                    log.warning("%s exists from another session; waiting for it to expire", path)
                    waited = True
                time.sleep(_REGISTRATION_POLL_S)
                continue
            except Exception as exc:
                raise StoreError(f"registering {path}: {exc}") from exc
            _, stat = self._read(path)
            return int(stat.czxid)

    def live_broker_epochs(self) -> dict[int, int]:
        """Registered brokers' epochs (the creation zxid of each ``/brokers/ids/<id>``)."""
        return self.live_brokers_with_epochs()[1]

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        """Registered brokers by id (a node that vanishes while read is left out)."""
        return self.live_brokers_with_epochs()[0]

    def live_brokers_with_epochs(self) -> tuple[dict[int, BrokerRegistration], dict[int, int]]:
        """Both of the above from one read of the registrations."""
        found = self._registrations()
        return (
            {broker_id: decode_broker(broker_id, data) for broker_id, data, _ in found},
            {broker_id: int(stat.czxid) for broker_id, _, stat in found},
        )

    def live_brokers_view(self) -> LiveBrokers:
        """The registrations with their epochs and the zxid that bounds them.

        ``/brokers/ids``'s child zxid is read first: a registration created before that
        read is listed after it (unless it went: dead, not needed), one created after it
        has a larger czxid than the bound, so the bound (the larger of it and the largest
        czxid listed) never claims a registration that was not read.
        """
        try:
            stat = self._retry(self._client.exists, BROKER_IDS)
        except Exception as exc:
            raise StoreError(f"reading {BROKER_IDS}: {exc}") from exc
        bound = int(stat.pzxid) if stat is not None else 0
        registrations, epochs = self.live_brokers_with_epochs()
        return LiveBrokers(registrations, epochs, max([bound, *epochs.values()]))

    def _registrations(self) -> list[tuple[int, bytes, Any]]:
        """(id, data, stat) of every registration znode, by id; one that vanishes while
        read is left out."""
        out = []
        for child in self._children(BROKER_IDS):
            try:
                broker_id = int(child)
                data, stat = self._read(broker_path(broker_id))
            except (NoNodeError, ValueError):
                continue
            out.append((broker_id, data, stat))
        return sorted(out, key=lambda found: found[0])

    # --- the controller --------------------------------------------------------------

    def controller_id(self) -> int | None:
        """The current controller's broker id, or None while there is none."""
        try:
            data, _ = self._read(CONTROLLER)
        except NoNodeError:
            return None
        return decode_controller(data)

    def controller_epoch(self) -> tuple[int, int]:
        """``(epoch, znode version)`` of ``/controller_epoch``; ``(0, -1)`` before any."""
        try:
            data, stat = self._read(CONTROLLER_EPOCH)
        except NoNodeError:
            return 0, -1
        return decode_epoch(data), int(stat.version)

    def try_become_controller(self, broker_id: int, now_ms: int) -> ControllerLease | None:
        """Run one election round: the lease if this broker won, None if another holds it.

        Raises ``StoreError`` if ZooKeeper failed.
        """
        epoch, version = self.controller_epoch()
        if version < 0:
            try:
                self._client.create(CONTROLLER_EPOCH, encode_epoch(0))
            except NodeExistsError:
                pass
            epoch, version = self.controller_epoch()
        transaction = self._client.transaction()
        transaction.create(CONTROLLER, encode_controller(broker_id, now_ms), ephemeral=True)
        transaction.set_data(CONTROLLER_EPOCH, encode_epoch(epoch + 1), version=version)
        results = self._commit(transaction, "controller election")
        if any(isinstance(r, Exception) for r in results):
            return None  # NodeExists (a controller is there) or BadVersion (one just won)
        return ControllerLease(broker_id, epoch + 1, version + 1)

    def resign(self, lease: ControllerLease) -> None:
        """Delete ``/controller`` if this session holds it (a clean shutdown)."""
        try:
            data, stat = self._read(CONTROLLER)
        except NoNodeError:
            return
        if decode_controller(data) == lease.broker_id and stat.ephemeralOwner == self.session_id:
            try:
                self._client.delete(CONTROLLER, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass

    # --- topics (controller writes, fenced) ---------------------------------------------

    def create_topic(
        self,
        lease: ControllerLease,
        assignment: TopicAssignment,
        config: Mapping[str, str],
        states: Mapping[int, PartitionState],
    ) -> None:
        """Create a topic's assignment, config and partition states in one fenced write.

        Raises:
            ControllerMovedError: ``lease`` is no longer current.
            StaleStateError: the topic exists.
        """
        transaction = self._fenced(lease)
        stage_topic_creation(transaction, assignment, config, states)
        self._commit_fenced(transaction, f"creating topic {assignment.name}", exists_is_stale=True)

    def add_partitions(
        self,
        lease: ControllerLease,
        assignment: TopicAssignment,
        expected_version: int,
        states: Mapping[int, PartitionState],
    ) -> None:
        """Grow a topic: its new assignment (CAS at ``expected_version``) and new states."""
        transaction = self._fenced(lease)
        name = assignment.name
        transaction.set_data(topic_path(name), encode_topic(assignment), version=expected_version)
        for partition, state in states.items():
            transaction.create(f"{partitions_path(name)}/{partition}", b"")
            transaction.create(partition_state_path(name, partition), encode_partition_state(state))
        self._commit_fenced(transaction, f"growing topic {name}", exists_is_stale=True)

    def write_reassignment(
        self,
        lease: ControllerLease,
        assignment: TopicAssignment,
        expected_version: int,
        states: Mapping[int, tuple[PartitionState, int]],
    ) -> None:
        """A reassignment step (``broker.cluster.reassignment``): the topic's assignment
        (with its ``adding``/``removing`` lists) at ``expected_version`` and the changed
        partition states, each at the version read, in one fenced transaction: no broker
        ever reads a replica list without the state (leader epoch) that goes with it.

        Raises:
            ControllerMovedError: ``lease`` is no longer current.
            StaleStateError: the topic or a state moved on since read.
        """
        transaction = self._fenced(lease)
        name = assignment.name
        transaction.set_data(topic_path(name), encode_topic(assignment), version=expected_version)
        for partition, (state, version) in states.items():
            transaction.set_data(
                partition_state_path(name, partition),
                encode_partition_state(state),
                version=version,
            )
        self._commit_fenced(transaction, f"reassigning partitions of {name}")

    def set_topic_config(
        self, lease: ControllerLease, name: str, config: Mapping[str, str]
    ) -> None:
        transaction = self._fenced(lease)
        transaction.set_data(topic_config_path(name), encode_topic_config(config))
        self._commit_fenced(transaction, f"configuring topic {name}")

    def delete_topic(self, lease: ControllerLease, name: str) -> None:
        """Remove a topic's znodes (its assignment, states and config)."""
        assignment = self.read_topic(name)
        if assignment is None:
            return
        transaction = self._fenced(lease)
        for partition in assignment.replicas:
            transaction.delete(partition_state_path(name, partition))
            transaction.delete(f"{partitions_path(name)}/{partition}")
        transaction.delete(partitions_path(name))
        transaction.delete(topic_path(name))
        transaction.delete(topic_config_path(name))
        self._commit_fenced(transaction, f"deleting topic {name}")

    def topics(self) -> list[str]:
        return sorted(self._children(TOPICS))

    def read_topic(self, name: str) -> TopicAssignment | None:
        assignment = self.read_topic_versioned(name)
        return None if assignment is None else assignment[0]

    def read_topic_versioned(self, name: str) -> tuple[TopicAssignment, int] | None:
        try:
            data, stat = self._read(topic_path(name))
        except NoNodeError:
            return None
        return decode_topic(name, data), int(stat.version)

    def read_topic_config(self, name: str) -> dict[str, str]:
        try:
            data, _ = self._read(topic_config_path(name))
        except NoNodeError:
            return {}
        return decode_topic_config(name, data)

    # --- partition state -------------------------------------------------------------

    def read_partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        """``(state, znode version)``, or None if the partition has no state znode."""
        found = self.read_partition_state_written(topic, partition)
        return None if found is None else (found.state, found.version)

    def read_partition_state_written(self, topic: str, partition: int) -> StateRead | None:
        """The state with its znode version and the zxid of its last write (compared with
        a leader's broker epoch: ``broker.cluster.election.leadership_predates_leader``),
        or None if the partition has no state znode."""
        path = partition_state_path(topic, partition)
        try:
            data, stat = self._read(path)
        except NoNodeError:
            return None
        version = int(stat.version)
        return StateRead(decode_partition_state(data, path, version), version, int(stat.mzxid))

    def set_partition_state(
        self,
        lease: ControllerLease,
        topic: str,
        partition: int,
        state: PartitionState,
        expected_version: int,
    ) -> int:
        """The controller's write (an election): fenced and CAS; returns the new version."""
        transaction = self._fenced(lease)
        transaction.set_data(
            partition_state_path(topic, partition),
            encode_partition_state(state),
            version=expected_version,
        )
        self._commit_fenced(transaction, f"electing {topic}-{partition}")
        return expected_version + 1

    def update_isr(
        self, topic: str, partition: int, state: PartitionState, expected_version: int
    ) -> int:
        """A leader's ISR change: CAS on the state znode; returns the new version.

        Raises ``StaleStateError`` if the znode moved on (the caller re-reads: if it is no
        longer leader at its epoch it stops leading).
        """
        path = partition_state_path(topic, partition)
        try:
            stat = self._client.set(path, encode_partition_state(state), version=expected_version)
        except (BadVersionError, NoNodeError) as exc:
            raise StaleStateError(f"{path} moved on: {exc!r}") from None
        except Exception as exc:
            raise StoreError(f"writing {path}: {exc}") from exc
        return int(stat.version)

    # --- producer ids (any broker; compare-and-set, never fenced by the controller) -------

    def read_producer_id_block(self) -> tuple[ProducerIdBlock, int] | None:
        """The last claimed block and its znode version, or None before the first claim."""
        try:
            data, stat = self._read(PRODUCER_ID_BLOCK)
        except NoNodeError:
            return None
        return decode_producer_id_block(data), int(stat.version)

    def claim_producer_id_block(self, block: ProducerIdBlock, expected_version: int) -> None:
        """Write ``block`` as the latest, at ``expected_version`` (-1: the first claim).

        Not retried: after a lost connection the write may have happened, and the caller's
        next claim (after a re-read) skips the block, which is safe: ids are lost, never
        handed out twice.

        Raises:
            StaleStateError: another broker claimed a block since the read.
            StoreError: ZooKeeper failed.
        """
        data = encode_producer_id_block(block)
        try:
            if expected_version < 0:
                self._client.create(PRODUCER_ID_BLOCK, data)
            else:
                self._client.set(PRODUCER_ID_BLOCK, data, version=expected_version)
        except (NodeExistsError, BadVersionError, NoNodeError) as exc:
            raise StaleStateError(f"{PRODUCER_ID_BLOCK} moved on: {exc!r}") from None
        except Exception as exc:
            raise StoreError(f"claiming producer ids {block}: {exc}") from exc

    def producer_key_names(self) -> list[str]:
        """The children of ``/tidelog/producer_keys`` (``znodes.producer_key_name``)."""
        return sorted(self._children(PRODUCER_KEYS))

    def read_producer_key(self, name: str) -> tuple[KeyedProducerId, int] | None:
        """A key's entry and znode version, or None if it has none."""
        path = producer_key_path(name)
        try:
            data, stat = self._read(path)
        except NoNodeError:
            return None
        return decode_producer_key(data, path), int(stat.version)

    def write_producer_key(self, name: str, entry: KeyedProducerId, expected_version: int) -> None:
        """Create a key's znode (``expected_version`` -1) or replace it by compare-and-set.

        Raises:
            StaleStateError: the znode exists (create) or moved on or went (replace).
            StoreError: ZooKeeper failed.
        """
        path = producer_key_path(name)
        data = encode_producer_key(entry)
        try:
            if expected_version < 0:
                self._client.create(path, data)
            else:
                self._client.set(path, data, version=expected_version)
        except (NodeExistsError, BadVersionError, NoNodeError) as exc:
            raise StaleStateError(f"{path} moved on: {exc!r}") from None
        except Exception as exc:
            raise StoreError(f"writing {path}: {exc}") from exc

    def delete_producer_key(self, name: str, expected_version: int) -> bool:
        """Delete a key's znode if still at ``expected_version``; False if it moved or went.

        Raises ``StoreError`` if ZooKeeper failed.
        """
        path = producer_key_path(name)
        try:
            self._client.delete(path, version=expected_version)
        except (BadVersionError, NoNodeError):
            return False
        except Exception as exc:
            raise StoreError(f"deleting {path}: {exc}") from exc
        return True

    # --- SCRAM users (Kafka's /config/users/<name>, broker.core.users) ----------------------

    def user_names(self) -> list[str]:
        """The children of ``/config/users``."""
        return sorted(self._children(USERS_CONFIG))

    def read_user(self, name: str) -> bytes | None:
        """A user's znode data (Kafka's JSON), or None if there is none."""
        try:
            data, _ = self._read(f"{USERS_CONFIG}/{name}")
        except NoNodeError:
            return None
        return data

    def write_user(self, name: str, data: bytes) -> None:
        """Create or replace a user's znode. Raises ``StoreError``."""
        path = f"{USERS_CONFIG}/{name}"
        try:
            self._client.ensure_path(USERS_CONFIG)
            try:
                self._client.create(path, data)
            except NodeExistsError:
                self._client.set(path, data)
        except Exception as exc:
            raise StoreError(f"writing {path}: {exc}") from exc

    def delete_user(self, name: str) -> bool:
        """Delete a user's znode; False if there was none. Raises ``StoreError``."""
        path = f"{USERS_CONFIG}/{name}"
        try:
            self._client.delete(path)
        except NoNodeError:
            return False
        except Exception as exc:
            raise StoreError(f"deleting {path}: {exc}") from exc
        return True

    # --- small documents (ACLs) -------------------------------------------------------

    def read_document(self, path: str) -> tuple[bytes, int] | None:
        """``(data, znode version)`` of ``path``, None if it does not exist."""
        try:
            data, stat = self._read(path)
        except NoNodeError:
            return None
        return data, int(stat.version)

    def write_document(self, path: str, data: bytes, expected_version: int) -> None:
        """Create ``path`` (``expected_version`` -1, parents too) or replace it by
        compare-and-set. Raises ``StaleStateError`` if someone wrote first."""
        try:
            if expected_version < 0:
                self._client.create(path, data, makepath=True)
            else:
                self._client.set(path, data, version=expected_version)
        except (NodeExistsError, BadVersionError, NoNodeError) as exc:
            raise StaleStateError(f"{path} moved on: {exc!r}") from None
        except Exception as exc:
            raise StoreError(f"writing {path}: {exc}") from exc

    # --- watches ---------------------------------------------------------------------

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        """``callback(children)`` now and after every change (re-armed by kazoo)."""
        self._client.ChildrenWatch(path, callback)

    def watch_data(self, path: str, callback: Callable[[bytes | None], None]) -> None:
        """``callback(data or None)`` now and after every change of ``path``'s data."""

        def forward(data: bytes | None, _stat: object) -> None:
            callback(data)

        self._client.DataWatch(path, forward)

    # --- helpers ---------------------------------------------------------------------

    def _read(self, path: str) -> tuple[bytes, Any]:
        try:
            data, stat = self._retry(self._client.get, path)
        except NoNodeError:
            raise
        except Exception as exc:
            raise StoreError(f"reading {path}: {exc}") from exc
        return bytes(data), stat

    def _children(self, path: str) -> list[str]:
        try:
            return list(self._retry(self._client.get_children, path))
        except NoNodeError:
            return []
        except Exception as exc:
            raise StoreError(f"listing {path}: {exc}") from exc

    def _commit(self, transaction: Any, what: str) -> list[object]:
        try:
            return list(transaction.commit())
        except Exception as exc:
            raise StoreError(f"{what}: {exc}") from exc

    def _commit_fenced(
        self, transaction: object, what: str, *, exists_is_stale: bool = False
    ) -> None:
        raise_for_fenced(self._commit(transaction, what), what, exists_is_stale=exists_is_stale)
