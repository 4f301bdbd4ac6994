"""A broker's membership of a cluster: registration, controller duties, placement.

``ClusterNode.start`` runs once the broker's logs are recovered and its listener is bound
(Kafka registers only then, so a broker is never listed before it can serve):

1. open the ZooKeeper session (``zookeeper.connect``); check the cluster id against the
   data directory's ``meta.properties`` (a directory never joins another cluster);
2. register ``/brokers/ids/<broker.id>`` with the advertised address, waiting out a node
   left by this broker's previous life;
3. start the metadata watcher, whose every new view (a) becomes the core's placement
   (``ClusterPlacement``: who leads what, fenced by leader epochs) and (b) is applied to
   the local logs: topics are created, grown, reconfigured and deleted here as the
   controller decided;
4. start this broker's controller candidate (``controller.Controller``), which creates
   the offsets topic in ZooKeeper when it first wins.

Topic administration in cluster mode goes through the controller: the core's admin
calls reach ``ClusterNode`` (the ``TopicAdmin`` seam), which runs them on the local
controller if this broker holds the lease and otherwise forwards them to the controller
(``broker.cluster.forwarding``, Kafka's KIP-590 idea): every call, on every broker, on
both listeners. Decided per call: AlterConfigs / IncrementalAlterConfigs of a topic and
Metadata's auto-creation reach any broker in Kafka (its clients send them to the least
loaded broker), so they must be forwarded; CreateTopics, DeleteTopics, CreatePartitions,
ElectLeaders and the reassignment calls go to the controller in Kafka's clients, and are
forwarded all the same (harmless when they arrive there, and Tidelog's AdminClient needs
no controller routing). A call returns once this broker's own view shows the change, so
a describe that follows on the same broker sees it.

Replication (``broker.cluster.replicas``, ``docs/replication.md``): every view also goes
to the replica manager, which makes this broker leader or follower of the partitions it
is a replica of; its fetchers copy the leaders' logs.

Every broker keeps a local log for every partition of every topic; only the replicas'
logs ever receive data (produce and fetch are refused elsewhere by the placement).

Cut off from ZooKeeper (issue #33, ``broker.cluster.session``): once its session may
have expired, the broker vouches for no role (one ``SessionFence`` shared by the
placement, the controller and the session thread): Metadata shows no leader for the
partitions it led and no controller, their produces and fetches get
``NOT_LEADER_OR_FOLLOWER``, admin calls ``NOT_CONTROLLER``, until it is back on
ZooKeeper and has re-read the cluster.

Thread-safe.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import grpc

from tidelog.broker.cluster.controller import (
    Controller,
    ControllerSettings,
    InternalTopic,
    Reassignments,
)
from tidelog.broker.cluster.fetcher import FetcherPool
from tidelog.broker.cluster.forwarding import (
    FORWARD_TIMEOUT_MS,
    Forwarder,
    decode_codes,
    decode_reassignments,
    encode_partitions,
    encode_targets,
    run_call,
)
from tidelog.broker.cluster.isr_writes import write_isr_batch
from tidelog.broker.cluster.metadata import ClusterMetadata, MetadataWatcher
from tidelog.broker.cluster.replicas import IsrProposal, ReplicaManager, ReplicaSettings
from tidelog.broker.cluster.session import SessionFence, step_down_delay_ms
from tidelog.broker.cluster.store import ClusterStore, StoreError
from tidelog.broker.cluster.topic_batches import TopicBatches
from tidelog.broker.cluster.txn_peers import GrpcTxnPeers
from tidelog.broker.cluster.znodes import (
    KAFKA_LISTENER,
    NO_LEADER,
    BrokerRegistration,
    ListenerEndpoint,
)
from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.configs import AppliedConfigs
from tidelog.broker.core.meta_properties import ensure_meta_properties
from tidelog.broker.core.metrics import BrokerMetrics
from tidelog.broker.core.partitions import PartitionRegistry
from tidelog.broker.core.placement import (
    BrokerEndpoint,
    ClusterView,
    Growth,
    NewTopic,
    PartitionPlacement,
)
from tidelog.broker.tls import InterBrokerChannels
from tidelog.proto.tidelog.v1 import broker_pb2 as pb
from tidelog.proto.tidelog.v1 import broker_pb2_grpc as pb_grpc
from tidelog.storage.clock import Clock
from tidelog.storage.errors import (
    BrokerUnavailableError,
    LeaderNotAvailableError,
    NotControllerError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from tidelog.storage.log_manager import LogManager

__all__ = ["ClusterNode", "ClusterPlacement", "LocalTopics"]

log = logging.getLogger(__name__)

_NO_PLACEMENT = PartitionPlacement(NO_LEADER, -1, (), ())
_VIEW_WAIT_MS = 10_000  # how long an admin call waits for this broker's view to catch up
_SHUTDOWN_WAIT_MS = 15_000  # how long a controlled shutdown may take before stopping anyway
_MAX_PLACEMENTS = 200_000  # ClusterPlacement's memo, emptied when it reaches this


class LocalTopics(Protocol):
    """What the node needs of the core to keep local logs in step and replicate them
    (``BrokerCore``)."""

    @property
    def logs(self) -> LogManager: ...

    @property
    def partitions(self) -> PartitionRegistry:
        """The core's partitions (replicated), which the replica manager shares."""
        ...

    def apply_cluster_topics(self, topics: Mapping[str, tuple[int, Mapping[str, str]]]) -> None: ...

    def became_leader(self, topic: str, partition: int) -> None: ...

    @property
    def metrics(self) -> BrokerMetrics: ...


