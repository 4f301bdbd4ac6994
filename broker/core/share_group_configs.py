"""``ShareOps``' group-config calls (a GROUP config resource, Kafka 4.x type 32;
``broker.core.group_configs`` has the decisions): DescribeConfigs and
IncrementalAlterConfigs / AlterConfigs at the group's coordinator, where the configs are
kept with the group's records, forwarded there from any other broker; and the settings a
share partition's leader loads its share partitions with, read at the coordinator
wherever it is.

**Changes apply live** (issue #32's loose end), as Kafka's: its share partitions read the
group's configs anew on every use (``ShareGroupConfigProvider`` over each broker's
``GroupConfigManager``, which the metadata log keeps current). Here the share partitions
already loaded take a change as ``SharePartitionManager.reconfigure`` says (the lock
duration and delivery limit of what is acquired after it, the dead-letter topic, the
isolation level; ``share.auto.offset.reset`` only for share partitions not yet started;
the session timeout and heartbeat interval at the coordinator's next heartbeat). How
the leaders learn of it:

* on the coordinator, at once: the alter reconfigures this broker's share partitions of
  the group once its configs are stored (a single node: every one);
* on every other broker, by re-reading: the share timer asks the coordinator for the
  configs of each group with share partitions loaded here at most every
  ``GROUP_CONFIG_REFRESH_MS`` (2 s; one DescribeConfigs per group and broker). Kafka
  spreads configs through its metadata log; Tidelog's group configs live with the
  group in ``__consumer_offsets`` (``broker.share.groups_config``), and a pull needs
  no new inter-broker call and heals itself (a broker that was down or missed a
  change catches up at its next pass; a coordinator that moved is found again). A
  change reaches another broker's share partitions within about that interval; a
  failed read keeps the settings they have and is retried at the next pass.

Thread-safe, as ``ShareOps``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tidelog.broker.cluster.share_peers import GrpcSharePeers
from tidelog.broker.config import BrokerConfig
from tidelog.broker.core.config_keys import ConfigEntry
from tidelog.broker.core.configs import ConfigChange
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.group_configs import (
    altered_group_configs,
    as_incremental,
    describe_group_configs,
)
from tidelog.broker.groups.manager import GroupManager
from tidelog.broker.groups.offset_store import OFFSETS_TOPIC
from tidelog.broker.share.groups import ShareGroupManager
from tidelog.broker.share.groups_config import ShareGroupSettings, resolve_settings
from tidelog.broker.share.partition_manager import SharePartitionManager
from tidelog.storage.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    NotCoordinatorError,
)

__all__ = ["GROUP_CONFIG_REFRESH_MS", "ShareGroupConfigCalls"]

log = logging.getLogger(__name__)

# How often a share partition leader re-reads the configs of a group it serves from the
# group's coordinator (module docstring).
GROUP_CONFIG_REFRESH_MS = 2_000


class ShareGroupConfigCalls:
    """``ShareOps``' group-config operations (module docstring). Needs the attributes
    below, which ``ShareOps.__init__`` assigns."""

    share_groups: ShareGroupManager
    _config: BrokerConfig
    _gate: OperationGate
    _groups: GroupManager
    _peers: GrpcSharePeers | None
    _roles_lock: threading.Lock
    _offsets_loaded: set[int]
    _config_refreshed: dict[str, int]  # group -> when its configs were last read (ms)
    partitions: SharePartitionManager

    if TYPE_CHECKING:
        # ShareOps', used here.
        def _check_coordinator(self, group_id: str) -> None: ...

        def _leader_of(self, topic: str, partition: int) -> int: ...

    def describe_group_configs(
        self, group_id: str, keys: Sequence[str] | None = None, *, forward: bool = True
    ) -> list[ConfigEntry]:
        """DescribeConfigs of a GROUP resource, at the group's coordinator: here, or
        (``forward``, in a cluster) forwarded there; ``NotCoordinatorError`` /
        ``CoordinatorLoadInProgressError`` otherwise."""
        with self._gate.operation():
            elsewhere = self._group_configs_at(group_id, forward)
            if elsewhere is not None:
                assert self._peers is not None
                return self._peers.describe_group_configs(elsewhere, group_id, keys)
            configs = self.share_groups.group_configs(group_id)
            return describe_group_configs(configs, self.share_groups.config, keys)

    def alter_group_configs(
        self,
        group_id: str,
        changes: Sequence[ConfigChange],
        *,
        incremental: bool,
        validate_only: bool = False,
        forward: bool = True,
    ) -> None:
        """IncrementalAlterConfigs / AlterConfigs of a GROUP resource, at the group's
        coordinator: validated whole, then stored durably (``validate_only``: not
        stored). Raises ``InvalidConfigError``, ``InvalidRequestError``, and as
        ``describe_group_configs`` (a forwarded AlterConfigs goes as the incremental
        changes that replace every group key, ``as_incremental``)."""
        with self._gate.operation():
            elsewhere = self._group_configs_at(group_id, forward)
            if elsewhere is not None:
                assert self._peers is not None
                self._peers.alter_group_configs(
                    elsewhere,
                    group_id,
                    changes if incremental else as_incremental(changes),
                    validate_only=validate_only,
                )
                return
            current = self.share_groups.group_configs(group_id)
            configs = altered_group_configs(
                current, changes, self.share_groups.config, incremental=incremental
            )
            if validate_only or configs == current:
                return
            self.share_groups.alter_group_configs(
                group_id, {name: configs.get(name) for name in {*current, *configs}}
            )
            # Live here at once; the other brokers' share partitions at their next
            # refresh (module docstring).
            settings = self.share_groups.settings(group_id)
            self.partitions.reconfigure(group_id, self._config.share.partition_config(settings))

    def refresh_group_configs(self, now_ms: int) -> None:
        """The share timer's: re-read the configs of each group with share partitions
        loaded here, at most every ``GROUP_CONFIG_REFRESH_MS`` per group, and apply any
        change to them (``SharePartitionManager.reconfigure``). Never raises: a group
        whose configs cannot be read now keeps its settings and is retried next pass."""
        now = now_ms
        groups = {group for group, _, _ in self.partitions.loaded()}
        for group in list(self._config_refreshed):
            if group not in groups:
                del self._config_refreshed[group]
        for group in sorted(groups):
            if now - self._config_refreshed.get(group, now - GROUP_CONFIG_REFRESH_MS) < (
                GROUP_CONFIG_REFRESH_MS
            ):
                continue
            self._config_refreshed[group] = now
            try:
                settings = self._group_settings(group)
            except Exception as exc:  # not reachable, loading, stopping: next pass
                log.debug("share group %s: re-reading its configs failed: %s", group, exc)
                continue
            self.partitions.reconfigure(group, self._config.share.partition_config(settings))

    def _group_configs_at(self, group_id: str, forward: bool) -> int | None:
        """Where a GROUP resource's call is served: None here (this broker coordinates
        the group), else the coordinator to forward it to (``forward``, in a cluster, one
        known); raises as ``_check_coordinator`` otherwise."""
        try:
            self._check_coordinator(group_id)
            return None
        except NotCoordinatorError:
            if not forward or self._peers is None:
                raise
            coordinator = self._leader_of(OFFSETS_TOPIC, self._groups.store.partition_for(group_id))
            if coordinator < 0 or coordinator == self._config.broker_id:
                raise
            return coordinator

    def _group_settings(self, group_id: str) -> ShareGroupSettings:
        """A share partition's leader loading one: its group's settings, from the
        configs at the group's coordinator (here, or asked there: ``share_peers``).
        Raises ``CoordinatorNotAvailableError`` / ``CoordinatorLoadInProgressError``
        (the load fails, retriable) rather than load with configs it could not read."""
        if self._peers is None:
            return self.share_groups.settings(group_id)
        partition = self._groups.store.partition_for(group_id)
        coordinator = self._leader_of(OFFSETS_TOPIC, partition)
        if coordinator == self._config.broker_id:
            with self._roles_lock:
                if partition not in self._offsets_loaded:
                    raise CoordinatorLoadInProgressError(
                        f"group {group_id!r}: its configs are still loading"
                    )
            return self.share_groups.settings(group_id)
        if coordinator < 0:
            raise CoordinatorNotAvailableError(f"group {group_id!r} has no coordinator")
        configs = self._peers.group_configs(coordinator, group_id)
        return resolve_settings(configs, self.share_groups.config)
