"""Per-partition log lines of one batch, summed up when many.

A failover at 10,000 partitions changes thousands of roles, states and fetches at once:
one INFO line per partition and kind (20,000-30,000 a broker) cost the brokers CPU they
needed then and buried the rest of their logs. ``SummedLog`` collects one batch's lines
by kind and logs each kind's lines one by one when there are at most ``limit`` of them;
else one INFO line with the count and the first three, and each line at DEBUG (issue #34).
The replica manager (roles, ISR changes), the controller (states written) and the replica
fetchers (partitions a leader refused) use it.
"""

from __future__ import annotations

import logging

__all__ = ["SummedLog"]


class SummedLog:
    """One batch's lines, by kind; ``flush`` logs them. Not thread-safe: one batch."""

    def __init__(self, logger: logging.Logger, limit: int = 10) -> None:
        self._log = logger
        self._limit = limit
        self._lines: dict[str, list[str]] = {}

    def add(self, kind: str, line: str) -> None:
        self._lines.setdefault(kind, []).append(line)

    def flush(self) -> None:
        for kind, lines in self._lines.items():
            if len(lines) <= self._limit:
                for line in lines:
                    self._log.info("%s", line)
                continue
            for line in lines:
                self._log.debug("%s", line)
            self._log.info("%s: %d partition(s): %s; ...", kind, len(lines), "; ".join(lines[:3]))
        self._lines.clear()
