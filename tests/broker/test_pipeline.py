"""The request pipeline's one bridge back to a listener's loop (``broker.core.pipeline``)."""

from __future__ import annotations

import asyncio
import threading

from tidelog.broker.core.pipeline import LoopBridge


def test_a_result_from_another_thread_reaches_the_loop_once() -> None:
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[int] = loop.create_future()
        deliver = LoopBridge(loop).resolver(future)
        threads = [threading.Thread(target=deliver, args=(n,)) for n in (1, 2)]
        for thread in threads:
            thread.start()
            thread.join()
        assert loop.run_until_complete(future) == 1  # the second delivery is ignored
    finally:
        loop.close()


def test_a_wake_up_sets_the_event_on_the_loop() -> None:
    loop = asyncio.new_event_loop()
    try:

        async def wait() -> bool:
            event = asyncio.Event()
            thread = threading.Thread(target=LoopBridge(loop).waker(event))
            thread.start()
            thread.join()
            await asyncio.wait_for(event.wait(), 5)
            return event.is_set()

        assert loop.run_until_complete(wait())
    finally:
        loop.close()


def test_a_hand_off_to_a_closed_loop_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    LoopBridge(loop).post(lambda: None)  # the listener stopped: no error on this thread
