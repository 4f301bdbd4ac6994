"""Spark offsets of the ``tidelog`` source, as pure functions on integers and text.

A source offset is Spark's Kafka shape, ``{"topic": {"partition": offset, ...}, ...}``:
for every topic-partition the *next* offset to read (exclusive end of what was read).
Spark stores it in the checkpoint as JSON text and compares offsets *as text* (an end
equal to the start means "no new data"), so the dict is always built in one order:
topics sorted, partitions sorted numerically, partition numbers as decimal strings
(``offset_dict``). ``json.dumps`` keeps that insertion order.

Also here: the starting/ending offset specs (``earliest``, ``latest``, per-partition JSON
with -2 = earliest and -1 = latest), admission control (``cap_offsets``: a cap spread
fairly over partitions), and cutting offset ranges into Spark input partitions
(``split_ranges``). No file, socket or Spark session: hypothesis tests cover them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tidelog.client.types import TopicPartition

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetRange",
    "OffsetSpec",
    "cap_offsets",
    "from_json",
    "offset_dict",
    "parse_assign",
    "parse_offset_spec",
    "parse_offsets",
    "split_ranges",
    "to_json",
]

EARLIEST = -2
LATEST = -1

Offsets = Mapping[TopicPartition, int]


def offset_dict(offsets: Offsets) -> dict[str, dict[str, int]]:
    """The canonical dict of ``offsets``: topics sorted, partitions sorted numerically."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):  # TopicPartition orders by (topic, partition)
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def parse_offsets(document: object) -> dict[TopicPartition, int]:
    """The inverse of ``offset_dict``; ``ValueError`` for anything else."""
    if not isinstance(document, Mapping):
        raise ValueError(f"offsets must be a JSON object of topics, got {document!r}")
    out: dict[TopicPartition, int] = {}
    for topic, partitions in document.items():
        if not isinstance(topic, str) or not isinstance(partitions, Mapping):
            raise ValueError(f"offsets of topic {topic!r} must be an object, got {partitions!r}")
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except (TypeError, ValueError):
                raise ValueError(f"partition {partition!r} of {topic!r} is not a number") from None
            if number < 0 or str(number) != str(partition):
                raise ValueError(f"partition {partition!r} of {topic!r} is not a number")
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise ValueError(f"offset of {topic}-{partition} must be an integer: {offset!r}")
            out[TopicPartition(topic, number)] = offset
    return out


def to_json(offsets: Offsets) -> str:
    """Canonical JSON text: equal offsets give equal text."""
    return json.dumps(offset_dict(offsets), separators=(",", ":"))


def from_json(text: str) -> dict[TopicPartition, int]:
    """Parse offsets JSON text; ``ValueError`` if it is not offsets."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"offsets are not JSON: {exc}") from None
    return parse_offsets(document)


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``startingOffsets``/``endingOffsets``: ``earliest``, ``latest`` or per partition."""

    kind: str  # "earliest", "latest" or "partitions"
    partitions: tuple[tuple[TopicPartition, int], ...] = ()

    def as_dict(self) -> dict[TopicPartition, int]:
        return dict(self.partitions)


def parse_offset_spec(text: str, *, name: str, allow_earliest_offset: bool = True) -> OffsetSpec:
    """Parse ``earliest``, ``latest`` or JSON ``{"t":{"0":23,"1":-2}}`` (-2/-1 markers).

    ``allow_earliest_offset`` false rejects -2 (``endingOffsets``, as Spark's Kafka
    source). Offsets below -2 are rejected. Raises ``ValueError`` naming ``name``.
    """
    value = text.strip()
    if value.lower() in ("earliest", "latest"):
        return OffsetSpec(value.lower())
    try:
        offsets = from_json(value)
    except ValueError as exc:
        raise ValueError(f"{name} must be earliest, latest or per-partition JSON: {exc}") from None
    for tp, offset in offsets.items():
        if offset < EARLIEST or (offset == EARLIEST and not allow_earliest_offset):
            raise ValueError(f"{name}: offset {offset} for {tp} is not allowed")
    return OffsetSpec("partitions", tuple(sorted(offsets.items())))


