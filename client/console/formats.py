"""The console's text: the Jinja2 environment and its filters, the form fields' parsers,
and the small summaries pages and charts show.

Pure functions of values, no request or client call: sizes in binary units
(``human_bytes``), times in UTC with milliseconds (``format_ms``), config durations in the
largest whole unit (``duration``; a negative one is "forever"), and "\u2013" for what is
unknown. The parsers raise ``ValueError`` with a message fit for the flash line: a
browser's ``datetime-local`` without a zone is UTC (``parse_datetime_ms``), numbers are
whole and bounded (``int_or_none``), configs are ``key=value`` lines (``pairs``). The
templates are autoescaped and undefined names fail (``StrictUndefined``).

Thread-safe: nothing here holds state; the environment ``templates()`` builds is Jinja2's,
safe to render from several threads.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from tidelog.client.types import TopicDescription
from tidelog.storage.errors import (
    TidelogError,
)

from .history import Series
from .view import describe_error

__all__ = [
    "duration",
    "format_ms",
    "human_bytes",
    "int_or_none",
    "last",
    "pairs",
    "parse_datetime_ms",
    "say",
    "series_json",
    "templates",
    "under_replicated",
]

_PACKAGE = Path(__file__).resolve().parent


def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_PACKAGE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = human_bytes
    env.filters["ms"] = format_ms
    env.filters["rate"] = lambda v: "\u2013" if v is None else f"{v:,.1f}/s"
    env.filters["duration"] = duration
    env.filters["urlpart"] = lambda v: quote(str(v), safe="")
    return env


def human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"  # pragma: no cover - the loop returns at GiB


def format_ms(value: int | None) -> str:
    if value is None or value < 0:
        return "\u2013"
    moment = datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{value % 1000:03d}Z"


def duration(text: str) -> str:
    if not text.lstrip("-").isdigit():
        return text or "\u2013"
    ms = int(text)
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def parse_datetime_ms(text: str) -> int:
    """An ISO date-time (a browser's ``datetime-local``: no zone means UTC) or ms."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def int_or_none(text: str | None, what: str, *, minimum: int = 0) -> int | None:
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what} must be a whole number") from None
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}")
    return value


def pairs(text: str) -> dict[str, str]:
    """``key=value`` lines (blank lines ignored). Raises ``ValueError``."""
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {line.strip()!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def series_json(series: Series) -> dict[str, Any]:
    return {
        "name": series.name,
        "points": [[p.time_ms / 1000, p.value] for p in series.points],
    }


def last(series: Series) -> float | None:
    for point in reversed(series.points):
        if point.value is not None:
            return point.value
    return None


def under_replicated(description: TopicDescription) -> int:
    return sum(1 for p in description.partitions if len(p.isr) < len(p.replicas))


def say(exc: BaseException) -> str:
    return describe_error(exc) if isinstance(exc, TidelogError) else str(exc)
