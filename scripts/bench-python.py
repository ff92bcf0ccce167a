#!/usr/bin/env python3
"""What a Python user would otherwise pick, against shmlink, in one run and one table.

Methods: shmlink over shm:, socket AF_UNIX (SOCK_STREAM, length-prefixed) and TCP
loopback (TCP_NODELAY, length-prefixed), multiprocessing.Pipe, multiprocessing.Queue,
and multiprocessing.shared_memory with a hand-made lock (a sequence-number flag per
direction in the shared block, spun on; payload written before the flag).

For each message size (64 B and 64 KiB): round trips between two processes (p50, p99
over every sample) and one-way throughput (messages/s, MB/s). Processes are pinned,
cross-core by default (this process on one CPU, the peer on another; --same-core puts
both on one). Methods alternate within each of --rounds rounds, whose samples are
pooled, so that machine drift hits all of them alike.

Run it with the package installed (scripts/python.sh --no-test makes target/py-venv):
    target/py-venv/bin/python scripts/bench-python.py [--rounds 3] [--same-core]
"""

import argparse
import multiprocessing
import os
import socket
import struct
import sys
import tempfile
import time
from multiprocessing import shared_memory

import shmlink

LEN = struct.Struct("<I")


# ---- framing for stream sockets (what a user writes) ----
def sock_send(s, msg):
    s.sendall(LEN.pack(len(msg)) + msg)


def recv_exact(s, n, buf):
    view = memoryview(buf)[:n]
    got = 0
    while got < n:
        r = s.recv_into(view[got:], n - got)
        if r == 0:
            raise EOFError
        got += r
    return view


def sock_recv(s, buf):
    (n,) = LEN.unpack(recv_exact(s, 4, buf))
    return bytes(recv_exact(s, n, buf))


# ---- shared memory with a hand-made lock: one slot per direction ----
# A slot: u64 sequence number of the message in it (written last: the writer's "unlock"),
# u64 count of messages its owner took from the other slot (the reader's "unlock"),
# u32 length, payload. x86 keeps stores in order, which is what this relies on (as a
# hand-made lock in Python does).
HDR = struct.Struct("<QQI4x")
U64 = struct.Struct("<Q")


class ShmSlots:
    def __init__(self, shm, size, side):
        self.buf = shm.buf
        slot = HDR.size + size
        self.tx = slot * side
        self.rx = slot * (1 - side)
        self.sent = 0
        self.seen = 0

    def send(self, msg):
        buf, tx = self.buf, self.tx
        # Spin until the peer took our previous message out of our slot.
        while U64.unpack_from(buf, self.rx + 8)[0] < self.sent:
            pass
        self.sent += 1
        buf[tx + HDR.size: tx + HDR.size + len(msg)] = msg
        struct.pack_into("<I", buf, tx + 16, len(msg))
        U64.pack_into(buf, tx, self.sent)

    def recv(self):
        buf, rx = self.buf, self.rx
        want = self.seen + 1
        while U64.unpack_from(buf, rx)[0] != want:
            pass
        (n,) = struct.unpack_from("<I", buf, rx + 16)
        msg = bytes(buf[rx + HDR.size: rx + HDR.size + n])
        self.seen = want
        U64.pack_into(buf, self.tx + 8, want)
        return msg


# ---- the peer process ----
def peer(method, cpu, size, echo_n, sink_n, arg):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    buf = bytearray(size + 16)
    if method == "shmlink shm:":
        c = None
        for _ in range(1000):
            try:
                c = shmlink.connect(arg)
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        send, recv = c.send, c.recv
    elif method in ("socket AF_UNIX", "socket TCP"):
        fam = socket.AF_UNIX if method == "socket AF_UNIX" else socket.AF_INET
        c = socket.socket(fam, socket.SOCK_STREAM)
        c.connect(arg)
        if fam == socket.AF_INET:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send = lambda m: sock_send(c, m)  # noqa: E731
        recv = lambda: sock_recv(c, buf)  # noqa: E731
    elif method == "multiprocessing.Pipe":
        c = arg
        send, recv = c.send_bytes, c.recv_bytes
    elif method == "multiprocessing.Queue":
        q_in, q_out = arg
        send, recv = q_out.put, q_in.get
    elif method == "shared_memory + lock":
        shm = shared_memory.SharedMemory(name=arg)
        slots = ShmSlots(shm, size, 1)
        send, recv = slots.send, slots.recv
    else:
        raise SystemExit(f"unknown method {method}")
    for _ in range(echo_n):
        send(recv())
    for _ in range(sink_n):
        recv()
    send(b"done")
    if method == "shared_memory + lock":
        del slots, send, recv
        shm.close()
    elif method == "multiprocessing.Queue":
        q_out.close()
        q_out.join_thread()


