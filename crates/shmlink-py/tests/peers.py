"""Peer processes for the tests, started with multiprocessing's spawn context (a fresh
interpreter: no state inherited from the test process but the environment)."""

import os
import struct
import sys
import time
import zlib

import shmlink


def connect_retry(addr, deadline=10.0, **options):
    """Connects, retrying while the server is not listening yet."""
    end = time.monotonic() + deadline
    while True:
        try:
            return shmlink.connect(addr, **options)
        except ConnectionRefusedError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)


def echo_server(addr, ready, **options):
    """Accepts one connection and echoes every message until the end of the stream."""
    with shmlink.listen(addr, **options) as listener:
        ready.set()
        conn = listener.accept()
        for msg in conn:
            conn.send(msg)
        conn.close()


def echo_client_sizes(addr, sizes):
    """Sends one message per size and checks the echo; exits 0 on success."""
    with connect_retry(addr) as conn:
        for n in sizes:
            msg = os.urandom(min(n, 4096)) * (n // 4096) + os.urandom(n % 4096)
            conn.send(msg)
            back = conn.recv()
            if back != msg:
                sys.exit(f"echo of {n} bytes differs ({len(back)} bytes back)")


def ordered_sender(addr, count, size):
    """Sends `count` messages: sequence number, crc32 of the payload, payload."""
    with connect_retry(addr) as conn:
        body = bytearray(size)
        pack = struct.Struct("<QI").pack
        for seq in range(count):
            body[0:8] = seq.to_bytes(8, "little")
            b = bytes(body)
            conn.send(pack(seq, zlib.crc32(b)) + b)


def connect_and_wait(addr, ready):
    """Connects, says so, then waits to be killed."""
    conn = connect_retry(addr)
    ready.set()
    time.sleep(60)
    conn.close()


def many_clients(addr, n_conns, rounds):
    """Opens `n_conns` connections and makes `rounds` round trips on each, round-robin,
    checking every echo; exits 0 on success."""
    conns = [connect_retry(addr) for _ in range(n_conns)]
    for r in range(rounds):
        for i, c in enumerate(conns):
            c.send(b"%d:%d" % (i, r))
        for i, c in enumerate(conns):
            got = c.recv()
            if got != b"%d:%d" % (i, r):
                sys.exit(f"connection {i} round {r}: got {got!r}")
    for c in conns:
        c.close()


def subscriber(addr, count, results):
    """Subscribes, reads until the topic closes, checks order and checksums."""
    with shmlink.Subscriber(addr) as sub:
        results.put(("subscribed", os.getpid()))
        expected = 0
        for msg in sub:
            seq, crc = struct.unpack_from("<QI", msg)
            if seq != expected or zlib.crc32(msg[12:]) != crc:
                results.put(("bad", f"got {seq} (crc ok: {zlib.crc32(msg[12:]) == crc}), expected {expected}"))
                return
            expected += 1
        results.put(("done", expected))


def pair(listener, addr, **options):
    """A connected (client, server) pair in this process. The shm: handshake needs the
    listener's accept, so the client connects from a thread meanwhile."""
    import threading

    out = {}

    def dial():
        try:
            out["client"] = shmlink.connect(addr, **options)
        except BaseException as e:  # reported below
            out["error"] = e

    t = threading.Thread(target=dial)
    t.start()
    old = listener.gettimeout()
    listener.settimeout(30)
    try:
        server = listener.accept()
    finally:
        listener.settimeout(old)
        t.join(30)
    if "error" in out:
        raise out["error"]
    return out["client"], server
