"""The CDC tests' shared load and checks: the mixed workload on a thread (``Writer``),
"the compacted topic equals ``SELECT *``" (``compacted_matches``) and "the read_committed
change stream holds each change exactly once, in commit order per key"
(``check_exactly_once``). Used by the kill, outage and cluster-outage tests, so every
fault is judged by the same rules."""

from __future__ import annotations

import json
import threading
import time

from tests.cdc.test_connector import Workload
from tests.cdc.topics import database_rows, latest_rows, read_topic
from tidelog.client.cdc.events import parse_lsn
from tidelog.client.types import ConsumerRecord

__all__ = ["Writer", "check_exactly_once", "compacted_differences", "compacted_matches"]


class Writer:
    """The workload on a thread, one small transaction after another, until ``stop``."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-writer", daemon=True)
        self.errors: list[BaseException] = []

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.workload.run(5)
                time.sleep(0.01)
        except BaseException as exc:
            self.errors.append(exc)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the writer did not stop"
        assert not self.errors, self.errors


def compacted_differences(bootstrap: str, topic: str, dsn: str, table: str = "t") -> list[str]:
    """The keys whose latest value in ``topic`` (read read_committed) differs from
    ``SELECT * FROM table``, sorted; empty when the compacted view equals the table."""
    got = latest_rows(read_topic(bootstrap, topic, "read_committed"))
    want = database_rows(dsn, table)
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


def compacted_matches(bootstrap: str, topic: str, dsn: str, table: str = "t") -> bool:
    """The compacted view of ``topic`` equals ``SELECT * FROM table`` row for row."""
    return not compacted_differences(bootstrap, topic, dsn, table)


def check_exactly_once(records: list[ConsumerRecord], workload: Workload, initial: range) -> None:
    """Each key's events (a tombstone as ("-", None)) are exactly its snapshot row then
    its committed changes in commit order: no duplicate, no gap, no reordering; and the
    source LSNs never go back (one partition: offset order is commit order)."""
    got: dict[int, list[tuple[str, int | None]]] = {}
    lsn = 0
    for record in records:
        assert record.key is not None
        key = json.loads(record.key)["id"]
        if record.value is None:
            got.setdefault(key, []).append(("-", None))
            continue
        event = json.loads(record.value)
        row = event["after"]
        got.setdefault(key, []).append((event["op"], None if row is None else row["v"]))
        assert parse_lsn(event["source"]["lsn"]) >= lsn, "commit order broken"
        lsn = parse_lsn(event["source"]["lsn"])
    want: dict[int, list[tuple[str, int | None]]] = {i: [("r", i)] for i in initial}
    for key, changes in workload.history.items():
        for op, v in changes:
            want.setdefault(key, []).append((op, v))
            if op == "d":
                want[key].append(("-", None))
    wrong = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    assert not wrong, [(k, got.get(k), want.get(k)) for k in wrong[:3]]