# ---- one measurement ----
def measure(ctx, method, size, iters, stream_n, cpus):
    warm = max(100, iters // 10)
    msg = os.urandom(size)
    tmp = None
    cleanup = []
    if method == "shmlink shm:":
        addr = f"shm:bench-py-{os.getpid()}"
        listener = shmlink.listen(addr)
        cleanup.append(listener.close)
        arg = addr
    elif method == "socket AF_UNIX":
        tmp = tempfile.mkdtemp(prefix="bench-py-")
        path = os.path.join(tmp, "s")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(path)
        ls.listen(1)
        cleanup += [ls.close, lambda: os.unlink(path), lambda: os.rmdir(tmp)]
        arg = path
    elif method == "socket TCP":
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)
        cleanup.append(ls.close)
        arg = ls.getsockname()
    elif method == "multiprocessing.Pipe":
        mine, theirs = ctx.Pipe(duplex=True)
        arg = theirs
    elif method == "multiprocessing.Queue":
        to_peer, from_peer = ctx.Queue(), ctx.Queue()
        arg = (to_peer, from_peer)
    elif method == "shared_memory + lock":
        shm = shared_memory.SharedMemory(create=True, size=2 * (HDR.size + size) + 64)
        shm.buf[:] = bytes(len(shm.buf))
        arg = shm.name
    p = ctx.Process(target=peer, args=(method, cpus[1], size, warm + iters, stream_n, arg),
                    daemon=True)
    p.start()
    buf = bytearray(size + 16)
    if method == "shmlink shm:":
        c = listener.accept()
        send, recv = c.send, c.recv
        cleanup.insert(0, c.close)
    elif method.startswith("socket"):
        c, _ = ls.accept()
        if method == "socket TCP":
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send = lambda m: sock_send(c, m)  # noqa: E731
        recv = lambda: sock_recv(c, buf)  # noqa: E731
        cleanup.insert(0, c.close)
    elif method == "multiprocessing.Pipe":
        send, recv = mine.send_bytes, mine.recv_bytes
    elif method == "multiprocessing.Queue":
        send, recv = to_peer.put, from_peer.get
    else:
        slots = ShmSlots(shm, size, 0)
        send, recv = slots.send, slots.recv
    for _ in range(warm):
        send(msg)
        assert len(recv()) == size
    clock = time.perf_counter_ns
    samples = []
    for _ in range(iters):
        t0 = clock()
        send(msg)
        recv()
        samples.append(clock() - t0)
    t0 = clock()
    for _ in range(stream_n):
        send(msg)
    assert recv() == b"done"
    elapsed = (clock() - t0) / 1e9
    p.join(30)
    if method == "shared_memory + lock":
        del slots, send, recv
        shm.close()
        shm.unlink()
    if method == "multiprocessing.Queue":
        to_peer.close()
        to_peer.join_thread()
    for f in cleanup:
        try:
            f()
        except OSError:
            pass
    return samples, stream_n / elapsed, stream_n * size / elapsed


def pct(sorted_ns, q):
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=5000, help="round trips per round at 64 B")
    ap.add_argument("--same-core", action="store_true")
    ap.add_argument("--methods", default="all")
    args = ap.parse_args()
    ncpu = sorted(os.sched_getaffinity(0))
    if args.same_core or len(ncpu) < 2:
        cpus = (ncpu[0], ncpu[0])
    else:
        cpus = (ncpu[0], ncpu[1])
    os.sched_setaffinity(0, {cpus[0]})
    os.environ.setdefault("SHMLINK_DIR", tempfile.mkdtemp(prefix="shmlink-bench-py-"))
    ctx = multiprocessing.get_context("spawn")
    methods = ["shmlink shm:", "socket AF_UNIX", "socket TCP", "multiprocessing.Pipe",
               "multiprocessing.Queue", "shared_memory + lock"]
    if args.methods != "all":
        methods = [m for m in methods if any(w in m for w in args.methods.split(","))]
    sizes = [64, 64 * 1024]
    lat = {(m, s): [] for m in methods for s in sizes}
    tput = {(m, s): [] for m in methods for s in sizes}
    for r in range(args.rounds):
        for s in sizes:
            iters = args.iters if s == 64 else max(200, args.iters // 5)
            stream = 20 * iters if s == 64 else 2 * iters
            for m in methods:
                samples, mps, bps = measure(ctx, m, s, iters, stream, cpus)
                lat[(m, s)] += samples
                tput[(m, s)].append((mps, bps))
                print(f"  round {r + 1}/{args.rounds} {m:22} {s:>6} B done", file=sys.stderr)
    print(f"Python {sys.version.split()[0]}, shmlink {shmlink.__version__}, "
          f"{'same core' if cpus[0] == cpus[1] else 'cross-core'} (CPUs {cpus[0]} and {cpus[1]}), "
          f"{args.rounds} rounds; round trip in us, throughput one way (median of rounds)")
    print()
    print("| method | 64 B p50 | 64 B p99 | 64 KiB p50 | 64 KiB p99 | 64 B msgs/s | 64 KiB MB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    p50 = {}
    for m in methods:
        row = [m]
        for s in sizes:
            v = sorted(lat[(m, s)])
            p50[(m, s)] = pct(v, 0.5)
            row += [f"{pct(v, 0.5):.1f}", f"{pct(v, 0.99):.1f}"]
        t64 = sorted(x[0] for x in tput[(m, 64)])[len(tput[(m, 64)]) // 2]
        t64k = sorted(x[1] for x in tput[(m, 65536)])[len(tput[(m, 65536)]) // 2]
        row += [f"{t64:,.0f}", f"{t64k / 1e6:,.0f}"]
        print("| " + " | ".join(row) + " |")
    if "shmlink shm:" in methods:
        print()
        base = p50[("shmlink shm:", 64)]
        for other in methods[1:]:
            print(f"shmlink shm: 64 B round trip p50 is {p50[(other, 64)] / base:.1f}x "
                  f"faster than {other}")


if __name__ == "__main__":
    main()
