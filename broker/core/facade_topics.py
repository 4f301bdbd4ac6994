"""The topic and config administration of ``BrokerCore`` (``broker.core.facade``): create,
validate, delete, list and describe topics, partitions and log dirs, elections and
reassignments, metadata and FindCoordinator, and the describe/alter config calls.

``TopicCalls`` is mixed into ``BrokerCore`` and is not used alone. Each method delegates
to one service the core built: ``Topics`` (``broker.core.topics``, which documents each
call) or ``Configs`` (``broker.core.configs``); the few that the service does not gate
themselves run inside the core's shutdown gate here. It is apart because topic
administration is a concept of its own next to the data path and the groups, and
because the facade's one-line delegations would otherwise hide the core's own logic.

Thread-safe, as ``BrokerCore`` is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tidelog.broker.core.config_keys import ConfigEntry
from tidelog.broker.core.configs import ConfigChange, Configs, ResourceKind
from tidelog.broker.core.gate import OperationGate
from tidelog.broker.core.placement import BrokerEndpoint, ClusterView
from tidelog.broker.core.share_ops import ShareOps
from tidelog.broker.core.topics import (
    LogDirView,
    MetadataTopic,
    PartitionCountResult,
    TopicRequest,
    Topics,
    TopicView,
)
from tidelog.storage.errors import InvalidRequestError
from tidelog.storage.log_manager import TopicMetadata

__all__ = ["TopicCalls"]


class TopicCalls:
    """``BrokerCore``'s topic and config calls. Thread-safe; needs the attributes below,
    which ``BrokerCore.__init__`` assigns."""

    topics: Topics
    configs: Configs
    shares: ShareOps | None
    _gate: OperationGate

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        config: Mapping[str, str],
        *,
        replication_factor: int | None = None,
        assignment: Sequence[tuple[int, Sequence[int]]] | None = None,
    ) -> TopicView:
        """``Topics.create_topic``."""
        return self.topics.create_topic(
            name, partitions, config, replication_factor=replication_factor, assignment=assignment
        )

    def create_topics(
        self, requests: Sequence[TopicRequest], timeout_ms: int
    ) -> dict[str, TopicView | Exception | None]:
        """``Topics.create_topics``: CreateTopics of many topics, one batch."""
        return self.topics.create_topics(requests, timeout_ms)

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> dict[str, Exception | None]:
        """``Topics.delete_topics``: DeleteTopics of many topics, one batch."""
        return self.topics.delete_topics(names, timeout_ms)

    def validate_new_topic(
        self,
        name: str,
        partitions: int | None,
        config: Mapping[str, str],
        *,
        replication_factor: int | None = None,
        assignment: Sequence[tuple[int, Sequence[int]]] | None = None,
    ) -> tuple[int, int]:
        """``Topics.validate_new_topic``."""
        return self.topics.validate_new_topic(
            name, partitions, config, replication_factor=replication_factor, assignment=assignment
        )

    def elect_preferred_leaders(self) -> int:
        """``Topics.elect_preferred_leaders``."""
        return self.topics.elect_preferred_leaders()

    def elect_leaders(
        self, unclean: bool, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], str]:
        """``Topics.elect_leaders``."""
        return self.topics.elect_leaders(unclean, partitions)

    def alter_partition_reassignments(
        self, targets: Mapping[tuple[str, int], Sequence[int] | None]
    ) -> dict[tuple[str, int], str]:
        """``Topics.alter_partition_reassignments``."""
        return self.topics.alter_partition_reassignments(targets)

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """``Topics.list_partition_reassignments``."""
        return self.topics.list_partition_reassignments(partitions)

    def controlled_shutdown(self, broker_id: int) -> int:
        """``Topics.controlled_shutdown``."""
        return self.topics.controlled_shutdown(broker_id)

    def run_forwarded(self, call: str, arguments: Mapping[str, Any]) -> Any:
        """``Topics.run_forwarded``: a topic admin call forwarded to this controller."""
        with self._gate.operation():
            return self.topics.run_forwarded(call, arguments)

    def apply_cluster_topics(self, topics: Mapping[str, tuple[int, Mapping[str, str]]]) -> None:
        """``Topics.apply_cluster_topics``."""
        self.topics.apply_cluster_topics(topics)

    def delete_topic(self, name: str) -> None:
        """``Topics.delete_topic``."""
        self.topics.delete_topic(name)

    def list_topics(self, include_internal: bool) -> list[TopicMetadata]:
        """``Topics.list_topics``."""
        return self.topics.list_topics(include_internal)

    def describe_topic(self, name: str) -> TopicView:
        """``Topics.describe_topic``."""
        return self.topics.describe_topic(name)

    def describe_log_dirs(self, partitions: Sequence[tuple[str, int]] | None) -> LogDirView:
        """``Topics.describe_log_dirs``."""
        return self.topics.describe_log_dirs(partitions)

    def metadata(
        self, topics: Sequence[str], include_internal: bool
    ) -> tuple[ClusterView, list[MetadataTopic]]:
        """``Topics.metadata``."""
        return self.topics.metadata(topics, include_internal)

    def find_coordinator(self, key: str, *, transaction: bool = False) -> BrokerEndpoint:
        """``Topics.find_coordinator``."""
        return self.topics.find_coordinator(key, transaction=transaction)

    def describe_configs(
        self,
        kind: ResourceKind,
        name: str,
        keys: Sequence[str] | None = None,
        *,
        forwarded: bool = False,
    ) -> list[ConfigEntry]:
        """``Configs.describe``; a GROUP resource ``ShareOps.describe_group_configs``
        (``forwarded``: another broker forwarded it, so it is not forwarded again)."""
        if kind == ResourceKind.GROUP:
            return self._group_configs().describe_group_configs(name, keys, forward=not forwarded)
        with self._gate.operation():
            return self.configs.describe(kind, name, keys)

    def alter_configs(
        self,
        kind: ResourceKind,
        name: str,
        changes: Sequence[ConfigChange],
        *,
        incremental: bool,
        validate_only: bool = False,
        forwarded: bool = False,
    ) -> None:
        """``Configs.alter``; a GROUP resource ``ShareOps.alter_group_configs`` (as
        ``describe_configs``)."""
        if kind == ResourceKind.GROUP:
            self._group_configs().alter_group_configs(
                name,
                changes,
                incremental=incremental,
                validate_only=validate_only,
                forward=not forwarded,
            )
            return
        self.configs.alter(
            kind, name, changes, incremental=incremental, validate_only=validate_only
        )

    def _group_configs(self) -> ShareOps:
        if self.shares is None:
            raise InvalidRequestError("this broker serves no share groups: no group configs")
        return self.shares

    def alter_topic_config(
        self, name: str, set_keys: Mapping[str, str], delete_keys: Iterable[str]
    ) -> TopicView:
        """``Topics.alter_topic_config``."""
        return self.topics.alter_topic_config(name, set_keys, delete_keys)

    def create_partitions(
        self,
        counts: Sequence[tuple[str, int]],
        *,
        validate_only: bool = False,
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        timeout_ms: int = 30_000,
    ) -> list[PartitionCountResult]:
        """``Topics.create_partitions``."""
        return self.topics.create_partitions(
            counts, validate_only=validate_only, assignments=assignments, timeout_ms=timeout_ms
        )
