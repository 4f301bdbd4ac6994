"""The ``.txnindex``: its bytes, the fetch rule, truncation, a torn tail, file moves."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.storage.txn_index import (
    ENTRY,
    AbortedTxn,
    TransactionIndex,
    decode_entries,
    encode_entries,
)

PROPERTY = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
BASE = 100


@st.composite
def entry_lists(draw: st.DrawFn) -> list[AbortedTxn]:
    """Entries as a partition writes them: increasing markers, each after its start."""
    count = draw(st.integers(0, 12))
    out = []
    last = BASE - 1
    for _ in range(count):
        marker = last + draw(st.integers(1, 20))
        first = draw(st.integers(0, marker))
        lso = draw(st.integers(0, marker + 1))
        out.append(AbortedTxn(draw(st.integers(0, 2**63 - 1)), first, marker, lso))
        last = marker
    return out


@given(entries=entry_lists())
def test_entries_round_trip_in_34_bytes(entries: list[AbortedTxn]) -> None:
    data = encode_entries(entries)
    assert ENTRY.size == 34
    assert len(data) == 34 * len(entries)
    assert data[:2] in (b"", b"\x00\x00")  # version 0, big-endian
    assert decode_entries(data, BASE) == (entries, False)


@given(entries=entry_lists(), cut=st.integers(1, 33))
def test_a_torn_tail_keeps_the_whole_entries_and_asks_for_a_rebuild(
    entries: list[AbortedTxn], cut: int
) -> None:
    data = encode_entries(entries)
    kept, damaged = decode_entries(data[: max(0, len(data) - cut)], BASE)
    assert kept == entries[: len(kept)]
    assert damaged == (bool(entries) and True)


def _model_collect(
    segments: list[list[AbortedTxn]], fetch_offset: int, upper_bound: int
) -> list[AbortedTxn]:
    found = []
    for entries in segments:
        for e in entries:
            if e.last_offset >= fetch_offset and e.first_offset < upper_bound:
                found.append(e)
            if e.last_stable_offset >= upper_bound:
                return found
    return found


@PROPERTY
@given(entries=entry_lists(), fetch=st.integers(0, 400), span=st.integers(0, 300))
def test_collect_is_kafkas_rule(
    tmp_path: Path, entries: list[AbortedTxn], fetch: int, span: int
) -> None:
    index = TransactionIndex(tmp_path / "x.txnindex", BASE)
    for entry in entries:
        index.append(entry)
    found, complete = index.collect(fetch, fetch + span)
    assert found == _model_collect([entries], fetch, fetch + span)
    assert complete == any(e.last_stable_offset >= fetch + span for e in entries)


@PROPERTY
@given(entries=entry_lists(), cut=st.integers(BASE, 400))
def test_append_truncate_and_reopen(tmp_path: Path, entries: list[AbortedTxn], cut: int) -> None:
    path = tmp_path / f"{cut}.txnindex"
    index = TransactionIndex(path, BASE)
    assert not path.exists()
    for entry in entries:
        index.append(entry)
    assert path.exists() == bool(entries)  # created by the first entry only
    index.truncate_to(cut)
    expected = [e for e in entries if e.last_offset < cut]
    assert index.entries == expected
    index.fsync()
    index.close()
    reopened = TransactionIndex.open(path, BASE)
    assert reopened.entries == expected
    assert not reopened.needs_rebuild
    reopened.delete()
    assert not path.exists()


def test_out_of_order_entries_are_refused(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "a.txnindex", BASE)
    index.append(AbortedTxn(1, 100, 110, 111))
    try:
        index.append(AbortedTxn(2, 100, 110, 111))
    except ValueError:
        pass
    else:
        raise AssertionError("an entry at the same marker offset was accepted")
    assert [e.producer_id for e in index.entries] == [1]


def test_garbage_after_valid_entries_is_cut_and_flagged(tmp_path: Path) -> None:
    path = tmp_path / "b.txnindex"
    good = [AbortedTxn(1, 100, 105, 106), AbortedTxn(2, 101, 107, 108)]
    bad_version = b"\x00\x01" + encode_entries([AbortedTxn(3, 1, 200, 201)])[2:]
    path.write_bytes(encode_entries(good) + bad_version)
    index = TransactionIndex.open(path, BASE)
    assert index.entries == good
    assert index.needs_rebuild
    index.reset()
    assert index.entries == []
    assert not index.needs_rebuild
    assert path.read_bytes() == b""


def test_rename_follows_the_file_and_a_missing_file_is_fine(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "c.txnindex", BASE)
    index.rename(tmp_path / "c.txnindex.deleted")  # no file yet: nothing to move
    index.append(AbortedTxn(7, 100, 101, 102))
    assert (tmp_path / "c.txnindex.deleted").exists()
    index.rename(tmp_path / "c.txnindex")
    index.close()
    assert TransactionIndex.open(tmp_path / "c.txnindex", BASE).entries == index.entries
