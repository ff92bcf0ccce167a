"""Publish/subscribe from Python: fan-out to several processes, lossy policy."""

import multiprocessing
import queue
import struct
import zlib

import pytest

import shmlink
import peers

ctx = multiprocessing.get_context("spawn")


def test_fan_out_to_four_subscriber_processes(addr):
    count, n_subs = 20000, 4
    results = ctx.Queue()
    with shmlink.Publisher(addr, slots=1024, max_msg_size=256, stall_timeout=10.0) as pub:
        procs = [ctx.Process(target=peers.subscriber, args=(addr, count, results), daemon=True)
                 for _ in range(n_subs)]
        for p in procs:
            p.start()
        pub.wait_for_subscribers(n_subs, 60)
        assert pub.subscriber_count == n_subs
        for seq in range(count):
            body = seq.to_bytes(8, "little") * 4
            pub.publish(struct.pack("<QI", seq, zlib.crc32(body)) + body)
        pub.close()
        done = []
        while len(done) < n_subs:
            try:
                kind, value = results.get(timeout=60)
            except queue.Empty:
                pytest.fail(f"only {len(done)} of {n_subs} subscribers finished")
            assert kind != "bad", value
            if kind == "done":
                done.append(value)
        assert done == [count] * n_subs
        for p in procs:
            p.join(30)
            assert p.exitcode == 0


def test_overwrite_policy_reports_lost_messages(addr):
    with shmlink.Publisher(addr, slots=4, policy="overwrite") as pub:
        sub = shmlink.Subscriber(addr)
        pub.wait_for_subscribers(1, 10)
        for i in range(10):
            pub.publish(b"%d" % i)
        with pytest.raises(shmlink.LaggedError) as e:
            sub.recv()
        assert e.value.missed > 0
        msgs = []
        sub.setblocking(False)
        while True:
            try:
                msgs.append(sub.recv())
            except BlockingIOError:
                break
        assert msgs and msgs[-1] == b"9"
        assert e.value.missed + len(msgs) == 10
        sub.close()


def test_subscriber_timeouts_and_end_of_topic(addr):
    pub = shmlink.Publisher(addr)
    sub = shmlink.Subscriber(addr)
    sub.settimeout(0.05)
    with pytest.raises(TimeoutError):
        sub.recv()
    pub.publish(b"one")
    assert sub.recv() == b"one"
    pub.close()
    with pytest.raises(EOFError):
        sub.recv()
    sub.close()


def test_pubsub_bad_arguments(addr):
    with pytest.raises(ValueError):
        shmlink.Publisher(addr, policy="sometimes")
    with pytest.raises(ValueError):
        shmlink.Publisher(addr, slots=3)
    with pytest.raises(TypeError):
        shmlink.Publisher(addr, nope=True)
    with pytest.raises(ConnectionRefusedError):
        shmlink.Subscriber(addr)
    with shmlink.Publisher(addr, max_msg_size=16) as pub:
        with pytest.raises(shmlink.MessageTooLargeError):
            pub.publish(bytes(17))
        with pytest.raises(TypeError):
            pub.publish("text")