class ClusterPlacement:
    """Leadership from the ZooKeeper view. Thread-safe (reads one immutable snapshot)."""

    def __init__(
        self,
        broker_id: int,
        cluster_id: str,
        watcher: MetadataWatcher,
        store: ClusterStore | None = None,
        fence: SessionFence | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._cluster_id = cluster_id
        self._watcher = watcher
        self._store = store
        self._fence = fence or SessionFence()
        # (topic, partition) -> (state, replicas, cut off, placement): ``partition``.
        self._placements: dict[tuple[str, int], tuple[Any, Any, bool, PartitionPlacement]] = {}

    def cluster(self) -> ClusterView:
        """Cut off from ZooKeeper (``broker.cluster.session``), the controller is -1 (this
        broker cannot tell who it is; clients take it as a sign to ask another broker),
        and the brokers are still listed, so a client learns where else to ask."""
        snapshot = self._watcher.snapshot
        controller = snapshot.controller_id if snapshot.controller_id is not None else NO_LEADER
        cut_off = self._fence.cut_off
        if cut_off:
            controller = NO_LEADER
        return ClusterView(
            self._cluster_id,
            self._broker_id,
            controller,
            tuple(
                BrokerEndpoint(b.broker_id, b.host, b.port, _kafka_endpoint(b), b.rack)
                for b in snapshot.brokers.values()
            ),
            cut_off,
        )

    def topics(self) -> Mapping[str, int]:
        return {
            name: t.assignment.partition_count for name, t in self._watcher.snapshot.topics.items()
        }

    def partition(self, topic: str, partition: int) -> PartitionPlacement:
        """The same object while the state, replicas and cut-off are (issue #34: Metadata
        for every partition builds none anew, and ``broker.kafka.metadata_cache`` then
        compares by identity). The image keeps an unchanged state's object across
        re-reads; the memo holds it, so ``is`` cannot meet a reused id."""
        found = self._watcher.snapshot.topics.get(topic)
        if found is None or partition not in found.assignment.replicas:
            return _NO_PLACEMENT
        state = found.states.get(partition)
        replicas = found.assignment.replicas[partition]
        cut_off = self._fence.cut_off
        key = (topic, partition)
        memo = self._placements.get(key)
        if memo is not None and memo[0] is state and memo[1] is replicas and memo[2] == cut_off:
            return memo[3]
        placed = self._place(state, replicas, cut_off)
        if len(self._placements) >= _MAX_PLACEMENTS:
            self._placements.clear()  # deleted topics' entries: dropped now and then
        self._placements[key] = (state, replicas, cut_off, placed)
        return placed

    def _place(self, state: Any, replicas: tuple[int, ...], cut_off: bool) -> PartitionPlacement:
        if state is None:
            return PartitionPlacement(NO_LEADER, -1, replicas, ())
        # Issue #33: cut off from ZooKeeper, this broker cannot vouch for its own
        # leadership (another may have been elected): no leader, LEADER_NOT_AVAILABLE.
        # Others' leaderships stay as last seen: elected by others, the best guess.
        leader = NO_LEADER if state.leader == self._broker_id and cut_off else state.leader
        return PartitionPlacement(
            leader, state.leader_epoch, replicas, state.isr, state.elr, state.last_known_elr
        )

    def check_leader(self, topic: str, partition: int) -> None:
        found = self._watcher.snapshot.topics.get(topic)
        if found is None or partition not in found.assignment.replicas:
            raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{partition}")
        leader = found.leader(partition)
        if leader == self._broker_id:
            reason = self._fence.reason
            if reason is not None:
                # No new-leader hint: cut off, this broker does not know who leads now.
                raise NotLeaderOrFollowerError(
                    f"broker {self._broker_id} no longer vouches for leading "
                    f"{topic}-{partition}: {reason}; ask another broker"
                )
            return
        if leader == NO_LEADER:
            raise LeaderNotAvailableError(
                f"{topic}-{partition} has no leader: it is offline until one of its in-sync "
                f"replicas {list(found.assignment.replicas[partition])} is back"
            )
        raise NotLeaderOrFollowerError(
            f"broker {self._broker_id} does not lead {topic}-{partition}; broker {leader} does"
        )

    def confirm_leader(self, topic: str, partition: int) -> None:
        """``check_leader``, then the partition's state znode must name this broker leader
        at the epoch this broker's view has: a broker whose view lags a leadership change
        (a watch not yet delivered) would otherwise answer from a stale cache."""
        self.check_leader(topic, partition)
        if self._store is None:
            return
        try:
            found = self._store.read_partition_state(topic, partition)
        except StoreError as exc:
            raise LeaderNotAvailableError(f"cannot confirm {topic}-{partition}: {exc}") from None
        mine = self.partition(topic, partition)
        if found is None or found[0].leader != self._broker_id:
            raise NotLeaderOrFollowerError(
                f"broker {self._broker_id} no longer leads {topic}-{partition}"
            )
        if found[0].leader_epoch != mine.leader_epoch:
            raise LeaderNotAvailableError(
                f"{topic}-{partition}: this broker's view is at epoch {mine.leader_epoch}, "
                f"the coordinator's at {found[0].leader_epoch}; retry"
            )

    def check_joined(self) -> None:
        return None  # this placement exists once the broker has the cluster's view


class ClusterNode:
    """This broker's part in the cluster. Build with ``start``; ``stop`` once."""

    def __init__(
        self,
        config: BrokerConfig,
        store: ClusterStore,
        watcher: MetadataWatcher,
        controller: Controller,
        placement: ClusterPlacement,
        fence: SessionFence,
        replicas: ReplicaManager | None = None,
        registration: BrokerRegistration | None = None,
        local: LocalTopics | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._watcher = watcher
        self._controller = controller
        self.placement = placement
        self._fence = fence
        self.replicas = replicas
        # What to register again after a lost session (None: never registered).
        self._registration = registration
        self._local = local  # its logs' clean-shutdown marker gets each new broker epoch
        self._forwarder = Forwarder(
            config.broker_id, InterBrokerChannels(config.security), controller, fence, watcher
        )
        self._batches = TopicBatches(self._forwarder.run, watcher)
        # Transaction calls to other brokers (markers, KIP-890 verification): the
        # membership's ``txn_peers`` once the broker joined.
        self.txn_peers = GrpcTxnPeers(
            config.broker_id, InterBrokerChannels(config.security), self._grpc_address
        )
        self._session_events: queue.Queue[str] = queue.Queue()
        self._session_thread = threading.Thread(
            target=self._run_session_events,
            name=f"tidelog-zk-session-{config.broker_id}",
            daemon=True,
        )

    @classmethod
    def start(
        cls,
        config: BrokerConfig,
        local: LocalTopics,
        clock: Clock,
        endpoint: tuple[str, int],
        *,
        internal_topics: Mapping[str, InternalTopic],
        listeners: Sequence[ListenerEndpoint] = (),
    ) -> ClusterNode:
        """Join the cluster (steps 1-4 above). Raises ``StoreError`` or ``InvalidConfigError``.

        ``endpoint`` is the gRPC listener's advertised address; ``listeners`` the broker's
        other bound listeners (the Kafka listener), registered beside it (``znodes``).
        ``internal_topics`` (the offsets topic, ``__transaction_state``) are created in
        ZooKeeper by the controller if missing, with these partition counts, replication
        factors and configs.
        """
        assert config.zookeeper_connect is not None
        store = ClusterStore.connect(
            config.zookeeper_connect,
            session_timeout_ms=config.zookeeper_session_timeout_ms,
            connect_timeout_ms=config.zookeeper_connection_timeout_ms,
        )
        try:
            cluster_id = store.cluster_id()
            ensure_meta_properties(config.data_dir, config.broker_id, cluster_id)
            host, port = endpoint
            # KIP-966: report what the clean-shutdown marker said (-1: not clean, this
            # broker may have lost unsynced records), and write this registration's epoch
            # into the next marker.
            broker_epoch = store.register_broker(
                BrokerRegistration(
                    config.broker_id,
                    host,
                    port,
                    clock.wall_ms(),
                    tuple(listeners),
                    local.logs.previous_broker_epoch,
                    config.broker_rack,
                ),
                timeout_ms=config.zookeeper_session_timeout_ms * 2,
            )
            local.logs.record_broker_epoch(broker_epoch)

            replicas_box: list[ReplicaManager] = []

            def apply(snapshot: ClusterMetadata) -> None:
                local.apply_cluster_topics(
                    {
                        name: (t.assignment.partition_count, dict(t.config))
                        for name, t in snapshot.topics.items()
                    }
                )
                for replicas in replicas_box:
                    replicas.apply(snapshot)

            watcher = MetadataWatcher(store, apply)
            replicas = _start_replicas(config, store, watcher, local, clock)
            replicas_box.append(replicas)
            fence = SessionFence()
            placement = ClusterPlacement(config.broker_id, cluster_id, watcher, store, fence)
            controller = Controller(
                store,
                ControllerSettings(
                    config.broker_id,
                    unclean_leader_election=config.unclean_leader_election_enable,
                    internal_replication_factor=config.offsets_topic_replication_factor,
                    leader_rebalance_interval_ms=(
                        config.leader_imbalance_check_interval_seconds * 1000
                        if config.auto_leader_rebalance_enable
                        else 0
                    ),
                    min_insync_replicas=config.log_defaults.min_insync_replicas,
                ),
                clock,
                internal_topics=internal_topics,
                fence=fence,
                image=watcher.image_read,
                view_wait=watcher.wait_for,
            )
            watcher.start()
            controller.start()
        except BaseException:
            store.close()
            raise
        # Registered again after a lost session, the process (and its log) did not stop:
        # a clean "previous life" whose epoch is the one just registered.
        registration = BrokerRegistration(
            config.broker_id,
            host,
            port,
            clock.wall_ms(),
            tuple(listeners),
            broker_epoch,
            config.broker_rack,
        )
        node = cls(
            config, store, watcher, controller, placement, fence, replicas, registration, local
        )

        def counts() -> tuple[int, int, int]:
            under, led = replicas.counts()
            offline = 0
            if controller.is_controller:
                view = watcher.snapshot
                offline = sum(
                    1
                    for topic in view.topics.values()
                    for partition in topic.assignment.replicas
                    if topic.leader(partition) == NO_LEADER
                )
            return under, offline, led

        local.metrics.add_replication_collector(counts, replicas.follower_lag)
        store.add_state_listener(node._on_session_state)
        node._session_thread.start()
        if not watcher.wait_for(lambda m: config.broker_id in m.brokers, _VIEW_WAIT_MS):
            log.warning("broker %d: no cluster view yet; serving anyway", config.broker_id)
        log.info("broker %d joined cluster %s at %s:%d", config.broker_id, cluster_id, host, port)
        return node

    # --- the ZooKeeper session ------------------------------------------------------------

    def _on_session_state(self, state: str) -> None:
        # kazoo's thread, where no ZooKeeper call may be made: hand it on.
        self._session_events.put(state)

    def _run_session_events(self) -> None:
        """Step down when cut off from ZooKeeper; after a session expired, register again.

        Cut off (kazoo's ``SUSPENDED``) for ``step_down_delay_ms`` (a third of the session
        timeout: by then the servers may have expired the session, ``broker.cluster.
        session``), the broker stops vouching for any role at once (issue #33): the
        placement answers Metadata with no leader for the partitions it led and
        ``NOT_LEADER_OR_FOLLOWER`` to their produces and fetches, the controller refuses
        admin calls, the replica manager resigns (parked ``acks=all`` produces fail).
        When kazoo is back on the same session, the broker re-reads the cluster and
        vouches again. When the session expired (``LOST``), its ephemeral registration
        and (if it was controller) ``/controller`` are gone and the other brokers have
        moved on: on the new session the broker registers again (after a leftover of the
        old session, if any, expired), re-reads the cluster, and only then vouches again,
        for what the new view says it leads.
        """
        lost = False
        suspended_at: float | None = None
        delay_s = step_down_delay_ms(self._config.zookeeper_session_timeout_ms) / 1000
        while True:
            wait = None
            if suspended_at is not None and not self._fence.cut_off:
                wait = max(suspended_at + delay_s - time.monotonic(), 0.0)
            try:
                state = self._session_events.get(timeout=wait)
            except queue.Empty:
                self._step_down("cut off from ZooKeeper past a third of the session timeout")
                continue
            if state == "stop":
                return
            if state == "SUSPENDED":
                suspended_at = suspended_at or time.monotonic()
                continue
            suspended_at = None
            if state == "LOST":
                lost = True
                self._controller.session_lost()
                self._step_down("ZooKeeper session lost")
                log.warning("broker %d: ZooKeeper session lost", self._config.broker_id)
            elif state == "CONNECTED" and lost and self._registration is not None:
                try:
                    epoch = self._store.register_broker(
                        self._registration, timeout_ms=self._config.zookeeper_session_timeout_ms * 2
                    )
                    if self._local is not None:
                        self._local.logs.record_broker_epoch(epoch)
                    self._registration = replace(self._registration, previous_broker_epoch=epoch)
                    lost = False
                    log.info("broker %d registered again", self._config.broker_id)
                except Exception as exc:
                    log.error("broker %d could not register again: %s", self._config.broker_id, exc)
                self._vouch_again()
            elif state == "CONNECTED" and self._fence.cut_off:
                self._vouch_again()

    def _step_down(self, reason: str) -> None:
        if not self._fence.cut(reason):
            return
        log.warning("broker %d steps down: %s", self._config.broker_id, reason)
        if self.replicas is not None:
            self.replicas.resign_all(reason)

    def _vouch_again(self) -> None:
        """Roles again, from a view read on the session as it is now (not the stale one
        the placement holds): the replica manager takes them from that view first, then
        the placement and the controller answer again."""
        if not self._watcher.refresh_and_wait(self._config.zookeeper_session_timeout_ms):
            log.warning(
                "broker %d: no fresh cluster view after reconnecting; vouching again anyway",
                self._config.broker_id,
            )
        if self._fence.restore():
            log.info("broker %d vouches for its roles again", self._config.broker_id)
            self._controller.session_restored()

    def stop(self) -> None:
        """Leave: controlled shutdown, resign what is left, then end the session.

        Controlled shutdown (``controlled.shutdown.enable``) asks the controller (this
        broker's own, or another over ``ControlledShutdown``) to move this broker's
        leaderships to other in-sync replicas, then waits until this broker's view shows
        it leads nothing, so clients move before the broker goes. Bounded by
        ``_SHUTDOWN_WAIT_MS``; a failure is logged and the broker stops anyway (its
        session's end makes the controller elect the same way, a little later).

        Then the broker resigns every role it still has, once no new view can hand one
        back (the watcher stopped): a leadership the controller did not move (an ISR of
        this broker alone, the controller unreachable or slow, controlled shutdown off)
        would otherwise keep its parked ``acks=all`` produces and group offset commits
        waiting on followers until their own timeouts, and the stop with them: the gRPC
        grace period for a produce, ``core.close``'s 30 s bound for a commit ("closing
        with 1 operations still in flight", bug 2 of ``docs/reliability.md``). Resigned,
        they answer ``NOT_LEADER_OR_FOLLOWER`` at once: retriable, and no claim that the
        records were written (they may or may not survive, as with any lost leader), as
        Kafka's broker answers them when its controlled shutdown makes it a follower.
        New produces meet the same answer until the core refuses everything.
        """
        if self._config.controlled_shutdown_enable:
            try:
                self._controlled_shutdown()
            except Exception as exc:
                log.warning("controlled shutdown failed: %s", exc)
        self._controller.stop()
        self._watcher.stop()
        if self.replicas is not None:
            self.replicas.resign_all("the broker is stopping")
            self.replicas.stop()
        self._session_events.put("stop")
        self.txn_peers.close()
        self._store.close()

    def _grpc_address(self, broker_id: int) -> str | None:
        """Broker ``broker_id``'s gRPC ``HOST:PORT`` in this broker's view now."""
        found = self._watcher.snapshot.brokers.get(broker_id)
        return None if found is None else f"{found.host}:{found.port}"

    def _controlled_shutdown(self) -> None:
        me = self._config.broker_id
        deadline = time.monotonic() + _SHUTDOWN_WAIT_MS / 1000
        while True:
            try:
                remaining = self._ask_controller_to_move(me, deadline)
                break
            except NotControllerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        left_ms = max(int((deadline - time.monotonic()) * 1000), 0)

        def leads_nothing_movable(view: ClusterMetadata) -> bool:
            # A partition whose ISR is this broker alone has nobody to move to: the
            # controller keeps it here until the broker stops (as Kafka's), and waiting
            # for it to move only delayed the shutdown by the whole bound (issue #29:
            # a controller's SIGTERM took 50 s).
            for topic in view.topics.values():
                for state in topic.states.values():
                    if state is None or state.leader != me:
                        continue
                    if any(r != me for r in state.isr):
                        return False
            return True

        done = self._watcher.wait_for(leads_nothing_movable, left_ms)
        log.info(
            "controlled shutdown: done, the controller left %d leadership(s) here%s",
            remaining,
            "" if done else " (this broker's view did not show all of it in time)",
        )

    def _ask_controller_to_move(self, me: int, deadline: float) -> int:
        if self._controller.is_controller:
            return self._controller.controlled_shutdown(me)
        view = self._watcher.snapshot
        controller = view.brokers.get(view.controller_id if view.controller_id is not None else -1)
        if controller is None:
            raise NotControllerError("no controller to ask")
        channels = InterBrokerChannels(self._config.security)
        with channels.channel(f"{controller.host}:{controller.port}") as channel:
            try:
                answer = pb_grpc.BrokerStub(channel).ControlledShutdown(
                    pb.ControlledShutdownRequest(broker_id=me),
                    timeout=max(deadline - time.monotonic(), 0.1),
                )
            except grpc.RpcError as exc:
                raise NotControllerError(f"asking broker {controller.broker_id}: {exc}") from None
        return int(answer.moved)

    def controlled_shutdown(self, broker_id: int) -> int:
        return self._controller_or_raise().controlled_shutdown(broker_id)

    def apply_dynamic_configs(self, applied: AppliedConfigs) -> None:
        """This broker's dynamic configs changed (``broker.core.configs.on_applied``): the
        fetchers' ``follower.replication.throttled.rate`` and the controller's election
        defaults follow at once."""
        if self.replicas is not None:
            self.replicas.set_follower_throttle(applied.follower_replication_throttled_rate)
        defaults = applied.topic_defaults
        self._controller.set_topic_defaults(
            defaults.min_insync_replicas, defaults.unclean_leader_election_enable
        )

    @property
    def metadata(self) -> ClusterMetadata:
        return self._watcher.snapshot

    @property
    def store(self) -> ClusterStore:
        """This broker's ZooKeeper session (the server builds the producer-id source on it)."""
        return self._store

    # --- topic administration (the core's TopicAdmin seam) --------------------------------

    def _controller_or_raise(self) -> Controller:
        reason = self._fence.reason
        if reason is not None:
            raise NotControllerError(
                f"broker {self._config.broker_id} cannot act as controller: {reason}; "
                "send topic administration to another broker"
            )
        if not self._controller.is_controller:
            controller_id = self._watcher.snapshot.controller_id
            raise NotControllerError(
                f"broker {self._config.broker_id} is not the controller; "
                f"send topic administration to broker {controller_id}"
            )
        return self._controller

    def _on_controller(self, call: str, arguments: Mapping[str, Any]) -> Any:
        """Run ``call`` on the controller: here if this broker is it, else forwarded
        (``broker.cluster.forwarding.Forwarder``)."""
        return self._forwarder.run(call, arguments)

    def run_forwarded(self, call: str, arguments: Mapping[str, Any]) -> Any:
        """The controller's half of a forwarded call (``Envelope``): run it here, or
        ``NotControllerError`` if this broker is not the controller (the sender retries
        on the next one). Does not wait for this broker's view: the sender waits for its
        own."""
        return run_call(self._controller_or_raise(), call, arguments)

    def _await(self, check: Callable[[ClusterMetadata], bool], what: str) -> None:
        if not self._watcher.wait_for(check, _VIEW_WAIT_MS):
            raise BrokerUnavailableError(f"{what}: this broker's view did not catch up in time")

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str],
        *,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """One topic through ``create_topics``: answered once it is led here."""
        manual = None if assignment is None else [(p, tuple(r)) for p, r in assignment.items()]
        spec = NewTopic(name, partitions, replication_factor, dict(config), manual)
        error = self.create_topics([spec], FORWARD_TIMEOUT_MS)[name]
        if error is not None:
            raise error

    def create_topics(
        self, specs: Sequence[NewTopic], timeout_ms: int
    ) -> dict[str, Exception | None]:
        """Many topics in one controller batch (``broker.cluster.topic_batches``)."""
        return self._batches.create_topics(specs, timeout_ms)

    def delete_topic(self, name: str) -> None:
        error = self.delete_topics([name], FORWARD_TIMEOUT_MS)[name]
        if error is not None:
            raise error

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> dict[str, Exception | None]:
        """Many topics in one controller batch (``broker.cluster.topic_batches``)."""
        return self._batches.delete_topics(names, timeout_ms)

    def create_partitions(
        self, name: str, total: int, *, assignment: Sequence[Sequence[int]] | None = None
    ) -> None:
        manual = None if assignment is None else [tuple(r) for r in assignment]
        error = self.create_partitions_many([Growth(name, total, manual)], FORWARD_TIMEOUT_MS)[name]
        if error is not None:
            raise error

    def create_partitions_many(
        self, growths: Sequence[Growth], timeout_ms: int
    ) -> dict[str, Exception | None]:
        """Many topics grown in one controller batch (``broker.cluster.topic_batches``)."""
        return self._batches.create_partitions(growths, timeout_ms)

    def alter_topic_config(self, name: str, config: Mapping[str, str]) -> None:
        self._on_controller("alter_topic_config", {"name": name, "config": dict(config)})
        self._await(
            lambda m: name in m.topics and dict(m.topics[name].config) == dict(config),
            f"configuring {name}",
        )

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        answer = self._on_controller(
            "elect_leaders", {"unclean": unclean, "partitions": encode_partitions(partitions)}
        )
        return decode_codes(answer)

    def alter_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[tuple[str, int], str]:
        answer = self._on_controller(
            "alter_partition_reassignments", {"targets": encode_targets(targets)}
        )
        return decode_codes(answer)

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> Reassignments:
        answer = self._on_controller(
            "list_partition_reassignments", {"partitions": encode_partitions(partitions)}
        )
        return decode_reassignments(answer)


def _start_replicas(
    config: BrokerConfig,
    store: ClusterStore,
    watcher: MetadataWatcher,
    local: LocalTopics,
    clock: Clock,
) -> ReplicaManager:
    """The replica manager and its fetchers over the core's partitions (not yet fed a
    view)."""

    def address_of(broker_id: int) -> str | None:
        found = watcher.snapshot.brokers.get(broker_id)
        return None if found is None else f"{found.host}:{found.port}"

    def write_isr(proposals: Sequence[IsrProposal]) -> dict[tuple[str, int], int]:
        def min_isr_of(topic: str, partition: int) -> int:
            return local.logs.get_log(topic, partition).config.min_insync_replicas

        return write_isr_batch(store, min_isr_of, proposals)

    def count_isr_change(shrunk: int, expanded: int) -> None:
        local.metrics.isr_shrinks.inc(shrunk)
        local.metrics.isr_expands.inc(expanded)

    fetchers = FetcherPool(
        config.broker_id,
        local.partitions,
        address_of,
        num_fetchers=config.num_replica_fetchers,
        wait_ms=config.replica_fetch_wait_max_ms,
        fetch_max_bytes=config.replica_fetch_max_bytes,
        backoff_ms=config.replica_fetch_backoff_ms,
        channels=InterBrokerChannels(config.security),
        throttle_rate_bytes=config.follower_replication_throttled_rate,
    )
    replicas = ReplicaManager(
        ReplicaSettings(
            config.broker_id,
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
            replica_fetch_max_bytes=config.replica_fetch_max_bytes,
            replica_fetch_backoff_ms=config.replica_fetch_backoff_ms,
            num_replica_fetchers=config.num_replica_fetchers,
        ),
        local.partitions,
        clock,
        write_isr,
        fetchers,
        on_leader=local.became_leader,
        on_isr_change=count_isr_change,
    )
    replicas.start()
    return replicas


def _kafka_endpoint(registration: BrokerRegistration) -> tuple[str, int] | None:
    """A registered broker's Kafka listener (``KAFKA_LISTENER``), None without one."""
    kafka = registration.endpoint(KAFKA_LISTENER)
    return None if kafka is None else (kafka.host, kafka.port)
