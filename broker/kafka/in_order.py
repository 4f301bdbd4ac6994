"""A Kafka connection's pipelined Produce answers, in request order (``InOrder``).

Split from ``broker.kafka.listener`` (which reads the requests and decides what is
pipelined) for size.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidelog.broker.kafka.listener import Connection, KafkaListener, Response

__all__ = ["PIPELINED_PRODUCES", "InOrder"]

# Produce requests of one connection appended ahead of their answers (as the gRPC
# listener's ProduceStream takes 8 ahead).
PIPELINED_PRODUCES = 8


class InOrder:
    """A connection's pipelined Produce answers, written in the order their requests came.

    Kafka's rule is one answer per request, in request order. A Produce is appended in
    order (the reader waits for its append before reading on: ``Connection.appended``),
    then waits for its fsync (``acks=all``) while the next requests are read and
    appended, so one group fsync covers several of them. Its answer is written once it
    and every answer before it are ready. Any other request first waits for every
    pipelined answer to be written (``drain``) and then runs alone, as before.
    """

    def __init__(
        self, listener: KafkaListener, connection: Connection, writer: asyncio.StreamWriter
    ) -> None:
        self._listener = listener
        self._connection = connection
        self._writer = writer
        self._tasks: collections.deque[asyncio.Task[Response]] = collections.deque()
        self._waiters: list[asyncio.Future[None]] = []  # woken whenever an answer is written
        self._sender: asyncio.Task[None] | None = None

    async def produce(self, frame: bytes) -> None:
        """Start ``frame`` (a Produce); return once it is appended (or answered)."""
        connection = self._connection
        loop = asyncio.get_running_loop()
        appended: asyncio.Future[None] = loop.create_future()
        connection.appended = appended
        task = loop.create_task(self._listener.respond(connection, frame))
        self._tasks.append(task)
        if self._sender is None:
            self._sender = loop.create_task(self._send())
        else:
            self._wake()
        try:
            await asyncio.wait((task, appended), return_when=asyncio.FIRST_COMPLETED)
        finally:
            connection.appended = None
        if task.done() and not task.cancelled() and task.exception() is not None:
            await self.drain()  # its error ends the connection, after what came before
        while len(self._tasks) > PIPELINED_PRODUCES:
            await self._written()

    async def drain(self) -> None:
        """Return once every pipelined answer is written; raise what ended the
        connection if the sender failed."""
        while self._tasks:
            await self._written()
        self._check_sender()

    async def _written(self) -> None:
        """Wait until the sender writes an answer (or fails: raised)."""
        sender = self._sender
        assert sender is not None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await asyncio.wait((waiter, sender), return_when=asyncio.FIRST_COMPLETED)
        self._check_sender()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _check_sender(self) -> None:
        sender = self._sender
        if sender is not None and sender.done() and not sender.cancelled():
            error = sender.exception()
            if error is not None:
                raise error

    async def _send(self) -> None:
        tasks, writer, connection = self._tasks, self._writer, self._connection
        while True:
            if not tasks:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
                continue
            response = await tasks[0]  # its error ends the connection (raised)
            if isinstance(response, list):
                await self._listener.send_parts(connection, writer, response)
            elif response is not None:
                writer.write(response)
                await writer.drain()
            tasks.popleft()
            self._wake()

    def cancel(self) -> None:
        """The connection ends: stop the sender and every answer still waited for."""
        for task in self._tasks:
            task.cancel()
        sender = self._sender
        if sender is not None:
            if sender.done() and not sender.cancelled():
                sender.exception()  # retrieved: raised to the reader already, or moot
            sender.cancel()
