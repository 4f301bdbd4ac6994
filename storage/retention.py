"""Retention as a pure plan: which leading segments of a log may be deleted now.

Kafka's rules (``UnifiedLog.deleteOldSegments``, reference 3.2), on integers only:

* walk segments oldest to newest and stop at the first one that may not go;
* a segment may go only if all of it is below the high watermark;
* it goes if it lies wholly below the log start offset (any cleanup policy), or, for
  ``delete`` policies, while the partition exceeds ``retention.bytes`` by at least its
  size, or when its largest timestamp is older than ``retention.ms``;
* an empty last segment never goes. If every segment would go, the caller first rolls a
  fresh empty segment so that the log keeps its end offset.

``PartitionLog.delete_old_segments`` applies the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SegmentInfo", "plan_retention"]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What retention needs to know of a segment."""

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int


def plan_retention(
    segments: Sequence[SegmentInfo],
    *,
    log_start_offset: int,
    high_watermark: int,
    retention_ms: int,
    retention_bytes: int,
    delete_policy: bool,
    now_ms: int,
) -> int:
    """Return how many leading segments to delete (0 to ``len(segments)``)."""
    excess = sum(s.size_bytes for s in segments) - retention_bytes
    count = 0
    for i, segment in enumerate(segments):
        is_last = i == len(segments) - 1
        if is_last and segment.size_bytes == 0:
            break
        if segment.next_offset > high_watermark:
            break
        below_start = segment.next_offset <= log_start_offset
        too_big = delete_policy and retention_bytes >= 0 and excess - segment.size_bytes >= 0
        too_old = (
            delete_policy and retention_ms >= 0 and now_ms - segment.max_timestamp_ms > retention_ms
        )
        if not (below_start or too_big or too_old):
            break
        excess -= segment.size_bytes
        count += 1
    return count