def parse_assign(text: str) -> tuple[TopicPartition, ...]:
    """``assign``: JSON ``{"topicA":[0,1],"topicB":[2]}``; ``ValueError`` otherwise."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f'assign must be JSON like {{"t":[0,1]}}: {exc}') from None
    if not isinstance(document, dict) or not document:
        raise ValueError("assign must be a non-empty JSON object of topic -> [partitions]")
    out: list[TopicPartition] = []
    for topic, partitions in document.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise ValueError(f"assign: partitions of {topic!r} must be a list of numbers")
        out.extend(TopicPartition(topic, p) for p in partitions)
    return tuple(sorted(set(out)))


def cap_offsets(start: Offsets, latest: Offsets, max_records: int) -> dict[TopicPartition, int]:
    """Admission control: end offsets that admit at most ``max_records`` in total.

    The cap is spread max-min fairly (water filling): partitions whose backlog is below
    the fair share get all of it, the others get equal shares of the rest. The remainder
    of that uneven division (one record each) goes to a window of the unsaturated
    partitions, in (topic, partition) order, that starts at ``sum of their start offsets
    % their number``: the window moves as the offsets do, so when the cap is smaller
    than the number of partitions with a backlog, successive micro-batches serve them in
    turn instead of always the same ones (no partition starves, however hot the others
    are). The sum admitted is ``min(max_records, backlog)``. A partition missing from
    ``start`` starts at 0 here (the caller passes its log start). Pure and deterministic.
    """
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    backlog = {tp: max(0, latest[tp] - start.get(tp, 0)) for tp in latest}
    grant = dict.fromkeys(backlog, 0)
    remaining = max_records
    # Smallest backlogs first: each that fits in an equal share of what is left takes all.
    order = sorted((tp for tp, n in backlog.items() if n > 0), key=lambda tp: (backlog[tp], tp))
    left = len(order)
    for tp in order:
        if backlog[tp] > remaining // left:
            break
        grant[tp] = backlog[tp]
        remaining -= grant[tp]
        left -= 1
    # The rest: equal shares (each below its backlog), the remainder to a moving window.
    unsaturated = sorted(tp for tp in order if grant[tp] < backlog[tp])
    if unsaturated:
        share, extra = divmod(remaining, len(unsaturated))
        rotation = sum(start.get(tp, 0) for tp in unsaturated) % len(unsaturated)
        window = set((unsaturated[rotation:] + unsaturated[:rotation])[:extra])
        for tp in unsaturated:
            grant[tp] = share + (1 if tp in window else 0)
    return {tp: (latest[tp] if backlog[tp] == 0 else start.get(tp, 0) + grant[tp]) for tp in latest}


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition, read by one Spark task.

    ``from_log_start`` marks a partition the query discovered after it started: it
    begins at the log start offset, whatever that is when it is read, and reading from
    there is not data loss.
    """

    tp: TopicPartition
    start: int
    end: int
    from_log_start: bool = False

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def split_ranges(
    ranges: Sequence[OffsetRange], *, max_records_per_partition: int, min_partitions: int
) -> list[OffsetRange]:
    """Cut ranges into input partitions so a backlog is read in parallel.

    Every range larger than ``max_records_per_partition`` is cut into equal pieces of at
    most that size; then, while there are fewer than ``min_partitions`` pieces, the
    largest piece is halved (pieces of one record are not cut). Empty ranges are dropped.
    The pieces cover exactly the offsets of the input, in order, without overlap.
    """
    if max_records_per_partition < 1 or min_partitions < 0:
        raise ValueError("max_records_per_partition must be >= 1, min_partitions >= 0")
    pieces: list[OffsetRange] = []
    for r in ranges:
        if r.size == 0:
            continue
        count = -(-r.size // max_records_per_partition)
        pieces.extend(_cut(r, count))
    while len(pieces) < min_partitions:
        largest = max(range(len(pieces)), key=lambda i: pieces[i].size, default=None)
        if largest is None or pieces[largest].size < 2:
            break
        pieces[largest : largest + 1] = _cut(pieces[largest], 2)
    return pieces


def _cut(r: OffsetRange, count: int) -> list[OffsetRange]:
    step, extra = divmod(r.size, count)
    out, start = [], r.start
    for index in range(count):
        end = start + step + (1 if index < extra else 0)
        # Every piece of a new partition may find its start below the log start: skip.
        out.append(OffsetRange(r.tp, start, end, r.from_log_start))
        start = end
    return out
