"""A plain Zenoh application (the official Python client, eclipse-zenoh): puts messages
to a key with no attachment. Puts a warm-up message (`warmup`) every 50 ms until a `go`
line on stdin, then COUNT messages of 64 B to 4 KiB, printing `sent LEN FNV1A64` for
each, then `done`.

usage: zpub.py ENDPOINT KEY COUNT"""
import sys
import threading
import time

import zenoh
from zcommon import fnv, peer_config


def main():
    endpoint, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    conf = peer_config(endpoint)
    go = threading.Event()

    def read_stdin():
        for line in sys.stdin:
            if line.strip() == "go":
                go.set()
                return
        go.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    with zenoh.open(conf) as session:
        pub = session.declare_publisher(key, congestion_control=zenoh.CongestionControl.BLOCK)
        print("declared", flush=True)
        while not go.is_set():
            pub.put(b"warmup")
            time.sleep(0.05)
        for i in range(count):
            n = 64 + (i * 131) % 4033
            body = i.to_bytes(8, "little") + bytes((i * 7 + k) % 251 for k in range(n - 8))
            pub.put(body)
            print("sent %d %d" % (len(body), fnv(body)), flush=True)
        print("done", flush=True)
        time.sleep(1.0)


main()
