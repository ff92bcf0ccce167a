"""Echo client. Usage: python echo_client.py shm:echo"""
import sys

import shmlink

with shmlink.connect(sys.argv[1], connect_timeout=2.0) as conn:
    conn.settimeout(5.0)  # recv raises TimeoutError after 5 s
    for text in [b"hello", b"", b"x" * 100_000]:
        conn.send(text)
        assert conn.recv() == text
    buf = bytearray(64)
    conn.send(b"into a buffer")
    n = conn.recv_into(buf)
    print(bytes(buf[:n]).decode(), conn.counters())
