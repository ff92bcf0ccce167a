"""Point-to-point connections: the issue's scenarios from Python, with peers in other
processes (multiprocessing, spawn) where the scenario is about processes."""

import multiprocessing
import os
import signal
import struct
import threading
import time
import zlib

import pytest

import shmlink
import peers

ctx = multiprocessing.get_context("spawn")


def start(target, *args):
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def join(p, timeout=60):
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join(5)
        pytest.fail(f"peer {p.name} did not finish within {timeout} s")
    assert p.exitcode == 0, f"peer exited with {p.exitcode}"


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, restored after it. A
    process started with SIGINT ignored (a background job of a non-interactive shell,
    nohup, many CI runners) keeps it ignored, and Python then installs no handler: a test
    that waits for its KeyboardInterrupt would wait for nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    # None: the handler was not set from Python; the default is the closest there is.
    signal.signal(signal.SIGINT, signal.SIG_DFL if old is None else old)


@pytest.fixture
def echo_server(addr):
    ready = ctx.Event()
    p = start(peers.echo_server, addr, ready)
    assert ready.wait(30), "echo server did not start"
    yield addr
    join(p)


def test_echo_with_a_server_process(echo_server):
    with shmlink.connect(echo_server) as conn:
        assert conn.transport == "shm"
        for msg in [b"hello", b"", bytearray(b"from a bytearray"), memoryview(b"xview")[1:]]:
            conn.send(msg)
            assert conn.recv() == bytes(msg)
        buf = bytearray(16)
        conn.send(b"into")
        assert conn.recv_into(buf) == 4 and buf[:4] == b"into"
        view = memoryview(bytearray(16))[4:]
        conn.send(b"view")
        assert conn.recv_into(view) == 4 and bytes(view[:4]) == b"view"
        c = conn.counters()
        assert c["msgs_out"] == 6 and c["msgs_in"] == 6


def test_echo_in_one_process_with_threads(addr):
    with shmlink.listen(addr) as listener:
        def serve():
            with listener.accept() as conn:
                for msg in conn:
                    conn.send(msg)

        t = threading.Thread(target=serve)
        t.start()
        with shmlink.connect(addr) as conn:
            for i in range(1000):
                conn.send(b"%d" % i)
                assert conn.recv() == b"%d" % i
        t.join(10)
        assert not t.is_alive()


def test_end_of_stream_is_eoferror_after_the_last_message(addr):
    with shmlink.listen(addr) as listener:
        client, server = peers.pair(listener, addr)
        client.send(b"last")
        client.close()
        assert server.recv() == b"last"
        with pytest.raises(EOFError):
            server.recv()
        assert list(server) == []
        server.close()


# 1,000,000 messages as the issue asks; each carries its sequence number and the crc32 of
# its payload, checked on arrival. Python's own per-message cost (~1-2 us a call) makes
# this a few seconds.
ORDERED_COUNT = int(os.environ.get("SHMLINK_PY_ORDERED", "1000000"))


def test_a_million_ordered_checksummed_messages(addr):
    size = 32
    with shmlink.listen(addr) as listener:
        p = start(peers.ordered_sender, addr, ORDERED_COUNT, size)
        listener.settimeout(30)
        conn = listener.accept()
        conn.settimeout(30)
        unpack = struct.Struct("<QI").unpack_from
        crc32 = zlib.crc32
        expected = 0
        for msg in conn:
            seq, crc = unpack(msg)
            body = msg[12:]
            assert seq == expected, f"message {expected} arrived as {seq}"
            assert crc32(body) == crc, f"message {seq} corrupted"
            assert int.from_bytes(body[:8], "little") == seq
            expected += 1
        assert expected == ORDERED_COUNT
        conn.close()
        join(p)


SIZES = [0, 1, 7, 64, 4095, 4096, 65536, 128 * 1024 + 1, 1 << 20, 16 << 20, 64 << 20]


def test_sizes_from_0_bytes_to_64_mib(echo_server):
    p = start(peers.echo_client_sizes, echo_server, SIZES)
    join(p, timeout=120)


def test_a_message_over_the_maximum_is_refused_and_the_connection_goes_on(addr):
    with shmlink.listen(addr, max_msg_size=1024) as listener:
        client, server = peers.pair(listener, addr, max_msg_size=1024)
        assert client.max_msg_size == 1024
        with pytest.raises(shmlink.MessageTooLargeError) as e:
            client.send(bytes(1025))
        assert e.value.errno == 90  # EMSGSIZE
        client.send(bytes(1024))
        assert server.recv() == bytes(1024)
        small = bytearray(10)
        client.send(b"x" * 11)
        with pytest.raises(shmlink.MessageTooLargeError):
            server.recv_into(small)
        assert server.recv() == b"x" * 11  # still queued
        client.close()
        server.close()


