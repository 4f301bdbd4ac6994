"""``RecordFuture``: the ``concurrent.futures.Future`` that ``Producer.send`` returns.

A producer makes one future per record, hundreds of thousands per second, and a stock
``Future`` costs more than encoding the record: it builds its own ``threading.Condition``
(an ``RLock`` plus a waiter list) and two lists, four objects for the garbage collector
to track and traverse while the record waits for its batch. ``RecordFuture`` is one
object:

- all futures of a producer share one condition, and a whole batch is completed in one
  lock round with one ``notify_all`` (``settle_success``/``settle_failure``); callbacks
  run after, outside the lock;
- the waiter and callback lists are made on first use (most records never have either);
- what settling writes lives in slots: settling allocates nothing per record (an
  instance dictionary per future doubled both the settle's cost and the objects the
  collector tracks per record in flight);
- a pending future is left out of the garbage collector's lists (made by the C
  extension's ``new_untracked``) and handed back when its batch settles (``track_all``,
  before anything is written to it). Until then it refers only to class attributes and
  to what a caller attaches; a cycle through a callback or an attribute set meanwhile
  is found once the future settles, and every future settles (close fails the rest).
  The collector's young-generation passes over the futures in flight, and their
  promotion into the old generation, were ~6% of the producer's CPU (ABBA rounds,
  1,000,000 records of 100 B: +6% records/s). Without the extension futures are
  ordinary objects;
- the result is the batch's ``BatchOutcome`` plus the record's index, and the
  ``RecordMetadata`` tuple is built when ``result()`` asks for it, so a fire-and-forget
  ``send`` never builds one.

Sharing a condition means a waiter can be woken for another future; ``result`` and
``exception`` therefore wait again until their own state is final or their timeout runs
out (the stock ones treat any wake-up as final). ``cancel`` always returns False: a
record handed to the producer cannot be taken back (Kafka's futures behave the same).
Everything else (``done``, ``add_done_callback``, ``concurrent.futures.wait`` and
``as_completed``) is the stock implementation working on the private fields CPython's
``Future`` has had since 3.2 (``_condition``, ``_state``, ``_result``, ``_exception``,
``_waiters``, ``_done_callbacks``); the unit tests exercise each of them, so a change in
CPython fails loudly there.

Thread-safe, as ``Future`` is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures._base import FINISHED, PENDING
from functools import partial
from typing import Any

from tidelog.client.types import RecordMetadata
from tidelog.storage.native import NATIVE, native

__all__ = ["BatchOutcome", "RecordFuture", "settle_failure", "settle_success"]

_new_metadata = tuple.__new__
_getattr = getattr


def _slot_or(slot: str, default: Any) -> Any:
    """A property over ``slot`` that reads ``default`` while the slot is unset."""

    def read(future: Any) -> Any:
        return _getattr(future, slot, default)

    def write(future: Any, value: Any) -> None:
        setattr(future, slot, value)

    return property(read, write)


class BatchOutcome:
    """Where a batch landed: enough to build each of its records' ``RecordMetadata``.

    ``base_offset`` -1 means the broker told nothing (``acks=0``); ``append_time_ms``
    -1 means the records keep their own (CreateTime) timestamps.
    """

    __slots__ = ("append_time_ms", "base_offset", "partition", "timestamps", "topic")

    def __init__(
        self,
        topic: str,
        partition: int,
        base_offset: int,
        append_time_ms: int,
        timestamps: Sequence[int],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = base_offset
        self.append_time_ms = append_time_ms
        self.timestamps = timestamps

    def metadata(self, index: int) -> RecordMetadata:
        offset = self.base_offset + index if self.base_offset >= 0 else -1
        timestamp = self.append_time_ms if self.append_time_ms >= 0 else self.timestamps[index]
        metadata: RecordMetadata = _new_metadata(
            RecordMetadata, (self.topic, self.partition, offset, timestamp)
        )
        return metadata


class RecordFuture(Future[RecordMetadata]):
    """The future of one sent record; resolves to its ``RecordMetadata``.

    A new future is an empty object: ``factory`` makes them without running any
    ``__init__`` at all. What settling writes (state, outcome, index, error) lives in
    slots, so settling a batch allocates nothing per record: an instance dictionary per
    future (made by the first attribute set) cost as much as the rest of the settle and
    was one more object per record for the garbage collector to track. An unset slot
    reads as its stock default through the properties below (``_state`` is ``PENDING``
    until settled). The waiter and callback lists start as class attributes (None) and
    become instance attributes when first attached, as most records never have either.
    """

    __slots__ = ("_index", "_settled_error", "_settled_result", "_settled_state")

    _condition: threading.Condition
    _index: int
    _settled_state: str
    _settled_result: BatchOutcome
    _settled_error: BaseException
    _waiter_list: list[Any] | None = None
    _callback_list: list[Callable[[Future[RecordMetadata]], object]] | None = None

    def __init__(self, condition: threading.Condition) -> None:
        # Future.__init__ is deliberately not called: it would build a Condition and two
        # lists per record.
        self._condition = condition

    # The stock implementation reads and writes these three; unset, they are its defaults
    # (``_result`` is the batch's ``BatchOutcome`` once stored).
    _state: str = _slot_or("_settled_state", PENDING)
    _result: Any = _slot_or("_settled_result", None)
    _exception: BaseException | None = _slot_or("_settled_error", None)

    @classmethod
    def factory(cls, condition: threading.Condition) -> Callable[[], RecordFuture]:
        """A maker of futures sharing ``condition``, as cheap as making an empty object.

        It makes instances of a subclass (one per producer) whose class holds the
        condition, so nothing has to be set per future.
        """
        shared = type(
            cls.__name__,
            (cls,),
            {"_condition": condition, "__module__": __name__, "__slots__": ()},
        )
        if NATIVE:
            return partial(native.new_untracked, shared)
        return partial(object.__new__, shared)

    # The stock implementation appends to these; they exist once something is attached.
    @property
    def _waiters(self) -> list[Any]:
        waiters = self._waiter_list
        if waiters is None:
            waiters = self._waiter_list = []
        return waiters

    @_waiters.setter
    def _waiters(self, value: list[Any]) -> None:
        self._waiter_list = value

    @property
    def _done_callbacks(self) -> list[Callable[[Future[RecordMetadata]], object]]:
        callbacks = self._callback_list
        if callbacks is None:
            callbacks = self._callback_list = []
        return callbacks

    @_done_callbacks.setter
    def _done_callbacks(self, value: list[Callable[[Future[RecordMetadata]], object]]) -> None:
        self._callback_list = value

    def cancel(self) -> bool:
        """Records cannot be taken back once sent: always False."""
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to ``timeout`` seconds; return the metadata or raise the send's error.

        Raises ``concurrent.futures.TimeoutError`` if it is not done in time.
        """
        if self._state != FINISHED:  # once finished, nothing changes: no lock needed
            with self._condition:
                self._wait_locked(timeout)
        if self._exception is not None:
            raise self._exception
        outcome: BatchOutcome = self._result
        return outcome.metadata(self._index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait up to ``timeout`` seconds; return the send's error, or None on success."""
        if self._state != FINISHED:
            with self._condition:
                self._wait_locked(timeout)
        return self._exception

    def _wait_locked(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._state != FINISHED:
            if deadline is None:
                self._condition.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FutureTimeoutError()
            self._condition.wait(remaining)

    def __repr__(self) -> str:
        if self._state != FINISHED:
            return f"<RecordFuture at {id(self):#x} pending>"
        if self._exception is not None:
            return f"<RecordFuture at {id(self):#x} raised {type(self._exception).__name__}>"
        return f"<RecordFuture at {id(self):#x} {self.result()!r}>"


# Runs each done-callback, logging (not raising) its errors: the stock implementation.
_invoke_callbacks: Callable[[Future[RecordMetadata]], None] = Future._invoke_callbacks  # type: ignore[attr-defined]


def settle_success(
    condition: threading.Condition, futures: Sequence[RecordFuture], outcome: BatchOutcome
) -> None:
    """Complete ``futures`` (one batch, in record order) with ``outcome``: one lock round."""
    if NATIVE:
        native.track_all(futures)
    with condition:
        for index, future in enumerate(futures):
            future._settled_result = outcome
            future._index = index
            future._settled_state = FINISHED
            if future._waiter_list:
                for waiter in future._waiter_list:
                    waiter.add_result(future)
        condition.notify_all()
    for future in futures:
        if future._callback_list:
            _invoke_callbacks(future)


def settle_failure(
    condition: threading.Condition, futures: Sequence[RecordFuture], error: BaseException
) -> None:
    """Fail every future in ``futures`` with ``error``."""
    if NATIVE:
        native.track_all(futures)
    with condition:
        for future in futures:
            future._settled_error = error
            future._settled_state = FINISHED
            if future._waiter_list:
                for waiter in future._waiter_list:
                    waiter.add_exception(future)
        condition.notify_all()
    for future in futures:
        if future._callback_list:
            _invoke_callbacks(future)
