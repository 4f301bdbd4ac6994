"""``broker.gc_freeze``: the broker daemon's long-lived objects kept out of the cyclic
collector's walks, and its cyclic garbage still reclaimed by the full rounds."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tidelog.broker.gc_freeze import GcFreezer


class _Node:
    """A container in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """This test process's heap as it was: nothing left frozen."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_round_freezes_the_survivors_out_of_every_collection() -> None:
    clock = _Clock()
    freezer = GcFreezer(10.0, 600.0, clock=clock)
    kept = [_Node() for _ in range(20_000)]
    assert freezer.step()[0] == "freeze"
    assert gc.get_freeze_count() >= len(kept)
    # A full collection walks none of them now: they are in no generation.
    ids = {id(n) for n in kept}
    assert not ids & {id(o) for o in gc.get_objects(generation=2)}
    # What survives after a round is frozen by the next one.
    later = [_Node() for _ in range(1_000)]
    clock.now = 10.0
    assert freezer.step()[0] == "freeze"
    assert not {id(n) for n in later} & {id(o) for o in gc.get_objects(generation=2)}


def test_garbage_made_before_a_round_is_collected_by_it() -> None:
    freezer = GcFreezer(10.0, 600.0, clock=_Clock())
    node = _Node()
    gone = weakref.ref(node)
    del node
    kind, collected = freezer.step()
    assert (kind, gone()) == ("freeze", None)
    assert collected >= 1


def test_frozen_cycles_become_garbage_until_the_full_round_frees_them() -> None:
    clock = _Clock()
    freezer = GcFreezer(10.0, 600.0, clock=clock)
    node = _Node()
    gone = weakref.ref(node)
    freezer.step()
    del node  # a frozen cycle, now garbage: the frozen generation is never walked
    clock.now = 10.0
    assert freezer.step()[0] == "freeze"
    gc.collect()
    assert gone() is not None
    clock.now = 600.0
    assert freezer.step()[0] == "full"
    assert gone() is None
    assert gc.get_freeze_count() > 0  # frozen again after the full round
    clock.now = 610.0
    assert freezer.step()[0] == "freeze"  # the next full round is 600 s after this one


def test_stop_ends_the_rounds_and_unfreezes() -> None:
    freezer = GcFreezer(0.01, 600.0).start()
    assert gc.get_freeze_count() > 0
    freezer.stop()
    assert gc.get_freeze_count() == 0