def test_nonblocking_mode_and_timeouts(addr):
    with shmlink.listen(addr) as listener:
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
        listener.settimeout(0.05)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            listener.accept()
        assert time.monotonic() - t0 >= 0.05
        listener.settimeout(None)
        client, server = peers.pair(listener, addr)
        server.setblocking(False)
        assert not server.getblocking() and server.gettimeout() == 0.0
        with pytest.raises(BlockingIOError) as e:
            server.recv()
        assert e.value.errno == 11  # EAGAIN
        server.settimeout(0.1)
        assert server.gettimeout() == pytest.approx(0.1)
        with pytest.raises(TimeoutError):
            server.recv()
        client.send(b"now")
        assert server.recv() == b"now"
        client.close()
        server.close()


def test_selectors_loop_over_64_connections(addr):
    import selectors

    n_conns, rounds = 64, 50
    with shmlink.listen(addr) as listener:
        listener.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, None)
        p = start(peers.many_clients, addr, n_conns, rounds)
        served = 0
        closed = 0
        deadline = time.monotonic() + 60
        while closed < n_conns:
            assert time.monotonic() < deadline, f"{closed} of {n_conns} connections done"
            for key, _ in sel.select(timeout=1.0):
                if key.data is None:
                    while True:
                        try:
                            conn = listener.accept()
                        except BlockingIOError:
                            break
                        conn.setblocking(False)
                        sel.register(conn, selectors.EVENT_READ, "conn")
                    continue
                conn = key.fileobj
                while True:
                    try:
                        msg = conn.recv()
                    except BlockingIOError:
                        break
                    except EOFError:
                        sel.unregister(conn)
                        conn.close()
                        closed += 1
                        break
                    conn.send(msg)
                    served += 1
        sel.close()
        join(p)
        assert served == n_conns * rounds


def peer_death_once(addr):
    """A peer process connects and is SIGKILLed while this process is parked in recv;
    returns the seconds from the kill to ConnectionResetError."""
    with shmlink.listen(addr) as listener:
        ready = ctx.Event()
        p = start(peers.connect_and_wait, addr, ready)
        listener.settimeout(30)
        conn = listener.accept()
        assert ready.wait(30)
        conn.settimeout(10)
        killed = []

        def kill():
            time.sleep(0.2)  # let the main thread park in recv first
            killed.append(time.monotonic())
            os.kill(p.pid, signal.SIGKILL)

        t = threading.Thread(target=kill)
        t.start()
        with pytest.raises(ConnectionResetError) as e:
            conn.recv()
        elapsed = time.monotonic() - killed[0]
        t.join()
        p.join(10)
        assert e.value.errno == 104  # ECONNRESET
        with pytest.raises(ConnectionResetError):
            conn.recv()  # final: asking again gives it again
        with pytest.raises(BrokenPipeError):
            conn.send(bytes(1 << 20))  # more than the ring holds: it meets the death
        conn.close()
        return elapsed


def test_peer_death_is_connectionreseterror_within_100_ms(addr):
    # The requirement is 100 ms; a loaded machine may delay one attempt (as the Rust
    # peer_death test does, the best of three attempts must meet it).
    times = []
    for i in range(3):
        times.append(peer_death_once(f"{addr}-{i}"))
        if times[-1] < 0.1:
            return
    pytest.fail(f"peer death noticed after {[round(t * 1000, 1) for t in times]} ms")


def test_bad_arguments_raise_valueerror_or_typeerror(addr):
    for bad in ["", "shm:", "nope:x", "tcp:nohost", "tcp:127.0.0.1:99999", "shm:a\0b"]:
        with pytest.raises(ValueError):
            shmlink.connect(bad)
    for bad in [None, 42, b"shm:x"]:
        with pytest.raises(TypeError):
            shmlink.connect(bad)
    with pytest.raises(TypeError):
        shmlink.connect(addr, no_such_option=1)
    for opts in [dict(ring_size=3), dict(ring_size=-1), dict(ring_size=1 << 80),
                 dict(connect_timeout=-1.0), dict(connect_timeout=float("nan")),
                 dict(max_msg_size=-5)]:
        with pytest.raises(ValueError):
            shmlink.listen(addr, **opts)
    with pytest.raises(TypeError):
        shmlink.listen(addr, ring_size="big")
    with shmlink.listen(addr) as listener:
        conn, server = peers.pair(listener, addr)
        for bad in ["text", 42, None, [1, 2]]:
            with pytest.raises(TypeError):
                conn.send(bad)
        for bad in [b"read-only bytes", "text", None]:
            with pytest.raises(TypeError):
                server.recv_into(bad)
        with pytest.raises(ValueError):
            conn.settimeout(-1)
        with pytest.raises(TypeError):
            conn.settimeout("soon")
        conn.close()
        conn.close()  # twice is fine
        assert conn.fileno() == -1 and conn.closed
        with pytest.raises(OSError) as e:
            conn.send(b"after close")
        assert e.value.errno == 9  # EBADF
        server.close()


