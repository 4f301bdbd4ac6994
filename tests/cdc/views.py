"""Helpers of the derived-view tests (examples/cdc): the connector on a thread, the
examples' modules imported from ``examples/cdc``."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.broker.cluster.waiting import eventually
from tidelog.client.cdc import ConnectorConfig, PostgresConnector

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "cdc"
MODULES = ("_common", "shop", "orders_view", "search_index", "event_sourcing")


@contextmanager
def examples(*names: str) -> Iterator[dict[str, Any]]:
    """The example modules ``names``, imported from ``examples/cdc`` (forgotten after)."""
    import importlib

    sys.path.insert(0, str(EXAMPLES))
    try:
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in MODULES:
            sys.modules.pop(name, None)


@contextmanager
def running_connector(config: ConnectorConfig) -> Iterator[PostgresConnector]:
    """``PostgresConnector(config).run()`` on a thread, streaming when this yields; stopped
    gracefully and joined at the end; an error it raised is raised here."""
    connector = PostgresConnector(config)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            connector.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="cdc-connector", daemon=True)
    thread.start()
    try:
        eventually(lambda: connector.streaming.is_set() or bool(errors), 60)
        assert not errors, errors
        yield connector
    finally:
        connector.stop()
        thread.join(60)
        assert not thread.is_alive(), "the connector did not stop"
    assert not errors, errors
