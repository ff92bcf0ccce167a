"""Zero-copy sending: Connection.reserve() lends a writable SendBuffer, commit() sends it."""

import multiprocessing
import struct

import pytest

import shmlink
import peers
from peers import pair

ctx = multiprocessing.get_context("spawn")


@pytest.fixture
def echo(addr):
    """A client of an echo server in another process (a shm: connection between two
    processes lends the ring itself; one within a process is in-process, and copies),
    with 8 KiB rings: a message of up to half of that fits in one record."""
    ready = ctx.Event()
    p = ctx.Process(target=peers.echo_server, args=(addr, ready), kwargs={"ring_size": 8192},
                    daemon=True)
    p.start()
    assert ready.wait(30), "echo server did not start"
    client = peers.connect_retry(addr, ring_size=8192)
    client.settimeout(30)
    yield client
    client.close()
    p.join(30)
    assert p.exitcode == 0, p.exitcode


def test_round_trip_in_place_copied_and_shortened(echo):
    client = echo
    for n in [0, 1, 64, 4000, 6000]:
        buf = client.reserve(n)
        assert len(buf) == n and buf.nbytes == n and not buf.readonly
        assert buf.in_place == (n <= 4000), n  # 6000 bytes do not fit in one record
        data = bytes((i * 7 + n) % 256 for i in range(n))
        with memoryview(buf) as view:
            view[:] = data
        assert buf.tobytes() == data
        client.commit()
        assert client.recv() == data
    # A shorter commit sends the first bytes only; struct.pack_into writes in place.
    buf = client.reserve(64)
    struct.pack_into("<QI", buf, 0, 42, 7)
    buf[12] = 0xFF
    client.commit(13)
    assert client.recv() == struct.pack("<QI", 42, 7) + b"\xff"
    # Indexing and slices of the buffer itself.
    buf = client.reserve(8)
    buf[0:4] = b"abcd"
    buf[-4:] = bytearray(b"wxyz")
    assert buf[0] == ord("a") and buf[-1] == ord("z") and buf[2:6].tobytes() == b"cdwx"
    client.commit()
    assert client.recv() == b"abcdwxyz"
    assert client.counters()["msgs_out"] == 7


def staged_round_trip(listen_addr, connect_addr=None):
    """A reservation that is not in place: staged by the binding, sent at commit."""
    with shmlink.listen(listen_addr) as listener:
        client, server = pair(listener, connect_addr or listener.local_addr)
        buf = client.reserve(5)
        assert not buf.in_place
        buf[:] = b"hello"
        client.commit()
        assert server.recv() == b"hello"
        client.close()
        server.close()


def test_in_one_process_the_message_is_copied(addr):
    staged_round_trip(addr, addr)


def test_other_transports_stage_the_message():
    staged_round_trip("tcp:127.0.0.1:0")


def test_a_slice_kept_after_commit_cannot_write(echo):
    client = echo
    buf = client.reserve(16)
    assert buf.in_place
    part = buf[4:8]
    part[:] = b"kept"
    client.commit()
    assert client.recv()[4:8] == b"kept"
    for write in [lambda: part.__setitem__(0, 1), lambda: buf.__setitem__(slice(0, 4), b"late")]:
        with pytest.raises(ValueError, match="committed or cancelled"):
            write()
    with pytest.raises(ValueError):
        memoryview(part)  # no new export of a committed buffer
    with pytest.raises(ValueError):
        part.tobytes()
    # The next message is not touched by the old buffer.
    client.send(b"next")
    assert client.recv() == b"next"


def test_live_exports_refuse_commit_cancel_and_close(echo):
    client = echo
    buf = client.reserve(4)
    assert buf.in_place
    view = memoryview(buf)
    sliced = view[1:3]  # a slice of the export holds the export too
    view[:] = b"1234"
    view.release()
    for call in [client.commit, client.cancel, client.close]:
        with pytest.raises(BufferError, match="export"):
            call()
    sliced[0] = ord("X")
    sliced.release()
    client.commit()
    assert client.recv() == b"1X34"


def test_commit_of_more_than_reserved_is_refused_and_the_reservation_stays(echo):
    client = echo
    buf = client.reserve(8)
    buf[:] = b"8 bytes!"
    with pytest.raises(ValueError, match="commit\\(9\\) on a reservation of 8 bytes"):
        client.commit(9)
    client.commit(8)
    assert client.recv() == b"8 bytes!"


def test_sends_wait_for_the_reservation_and_receiving_goes_on(echo):
    client = echo
    client.send(b"reply")
    buf = client.reserve(3)
    for call in [lambda: client.send(b"x"), lambda: client.reserve(1), client.flush]:
        with pytest.raises(ValueError, match="commit\\(\\) or cancel\\(\\) it first"):
            call()
    assert client.recv() == b"reply"  # the echo of the message before
    buf[:] = b"abc"
    client.cancel()
    with pytest.raises(ValueError, match="committed or cancelled"):
        buf[0] = 1
    with pytest.raises(ValueError, match="without reserve"):
        client.commit()
    client.send(b"after")
    assert client.recv() == b"after"  # the cancelled message was never sent


def test_reserve_over_the_maximum_and_close_with_an_open_reservation(addr):
    with shmlink.listen(addr, max_msg_size=1024) as listener:
        client, server = pair(listener, addr, max_msg_size=1024)
        with pytest.raises(shmlink.MessageTooLargeError, match="max_msg_size"):
            client.reserve(1025)
        buf = client.reserve(10)
        client.close()  # cancels the reservation (no export alive)
        with pytest.raises(ValueError):
            buf[0] = 1
        with pytest.raises(EOFError):
            server.recv()
        server.close()


def test_publisher_reserve_fills_the_topic_slot_in_place(addr):
    with shmlink.Publisher(addr, slots=4, max_msg_size=256) as pub:
        sub = shmlink.Subscriber(addr)
        pub.wait_for_subscribers(1, 10)
        for i in range(10):  # more than the slots: each reservation is a fresh slot
            buf = pub.reserve(64)
            assert buf.in_place
            struct.pack_into("<I", buf, 0, i)
            buf[4:9] = b"topic"
            pub.commit(9)
            assert sub.recv() == struct.pack("<I", i) + b"topic"
        buf = pub.reserve(16)
        part = buf[0:4]
        view = memoryview(buf)
        with pytest.raises(ValueError, match="commit\\(\\) or cancel\\(\\) it first"):
            pub.publish(b"x")
        with pytest.raises(BufferError):
            pub.commit()
        view.release()
        with pytest.raises(ValueError, match="commit\\(17\\) on a reservation of 16 bytes"):
            pub.commit(17)
        pub.cancel()
        with pytest.raises(ValueError, match="committed or cancelled"):
            part[0] = 1
        with pytest.raises(shmlink.MessageTooLargeError):
            pub.reserve(257)
        pub.publish(b"after")
        assert sub.recv() == b"after"  # the cancelled slot held nothing published
        pub.reserve(4)[:] = b"last"
        pub.commit()
        assert sub.recv() == b"last"
        sub.close()
