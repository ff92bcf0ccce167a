"""shmlink: fast messaging between processes over shared memory.

One API over several transports, named by the address prefix: ``shm:NAME``
(shared-memory rings), ``ux:NAME`` (Unix SOCK_SEQPACKET), ``tcp:HOST:PORT``,
``tls:HOST:PORT`` and ``auto:HOST:PORT`` (TCP, upgraded to shared memory when both
ends share a kernel).

>>> import shmlink
>>> with shmlink.listen("shm:demo") as listener:            # doctest: +SKIP
...     with shmlink.connect("shm:demo") as client, listener.accept() as server:
...         client.send(b"ping")
...         server.send(server.recv())
...         assert client.recv() == b"ping"

Errors are ``OSError`` subclasses: ``ConnectionResetError`` (peer died),
``BrokenPipeError`` (send to a dead peer), ``BlockingIOError`` (non-blocking mode),
``TimeoutError``, ``PermissionError``, ``ConnectionRefusedError``, and this package's
``ProtocolError``, ``MessageTooLargeError``, ``LaggedError`` and ``DetachedError``.
The end of a stream is ``EOFError`` (a zero-length message is a valid message).
Bad arguments raise ``ValueError`` or ``TypeError``. See ``docs/python.md``.
"""

from ._shmlink import (
    Connection,
    DetachedError,
    LaggedError,
    Listener,
    MessageTooLargeError,
    ProtocolError,
    Publisher,
    SendBuffer,
    Subscriber,
    __version__,
    connect,
    listen,
)

__all__ = [
    "Connection",
    "DetachedError",
    "LaggedError",
    "Listener",
    "MessageTooLargeError",
    "ProtocolError",
    "Publisher",
    "SendBuffer",
    "Subscriber",
    "__version__",
    "connect",
    "listen",
]