def test_address_in_use_is_an_oserror(addr):
    with shmlink.listen(addr):
        with pytest.raises(OSError) as e:
            shmlink.listen(addr)
        assert e.value.errno == 98  # EADDRINUSE


def test_other_transports(tmp_path):
    for a in ["ux:" + str(tmp_path / "s"), "tcp:127.0.0.1:0"]:
        with shmlink.listen(a) as listener:
            client, server = peers.pair(listener, listener.local_addr)
            client.send(b"over " + a.encode())
            assert server.recv() == b"over " + a.encode()
            client.close()
            with pytest.raises(EOFError):
                server.recv()
            server.close()


def test_keyboardinterrupt_during_a_blocking_recv_returns_promptly(addr, sigint_raises):
    assert threading.current_thread() is threading.main_thread()
    with shmlink.listen(addr) as listener:
        client, server = peers.pair(listener, addr)
        sent = []

        def interrupt():
            time.sleep(0.3)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

        t = threading.Thread(target=interrupt)
        t.start()
        with pytest.raises(KeyboardInterrupt):
            server.recv()  # nobody sends: only Ctrl-C ends this
        elapsed = time.monotonic() - sent[0]
        t.join()
        # Polls wake every 50 ms at the latest to run Python's signal handlers.
        assert elapsed < 0.5, f"KeyboardInterrupt after {elapsed:.3f} s"
        # The connection is still usable.
        client.send(b"still there")
        assert server.recv() == b"still there"
        client.close()
        server.close()


def test_keyboardinterrupt_from_a_child_process_during_accept(addr, sigint_raises):
    import subprocess
    import sys

    with shmlink.listen(addr) as listener:
        child = subprocess.Popen(
            [sys.executable, "-c",
             f"import os, signal, time; time.sleep(0.3); os.kill({os.getpid()}, signal.SIGINT)"])
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            listener.accept()
        child.wait(10)
        assert time.monotonic() - t0 < 5


def test_send_and_recv_from_two_threads_at_once(addr):
    """One thread blocks in recv while another sends on the same connection."""
    with shmlink.listen(addr) as listener:
        a, b = peers.pair(listener, addr)
        got = []

        def reader():
            for _ in range(1000):
                got.append(a.recv())

        t = threading.Thread(target=reader)
        t.start()
        for i in range(1000):
            a.send(b"%d" % i)       # same connection as the blocked reader
            b.send(b.recv())       # echo back
        t.join(30)
        assert got == [b"%d" % i for i in range(1000)]
        a.close()
        b.close()


def test_keyboardinterrupt_during_a_send_to_a_full_ring(addr, sigint_raises):
    with shmlink.listen(addr, ring_size=4096) as listener:
        client, server = peers.pair(listener, addr, ring_size=4096)

        def interrupt():
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)

        t = threading.Thread(target=interrupt)
        t.start()
        sent = 0
        with pytest.raises(KeyboardInterrupt):
            while True:  # nobody reads: the ring fills and send waits
                client.send(bytes(1000))
                sent += 1
        t.join()
        assert sent > 0
        # What was sent arrives whole and in order.
        server.setblocking(False)
        got = 0
        while True:
            try:
                assert server.recv() == bytes(1000)
                got += 1
            except BlockingIOError:
                break
        assert got >= sent
        client.close()
        server.close()


def test_a_peer_that_breaks_the_protocol_is_protocolerror(tmp_path):
    """A "listener" that answers the shm: hello with junk: ProtocolError (an OSError,
    errno EPROTO), not a crash or a hang."""
    import socket

    path = str(tmp_path / "junk.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ls.bind(path)
    ls.listen(1)

    def junk_server():
        c, _ = ls.accept()
        with c:
            c.recv(4096)
            c.send(b"\xff" * 64)
            c.settimeout(5)
            try:
                c.recv(16)
            except OSError:
                pass

    t = threading.Thread(target=junk_server)
    t.start()
    with pytest.raises(shmlink.ProtocolError) as e:
        shmlink.connect("shm:" + path, connect_timeout=5)
    assert isinstance(e.value, OSError) and e.value.errno == 71  # EPROTO
    t.join(10)
    ls.close()
