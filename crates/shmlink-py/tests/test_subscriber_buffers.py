"""A subscriber's recv_into (a topic's messages into the caller's buffer) and stats()."""

import array
import threading

import pytest

import shmlink


def test_recv_into_fills_bytearrays_and_views_and_keeps_a_large_message_queued(addr):
    with shmlink.Publisher(addr, slots=16) as pub:
        sub = shmlink.Subscriber(addr)
        pub.wait_for_subscribers(1, 10)
        pub.publish(b"first")
        pub.publish(b"second message")
        pub.publish(b"x" * 64)
        buf = bytearray(32)
        assert sub.recv_into(buf) == 5 and buf[:5] == b"first"
        view = memoryview(bytearray(32))[8:]
        assert sub.recv_into(view) == 14 and bytes(view[:14]) == b"second message"
        small = bytearray(16)
        with pytest.raises(shmlink.MessageTooLargeError):
            sub.recv_into(small)
        assert sub.recv() == b"x" * 64  # still queued, whole
        # Any writable buffer: array.array through a memoryview.
        pub.publish(b"\x01\x00\x00\x00\x02\x00\x00\x00")
        ints = array.array("i", [0, 0, 0])
        assert sub.recv_into(ints) == 8 and ints.tolist() == [1, 2, 0]
        for bad in [b"read-only bytes", "text", None, 5]:
            with pytest.raises(TypeError):
                sub.recv_into(bad)
        pub.close()
        with pytest.raises(EOFError):
            sub.recv_into(buf)
        sub.close()


def test_recv_into_waits_for_the_message_and_honours_timeouts(addr):
    with shmlink.Publisher(addr) as pub:
        sub = shmlink.Subscriber(addr)
        pub.wait_for_subscribers(1, 10)
        buf = bytearray(16)
        sub.setblocking(False)
        with pytest.raises(BlockingIOError):
            sub.recv_into(buf)
        sub.settimeout(0.05)
        with pytest.raises(TimeoutError):
            sub.recv_into(buf)
        sub.settimeout(10.0)
        t = threading.Timer(0.1, pub.publish, args=(b"late",))
        t.start()
        assert sub.recv_into(buf) == 4 and buf[:4] == b"late"
        t.join()
        sub.close()


def test_stats_count_received_lag_and_missed(addr):
    with shmlink.Publisher(addr, slots=4, policy="overwrite") as pub:
        sub = shmlink.Subscriber(addr)
        pub.wait_for_subscribers(1, 10)
        assert sub.stats() == {"received": 0, "missed": 0, "lag": 0}
        pub.publish(b"a")
        pub.publish(b"b")
        assert sub.stats()["lag"] == 2
        assert sub.recv() == b"a"
        st = sub.stats()
        assert st["received"] == 1 and st["lag"] == 1 and st["missed"] == 0
        for i in range(10):
            pub.publish(b"%d" % i)
        with pytest.raises(shmlink.LaggedError) as e:
            sub.recv()
        st = sub.stats()
        assert st["missed"] == e.value.missed > 0
        sub.close()
        with pytest.raises(OSError):
            sub.stats()
