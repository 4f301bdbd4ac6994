"""The share-group coordinator in the broker (issue #32, step 2): membership, assignment,
persistence, group configs and views behind one thread-safe facade, plus its expiry timer.

``ShareGroupManager`` owns the pure ``ShareCoordinator`` (``broker.share.groups_coordinator``:
heartbeats, epochs, fencing, expiry; the assignor is ``broker.share.assignor``) and writes
the group's records (``broker.share.groups_records``) to ``__consumer_offsets`` through the
offset store the consumer groups use (``OffsetStore.write_records``), so share groups live
in the same partition a consumer group of that id would, move with the same coordinator and
compact the same way. It serves no wire API yet: the later step routes ShareGroupHeartbeat
(76), ShareGroupDescribe (77), ListGroups and the GROUP configs of IncrementalAlterConfigs /
DescribeConfigs here.

Ordering and durability: a call that changes a group holds the manager's lock from the
change through the durable write of its records (appended, fsynced, replicated: the offset
store's rules) and answers only after it, so what a client was told is on disk, and what a
restart or a new coordinator reloads is what clients were last told. Most heartbeats change
nothing and write nothing; a join, a leave, an expiry, a subscription change or a member
catching up with a new assignment writes its few records. A failed write rebuilds the group
from its durable records (the change is undone) and raises; the client retries.

One id, one kind (Kafka's rule): a share group cannot be created under the id of a consumer
group (``is_consumer_group``: KIP-848 members, a classic group, committed offsets),
``GroupIdNotFoundError`` "Group X is not a share group."; and the consumer-group
side refuses a share group's id (``OffsetStore.is_share_group``: ``GROUP_ID_NOT_FOUND`` for
ConsumerGroupHeartbeat, ``INCONSISTENT_GROUP_PROTOCOL`` for JoinGroup, hooks in
``broker.groups.manager`` and ``broker.groups.classic``). Both checks read state, and
the two kinds have separate locks, so two first joins of the two kinds racing for one new id
could both win; Kafka serialises them through its one coordinator thread per partition.
Closing that gap needs a lock per offsets partition shared by both kinds (the wiring step).

Restarts: ``open`` rebuilds every share group from the records the offset store loaded
(single node). In cluster mode a broker becoming leader of an offsets partition reloads it
(``GroupManager.reload_partition``) and then calls ``load_partition``; one that stops
leading calls ``unload_partition`` (both wired by the later step, beside the consumer
groups' own).

Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tidelog.broker.groups.manager import GroupManager
from tidelog.broker.groups.manager_types import GroupListing
from tidelog.broker.groups.offset_records import MAX_STRING_BYTES
from tidelog.broker.groups.offset_store import OffsetStore
from tidelog.broker.share.groups_config import (
    ShareGroupConfig,
    ShareGroupSettings,
    resolve_settings,
    validate_group_configs,
)
from tidelog.broker.share.groups_coordinator import (
    Changes,
    ShareCoordinator,
    ShareGroupState,
    ShareGroupView,
    ShareHeartbeatAnswer,
    ShareHeartbeatRequest,
    ShareRemoval,
)
from tidelog.broker.share.groups_records import (
    CONFIG_TYPE,
    RecordKey,
    decode_configs,
    encode_configs,
    encode_key,
)
from tidelog.storage.clock import Clock
from tidelog.storage.errors import GroupIdNotFoundError, GroupNotEmptyError, InvalidRequestError
from tidelog.storage.log_manager import LogManager

__all__ = [
    "ShareGroupManager",
    "TypedGroupListing",
    "is_consumer_group",
    "list_all_groups",
]

log = logging.getLogger(__name__)

_MAX_EXPIRY_WAIT_MS = 1_000
_MIN_EXPIRY_WAIT_MS = 10


@dataclass(frozen=True, slots=True)
class TypedGroupListing:
    """A group as ListGroups v5 shows it, with its type (``classic``, ``consumer``,
    ``share``)."""

    group_id: str
    group_type: str
    state: str
    members: int


class ShareGroupManager:
    """Every share group this broker coordinates. Thread-safe.

    Build with ``open``; ``start`` the expiry timer; ``close`` once.
    """

    def __init__(
        self,
        config: ShareGroupConfig,
        coordinator: ShareCoordinator,
        store: OffsetStore,
        logs: LogManager,
        clock: Clock,
        configs: dict[str, dict[str, str]],
    ) -> None:
        self.config = config
        self._coordinator = coordinator
        self._store = store
        self._logs = logs
        self._clock = clock
        # Group id -> its group configs (record type 1000); under _lock.
        self._configs = configs
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def open(
        cls,
        logs: LogManager,
        clock: Clock,
        groups: GroupManager,
        config: ShareGroupConfig | None = None,
    ) -> ShareGroupManager:
        """Rebuild the share groups (and group configs) from the records the consumer
        groups' offset store (``groups.store``) loaded; ``groups`` also tells which ids
        are consumer groups' (``is_consumer_group``)."""
        config = config or ShareGroupConfig()
        coordinator = ShareCoordinator(config.max_size, lambda g: is_consumer_group(groups, g))
        store = groups.store
        manager = cls(config, coordinator, store, logs, clock, {})
        loaded = manager._load(store.groups_with_records())
        if loaded:
            log.info("loaded %d share group(s)", loaded)
        return manager

    def _load(self, groups: Mapping[str, Mapping[bytes, bytes]]) -> int:
        """Rebuild ``groups`` (group id -> its records) from their records; returns how
        many share groups there were."""
        now_ms = self._clock.monotonic_ms()
        loaded = 0
        with self._lock:
            for group_id, records in groups.items():
                self._configs.pop(group_id, None)
                config = records.get(encode_key(RecordKey(CONFIG_TYPE, group_id)))
                if config is not None:
                    try:
                        self._configs[group_id] = decode_configs(config)
                    except ValueError as exc:
                        log.warning("group %s: its configs do not decode: %s", group_id, exc)
                session_ms = self._settings_locked(group_id).session_timeout_ms
                loaded += self._coordinator.load(group_id, records, now_ms, session_ms)
        return loaded

    # --- cluster mode -------------------------------------------------------------------

    def load_partition(self, partition: int) -> int:
        """Rebuild the share groups of offsets partition ``partition`` from what the offset
        store reloaded (after ``GroupManager.reload_partition``); returns how many."""
        self.unload_partition(partition)
        return self._load(self._store.groups_with_records(partition))

    def unload_partition(self, partition: int) -> list[str]:
        """Forget the share groups (and configs) of offsets partition ``partition``: this
        broker no longer coordinates them. Returns their ids."""

        def owns(group_id: str) -> bool:
            return self._store.partition_for(group_id) == partition

        with self._lock:
            for group_id in [g for g in self._configs if owns(g)]:
                del self._configs[group_id]
            return self._coordinator.forget(owns)

    # --- the expiry timer -----------------------------------------------------------------

    def start(self) -> None:
        """Start the session-expiry timer (a daemon thread)."""
        if self._thread is not None:
            raise RuntimeError("share group expiry already started")
        self._thread = threading.Thread(target=self._run, name="share-group-expiry", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the timer. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.expire()
            except Exception:  # a failed write: the next pass retries the expiry
                log.exception("share group expiry failed")
            with self._lock:
                deadline = self._coordinator.next_deadline_ms()
            wait_ms = _MAX_EXPIRY_WAIT_MS
            if deadline is not None:
                wait_ms = min(
                    max(deadline - self._clock.monotonic_ms(), _MIN_EXPIRY_WAIT_MS), wait_ms
                )
            self._stop.wait(wait_ms / 1000.0)

    def expire(self) -> list[ShareRemoval]:
        """Remove every member whose session ended (one pass, a group at a time, each
        group's records written before the next is touched); returns who. A group whose
        write fails keeps its members (``_write_locked``) and the pass goes on; the first
        failure is raised at the end."""
        topics = self._topic_counts()
        removed: list[ShareRemoval] = []
        failure: Exception | None = None
        with self._lock:
            now_ms = self._clock.monotonic_ms()
            for group_id in self._coordinator.group_ids():
                gone, changes = self._coordinator.expire(now_ms, topics, group_id)
                try:
                    self._write_locked(group_id, changes.get(group_id, {}))
                except Exception as exc:  # StorageError, NotLeaderOrFollowerError...
                    failure = failure or exc
                    continue
                removed.extend(gone)
        if failure is not None:
            raise failure
        return removed

    # --- membership -----------------------------------------------------------------------

    def heartbeat(self, request: ShareHeartbeatRequest) -> ShareHeartbeatAnswer:
        """ShareGroupHeartbeat: join, heartbeat or leave (the errors are
        ``ShareCoordinator.heartbeat``'s, and ``StorageError`` or
        ``NotLeaderOrFollowerError`` when the records could not be stored). The group's
        overdue members are expired first."""
        _check_group_id(request.group_id)
        topics = self._topic_counts()
        with self._lock:
            now_ms = self._clock.monotonic_ms()
            settings = self._settings_locked(request.group_id)
            _, expired = self._coordinator.expire(now_ms, topics, request.group_id)
            for group_id, records in expired.items():
                self._write_locked(group_id, records)
            answer, changes = self._coordinator.heartbeat(
                request,
                now_ms,
                topics,
                session_timeout_ms=settings.session_timeout_ms,
                heartbeat_interval_ms=settings.heartbeat_interval_ms,
            )
            self._write_locked(request.group_id, changes)
            return answer

    def _write_locked(self, group_id: str, changes: Changes) -> None:
        """Store a group's changed records; on failure rebuild the group from its
        durable records (the change undone; its members' sessions start again, as after
        any load) and raise."""
        if not changes:
            return
        try:
            self._store.write_records(group_id, changes)
        except Exception:
            session_ms = self._settings_locked(group_id).session_timeout_ms
            self._coordinator.load(
                group_id,
                self._store.records_of(group_id),
                self._clock.monotonic_ms(),
                session_ms,
            )
            raise

    def _topic_counts(self) -> dict[str, int]:
        return {t.name: t.partitions for t in self._logs.topics()}

    # --- views ----------------------------------------------------------------------------

    def describe_group(self, group_id: str) -> ShareGroupView:
        """ShareGroupDescribe's view of a group: state, epochs, members with their
        subscriptions, assignments and targets. Raises ``GroupIdNotFoundError`` for an id
        that is no share group here ("Group X is not a share group." is the caller's to
        say for a consumer group's id, as it knows)."""
        _check_group_id(group_id)
        with self._lock:
            return self._coordinator.view(group_id)

    def is_share_group(self, group_id: str) -> bool:
        """Whether a share group of that id exists here."""
        with self._lock:
            return self._coordinator.has_group(group_id)

    def list_groups(self) -> list[GroupListing]:
        """Every share group here, sorted by id, in the consumer groups' listing shape."""
        with self._lock:
            views = [self._coordinator.view(g) for g in self._coordinator.group_ids()]
        return [GroupListing(v.group_id, v.state.value, len(v.members)) for v in views]

    # --- admin ----------------------------------------------------------------------------

    def delete_group(self, group_id: str) -> ShareGroupView:
        """Delete an empty share group: tombstones for its records and its configs, durable
        before this returns. Returns its last view, state Dead.

        Raises:
            GroupIdNotFoundError: no share group of that id.
            GroupNotEmptyError: it has members.
            StorageError: the write failed (nothing was deleted).
        """
        _check_group_id(group_id)
        with self._lock:
            view = self._coordinator.view(group_id)
            if view.members:
                raise GroupNotEmptyError(
                    f"share group {group_id} has {len(view.members)} member(s); stop them first"
                )
            changes = self._coordinator.delete(group_id)
            if group_id in self._configs:
                changes[encode_key(RecordKey(CONFIG_TYPE, group_id))] = None
            self._write_locked(group_id, changes)
            self._configs.pop(group_id, None)
        log.info("share group %s deleted", group_id)
        return ShareGroupView(
            group_id, ShareGroupState.DEAD, view.group_epoch, view.assignment_epoch, ()
        )

    def group_configs(self, group_id: str) -> dict[str, str]:
        """The configs set on ``group_id`` (DescribeConfigs' non-default entries)."""
        _check_group_id(group_id)
        with self._lock:
            return dict(self._configs.get(group_id, {}))

    def settings(self, group_id: str) -> ShareGroupSettings:
        """The group's effective settings: its configs over the broker's defaults."""
        _check_group_id(group_id)
        with self._lock:
            return self._settings_locked(group_id)

    def _settings_locked(self, group_id: str) -> ShareGroupSettings:
        return resolve_settings(self._configs.get(group_id, {}), self.config)

    def alter_group_configs(self, group_id: str, changes: Mapping[str, str | None]) -> None:
        """IncrementalAlterConfigs on a GROUP resource: set each config to its value, or
        (None) delete it; durable before this returns. The result is validated as a
        whole first (``validate_group_configs``), so nothing changes on an error.

        Raises:
            InvalidConfigError: an unknown name or a bad value.
            StorageError: the write failed (nothing changed).
        """
        _check_group_id(group_id)
        with self._lock:
            configs = dict(self._configs.get(group_id, {}))
            for name, value in changes.items():
                if value is None:
                    configs.pop(name, None)
                else:
                    configs[name] = value
            validate_group_configs(configs, self.config)
            if configs == self._configs.get(group_id, {}):
                return
            key = encode_key(RecordKey(CONFIG_TYPE, group_id))
            self._store.write_records(group_id, {key: encode_configs(configs) if configs else None})
            if configs:
                self._configs[group_id] = configs
            else:
                self._configs.pop(group_id, None)
        log.info("group %s: configs now %s", group_id, configs)


def is_consumer_group(groups: GroupManager, group_id: str) -> bool:
    """Whether ``group_id`` is a consumer group's here, which a share group may not take:
    it has KIP-848 members, a classic group (live, or its stored metadata) or committed
    offsets (an Empty consumer group, as Kafka keeps one while it has offsets)."""
    try:
        groups.describe_consumer_group(group_id)
        return True
    except GroupIdNotFoundError:
        pass
    store = groups.store
    return (
        groups.classic.subscriptions(group_id) is not None
        or bool(store.offsets(group_id))
        or group_id in store.group_metadata(store.partition_for(group_id))
    )


def list_all_groups(groups: GroupManager, shares: ShareGroupManager) -> list[TypedGroupListing]:
    """Every group this broker coordinates, of every kind, sorted by id (ListGroups v5:
    the consumer groups' listing with a classic or consumer type, and the share groups)."""
    classic = {g.group_id for g in groups.classic.snapshot()}
    out = [
        TypedGroupListing(
            g.group_id, "classic" if g.group_id in classic else "consumer", g.state, g.members
        )
        for g in groups.list_groups()
    ]
    out.extend(
        TypedGroupListing(g.group_id, "share", g.state, g.members) for g in shares.list_groups()
    )
    return sorted(out, key=lambda g: g.group_id)


def _check_group_id(group_id: str) -> None:
    if not group_id:
        raise InvalidRequestError("group_id must not be empty")
    if len(group_id.encode("utf-8")) > MAX_STRING_BYTES:
        raise InvalidRequestError(f"group_id longer than {MAX_STRING_BYTES} bytes")
