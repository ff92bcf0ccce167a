"""Publish/subscribe: one publisher, three subscriber processes.
Usage: python pubsub.py shm:prices"""
import multiprocessing
import sys

import shmlink


def subscriber(addr, n):
    with shmlink.Subscriber(addr) as sub:
        got = [msg for msg in sub]  # until the publisher closes the topic
    assert got == [b"tick %d" % i for i in range(n)], "lost or reordered"


if __name__ == "__main__":
    addr, n = sys.argv[1], 10_000
    # spawn, not fork: a forked child would hold a copy of the publisher.
    ctx = multiprocessing.get_context("spawn")
    with shmlink.Publisher(addr, slots=1024, max_msg_size=64) as pub:
        procs = [ctx.Process(target=subscriber, args=(addr, n)) for _ in range(3)]
        for p in procs:
            p.start()
        pub.wait_for_subscribers(3, timeout=10.0)
        for i in range(n):
            pub.publish(b"tick %d" % i)  # written once, read by all three
    for p in procs:
        p.join()
        assert p.exitcode == 0
    print("3 subscribers got", n, "messages each")
