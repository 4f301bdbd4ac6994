"""The share-group checker (``share_checker``) on small histories made by hand: a legal
one is valid, each broken guarantee is reported as its own kind and only that, and every
legal cause of a redelivery (release, leave, member crash, broker crash, lock expiry) is
accepted. Times are in ms here (the lock is ``LOCK`` ms = ``LOCK * MS`` ns)."""

from __future__ import annotations

import io

from tests.faults.history import (
    Crash,
    Op,
    Send,
    ShareAck,
    ShareFetch,
    ShareGroupSettings,
    ShareKind,
    ShareLeave,
    dump_jsonl,
    load_jsonl,
)
from tests.faults.share_checker import check_share

MS = 1_000_000
LOCK = 100
SETTINGS = ShareGroupSettings(group="g", lock_ms=LOCK, delivery_limit=3, start_ns=0, end_ns=0)


def _send(value: str, offset: int) -> Send:
    return Send(
        producer_id="p", topic="t", partition=0, value=value, outcome="ok", offset=offset,
        start_ns=0, end_ns=MS,
    )  # fmt: skip


def _fetch(member: str, at: int, *records: tuple[int, str, int]) -> ShareFetch:
    """``records``: (offset, value, delivery count); the fetch runs [at, at + 1] ms."""
    return ShareFetch(
        member=member, topic="t", partition=0,
        records=tuple((o, v) for o, v, _ in records),
        delivery_counts=tuple(c for _, _, c in records),
        start_ns=at * MS, end_ns=(at + 1) * MS,
    )  # fmt: skip


def _ack(member: str, at: int, kind: ShareKind, *offsets: int, outcome: str = "ok") -> ShareAck:
    return ShareAck(
        member=member, topic="t", partition=0, offsets=offsets, kind=kind,
        outcome=outcome, start_ns=at * MS, end_ns=(at + 1) * MS,  # type: ignore[arg-type]
    )  # fmt: skip


def _kinds(*ops: Op) -> frozenset[str]:
    return check_share((SETTINGS, *ops)).kinds()


def test_a_legal_history_is_valid_and_survives_a_round_trip() -> None:
    history = (
        SETTINGS,
        _send("a", 0), _send("b", 1), _send("c", 2),
        _fetch("m1", 10, (0, "a", 1), (1, "b", 1)),
        _ack("m1", 12, "accept", 0),
        _ack("m1", 12, "release", 1),
        _fetch("m2", 14, (1, "b", 2), (2, "c", 1)),  # b: released by m1
        _ack("m2", 16, "accept", 1),
        _ack("m2", 16, "reject", 2),
    )  # fmt: skip
    report = check_share(history)
    assert report.valid, report.summary()
    assert report.counts["accepted"] == 2
    assert report.counts["rejected"] == 1
    assert report.counts["by_release"] == 1
    out = io.StringIO()
    dump_jsonl(history, out)
    assert load_jsonl(out.getvalue().splitlines()) == history


def test_every_legal_cause_of_a_redelivery_is_accepted() -> None:
    first = _fetch("m1", 10, (0, "a", 1))
    again = _fetch("m2", 20, (0, "a", 2))
    done = _ack("m2", 22, "accept", 0)
    causes: dict[str, Op] = {
        "release": _ack("m1", 12, "release", 0, outcome="unknown"),
        "leave": ShareLeave(member="m1", start_ns=12 * MS, end_ns=13 * MS),
        "crash": Crash(target="broker", start_ns=12 * MS, end_ns=15 * MS),
    }
    for cause, op in causes.items():
        report = check_share((SETTINGS, first, op, again, done))
        assert report.valid, report.summary()
        assert report.counts[f"by_{cause}"] == 1
    member_crash = Crash(target="m1", start_ns=12 * MS, end_ns=12 * MS)
    assert check_share((SETTINGS, first, member_crash, again, done)).valid
    expired = _fetch("m2", 10 + LOCK, (0, "a", 2))  # ends LOCK + 1 ms after first started
    report = check_share((SETTINGS, first, expired, _ack("m2", 200, "accept", 0)))
    assert report.counts["by_expiry"] == 1, report.summary()


