"""``broker.core.group_configs``, pure: the entries DescribeConfigs answers for a group,
and a forwarded legacy AlterConfigs' incremental form giving the same configs."""

from __future__ import annotations

import pytest

from tidelog.broker.core.config_keys import Source
from tidelog.broker.core.configs import AlterOp, ConfigChange
from tidelog.broker.core.group_configs import (
    altered_group_configs,
    as_incremental,
    describe_group_configs,
)
from tidelog.broker.share.groups_config import GROUP_CONFIG_NAMES, ShareGroupConfig
from tidelog.storage.errors import InvalidConfigError, InvalidRequestError

BROKER = ShareGroupConfig(delivery_count_limit=4)
CURRENT = {"share.delivery.count.limit": "3", "share.isolation.level": "read_committed"}


@pytest.mark.parametrize(
    "changes",
    [
        [ConfigChange("share.record.lock.duration.ms", AlterOp.SET, "20000")],
        [ConfigChange("share.delivery.count.limit", AlterOp.SET, "2")],
        [
            ConfigChange("share.delivery.count.limit", AlterOp.SET, None),  # reset
            ConfigChange("errors.deadletterqueue.topic.name", AlterOp.SET, "dead"),
        ],
        [],
    ],
)
def test_a_legacy_alter_and_its_incremental_form_agree(changes: list[ConfigChange]) -> None:
    replaced = altered_group_configs(CURRENT, changes, BROKER, incremental=False)
    incremental = altered_group_configs(CURRENT, as_incremental(changes), BROKER, incremental=True)
    assert replaced == incremental
    assert {c.name for c in as_incremental(changes)} >= GROUP_CONFIG_NAMES - {
        c.name for c in changes if c.value is not None
    }


def test_the_incremental_form_keeps_what_is_refused() -> None:
    for changes, error in (
        ([ConfigChange("retention.ms", AlterOp.SET, "1")], InvalidConfigError),
        (
            [
                ConfigChange("share.delivery.count.limit", AlterOp.SET, "2"),
                ConfigChange("share.delivery.count.limit", AlterOp.SET, "3"),
            ],
            InvalidRequestError,
        ),
    ):
        with pytest.raises(error):
            altered_group_configs(CURRENT, changes, BROKER, incremental=False)
        with pytest.raises(error):
            altered_group_configs(CURRENT, as_incremental(changes), BROKER, incremental=True)


def test_entries_name_their_source_and_the_broker_setting_behind() -> None:
    entries = {e.name: e for e in describe_group_configs(CURRENT, BROKER)}
    assert set(entries) == GROUP_CONFIG_NAMES
    limit = entries["share.delivery.count.limit"]
    assert (limit.value, limit.source) == ("3", Source.GROUP_CONFIG)
    assert [(s.name, s.value, s.source) for s in limit.synonyms] == [
        ("share.delivery.count.limit", "3", Source.GROUP_CONFIG),
        ("group.share.delivery.count.limit", "4", Source.DEFAULT_CONFIG),
    ]
    dlq = entries["errors.deadletterqueue.topic.name"]
    assert (dlq.value, dlq.source, dlq.synonyms) == ("", Source.DEFAULT_CONFIG, ())
    only = describe_group_configs(CURRENT, BROKER, ["share.isolation.level", "nope"])
    assert [(e.name, e.value) for e in only] == [("share.isolation.level", "read_committed")]
