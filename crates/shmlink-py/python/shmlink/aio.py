"""asyncio for shmlink: ``await`` connect, accept, send and recv.

Each object wraps a blocking :mod:`shmlink` object switched to non-blocking mode and
waits for its :meth:`fileno` with ``loop.add_reader`` (shmlink makes the fd readable
whenever a call that raised ``BlockingIOError`` is worth retrying, for sending and
receiving alike). One reader callback per fd serves every task waiting on the object.

>>> async def main():                                       # doctest: +SKIP
...     listener = await shmlink.aio.listen("shm:aio-demo")
...     client = await shmlink.aio.connect("shm:aio-demo")
...     server = await listener.accept()
...     await client.send(b"ping")
...     await server.send(await server.recv())
...     assert await client.recv() == b"ping"
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, List, Optional, TypeVar, Union

from . import _shmlink

__all__ = ["Connection", "Listener", "Publisher", "Subscriber", "connect", "listen", "publish", "subscribe"]

T = TypeVar("T")
BytesLike = Union[bytes, bytearray, memoryview]


class _Waiter:
    """Runs non-blocking calls on one fd, waiting with ``loop.add_reader`` when needed."""

    def __init__(self, obj: Any) -> None:
        obj.setblocking(False)
        self._obj = obj
        self._fd: int = obj.fileno()
        self._futures: List["asyncio.Future[None]"] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _readable(self) -> None:
        futures, self._futures = self._futures, []
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
        for f in futures:
            if not f.done():
                f.set_result(None)

    async def _wait(self) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not self._futures:
            self._loop = loop
            loop.add_reader(self._fd, self._readable)
        self._futures.append(fut)
        try:
            await fut
        finally:
            if fut in self._futures:
                self._futures.remove(fut)
                if not self._futures and self._loop is not None:
                    self._loop.remove_reader(self._fd)

    async def run(self, call: Callable[[], T]) -> T:
        while True:
            try:
                return call()
            except BlockingIOError:
                pass
            await self._wait()

    def close(self) -> None:
        if self._futures and self._loop is not None:
            self._loop.remove_reader(self._fd)
        for f in self._futures:
            if not f.done():
                f.cancel()
        self._futures = []


class _Messages:
    """``async for msg in obj``: the messages of ``obj.recv()`` until ``EOFError``."""

    async def recv(self) -> bytes:
        raise NotImplementedError

    def __aiter__(self: T) -> T:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.recv()
        except EOFError:
            raise StopAsyncIteration from None


class Connection(_Messages):
    """An asyncio wrapper of :class:`shmlink.Connection` (see :func:`connect`)."""

    def __init__(self, conn: _shmlink.Connection) -> None:
        self.conn = conn
        self._w = _Waiter(conn)

    async def send(self, data: BytesLike) -> None:
        """Sends one message, waiting while the peer's window is full (until all of it
        is handed to the transport)."""
        await self._w.run(lambda: self.conn.send(data))
        await self._w.run(self.conn.flush)

    async def recv(self) -> bytes:
        """Receives one message; ``EOFError`` at the end of the stream."""
        return await self._w.run(self.conn.recv)

    async def recv_into(self, buffer: Union[bytearray, memoryview]) -> int:
        """Receives one message into ``buffer``; returns its length."""
        return await self._w.run(lambda: self.conn.recv_into(buffer))

    def fileno(self) -> int:
        return self.conn.fileno()

    async def close(self) -> None:
        """Closes gracefully (in a worker thread: close may wait for the peer)."""
        self._w.close()
        await asyncio.get_running_loop().run_in_executor(None, self.conn.close)

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Listener:
    """An asyncio wrapper of :class:`shmlink.Listener` (see :func:`listen`)."""

    def __init__(self, listener: _shmlink.Listener) -> None:
        self.listener = listener
        self._w = _Waiter(listener)

    async def accept(self) -> Connection:
        """Waits for the next client."""
        conn = await self._w.run(self.listener.accept)
        return Connection(conn)

    @property
    def local_addr(self) -> str:
        return self.listener.local_addr

    def fileno(self) -> int:
        return self.listener.fileno()

    def close(self) -> None:
        self._w.close()
        self.listener.close()

    async def __aenter__(self) -> "Listener":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class Publisher:
    """An asyncio wrapper of :class:`shmlink.Publisher`."""

    def __init__(self, publisher: _shmlink.Publisher) -> None:
        self.publisher = publisher
        self._w = _Waiter(publisher)

    async def publish(self, data: BytesLike) -> None:
        """Publishes one message, waiting for slow subscribers (``block`` policy)."""
        await self._w.run(lambda: self.publisher.publish(data))

    async def close(self) -> None:
        self._w.close()
        await asyncio.get_running_loop().run_in_executor(None, self.publisher.close)


class Subscriber(_Messages):
    """An asyncio wrapper of :class:`shmlink.Subscriber`."""

    def __init__(self, subscriber: _shmlink.Subscriber) -> None:
        self.subscriber = subscriber
        self._w = _Waiter(subscriber)

    async def recv(self) -> bytes:
        """The next message; ``EOFError`` when the publisher closed the topic."""
        return await self._w.run(self.subscriber.recv)

    def close(self) -> None:
        self._w.close()
        self.subscriber.close()


async def _in_thread(call: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, call)


async def connect(addr: str, **options: Any) -> Connection:
    """Connects to ``addr`` (the handshake runs in a worker thread, at most
    ``connect_timeout`` seconds) and returns an :class:`Connection`."""
    conn = await _in_thread(lambda: _shmlink.connect(addr, **options))
    return Connection(conn)


async def listen(addr: str, **options: Any) -> Listener:
    """Binds ``addr`` and returns a :class:`Listener`."""
    return Listener(_shmlink.listen(addr, **options))


async def publish(addr: str, **options: Any) -> Publisher:
    """Binds a topic at ``addr`` and returns a :class:`Publisher`."""
    return Publisher(await _in_thread(lambda: _shmlink.Publisher(addr, **options)))


async def subscribe(addr: str, **options: Any) -> Subscriber:
    """Subscribes to the topic at ``addr`` and returns a :class:`Subscriber`."""
    return Subscriber(await _in_thread(lambda: _shmlink.Subscriber(addr, **options)))