def test_a_redelivery_without_a_cause_is_early() -> None:
    first = _fetch("m1", 10, (0, "a", 1))
    # A failed release, another member's release: neither frees m1's record.
    assert _kinds(
        first,
        _ack("m1", 12, "release", 0, outcome="failed"),
        _ack("m3", 12, "release", 0, outcome="unknown"),
        _fetch("m2", 20, (0, "a", 2)),
        _ack("m2", 22, "accept", 0),
    ) == {"early-redelivery"}
    # A crash of another member does not either.
    assert _kinds(
        first,
        Crash(target="m3", start_ns=12 * MS, end_ns=12 * MS),
        _fetch("m2", 20, (0, "a", 2)),
        _ack("m2", 22, "accept", 0),
    ) == {"early-redelivery"}


def test_acknowledgement_anomalies() -> None:
    first = _fetch("m1", 10, (0, "a", 1))
    # Accepted twice (by two members, the second after a lock expiry).
    assert _kinds(
        first,
        _ack("m1", 12, "accept", 0),
        _fetch("m2", 10 + LOCK, (0, "a", 2)),
        _ack("m2", 12 + LOCK, "accept", 0),
    ) == {"acknowledged-twice", "delivered-after-acknowledgement"}
    # m1's accept applied after the record went to m2 (m1's lock had expired).
    assert _kinds(
        first,
        _fetch("m2", 10 + LOCK, (0, "a", 2)),
        _ack("m1", 12 + LOCK, "accept", 0),
    ) == {"acknowledged-by-non-holder"}


def test_end_states() -> None:
    # Sent, never delivered: lost by the share group.
    assert _kinds(_send("a", 0)) == {"unfinished"}
    # Delivered, released, never delivered again below the limit.
    assert _kinds(_fetch("m1", 10, (0, "a", 1)), _ack("m1", 12, "release", 0)) == {"unfinished"}
    # At the limit, a release archives it; an accept of unknown outcome may have applied.
    limit = check_share((SETTINGS, _fetch("m1", 10, (0, "a", 3)), _ack("m1", 12, "release", 0)))
    assert limit.valid
    assert limit.counts["archived_at_limit"] == 1
    unsure = (
        SETTINGS,
        _fetch("m1", 10, (0, "a", 1)),
        _ack("m1", 12, "accept", 0, outcome="unknown"),
    )
    assert check_share(unsure).counts["unconfirmed"] == 1


def test_deliveries_nobody_saw_may_archive_a_record() -> None:
    # Delivered at 1 of 3, released, then two requests of unknown outcome (a commit that
    # fetched ahead, a broker crash): each may have acquired it once more, unseen, so it
    # may have reached the limit and been archived. One such event is not enough.
    released = (_fetch("m1", 10, (0, "a", 1)), _ack("m1", 12, "release", 0))
    commit = _ack("m2", 14, "accept", 1, outcome="unknown")
    crash = Crash(target="broker", start_ns=16 * MS, end_ns=18 * MS)
    report = check_share((SETTINGS, *released, commit, crash))
    assert report.valid, report.summary()
    assert report.counts["archived_unseen"] == 1
    assert _kinds(*released, commit) == {"unfinished"}
    # Events before the last delivery cannot have added to it.
    early = _ack("m2", 5, "accept", 1, outcome="unknown")
    assert _kinds(early, crash, *released) == {"unfinished"}


def test_records_and_counts() -> None:
    assert _kinds(_send("a", 0), _fetch("m1", 10, (0, "b", 1)), _ack("m1", 12, "accept", 0)) == {
        "divergent-record"
    }
    assert _kinds(
        _fetch("m1", 10, (0, "a", 2)),
        _ack("m1", 12, "release", 0),
        _fetch("m2", 14, (0, "a", 2)),
        _ack("m2", 16, "accept", 0),
    ) == {"delivery-count"}
    assert _kinds(_fetch("m1", 10, (0, "a", 4)), _ack("m1", 12, "accept", 0)) == {"delivery-count"}
