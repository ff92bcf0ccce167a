"""A plain Zenoh application (the official Python client, eclipse-zenoh): subscribes to
a key and prints `msg LEN FNV1A64` for every message (after a `ready` line at the
first one), skipping the shmlink tests' warm-up messages (first 8 bytes all 0xff).
Ends after COUNT messages or IDLE seconds without one.

usage: zsub.py ENDPOINT KEY COUNT [IDLE]"""
import sys
import threading
import time

import zenoh
from zcommon import fnv, peer_config


def main():
    endpoint, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    idle = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
    conf = peer_config(endpoint)
    got = []
    ready = threading.Event()
    done = threading.Event()
    last = [time.monotonic()]

    def on_sample(sample):
        payload = sample.payload.to_bytes()
        last[0] = time.monotonic()
        if not ready.is_set():
            ready.set()
            print("ready", flush=True)
        if payload[:8] == b"\xff" * 8:
            return
        got.append(payload)
        print("msg %d %d" % (len(payload), fnv(payload)), flush=True)
        if len(got) >= count:
            done.set()

    with zenoh.open(conf) as session:
        sub = session.declare_subscriber(key, on_sample)
        print("subscribed", flush=True)
        while not done.is_set() and time.monotonic() - last[0] < idle:
            time.sleep(0.05)
        sub.undeclare()
    print("result received=%d" % len(got), flush=True)


main()
