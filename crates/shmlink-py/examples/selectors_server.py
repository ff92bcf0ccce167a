"""One thread serves many connections with selectors. Usage:
python selectors_server.py shm:many [max-connections]"""
import collections
import selectors
import sys

import shmlink

sel = selectors.DefaultSelector()
listener = shmlink.listen(sys.argv[1])
listener.setblocking(False)
sel.register(listener, selectors.EVENT_READ)
unsent = {}  # connection -> echoes a full ring held back
remaining = int(sys.argv[2]) if len(sys.argv) > 2 else None
print("listening on", listener.local_addr, flush=True)

while remaining is None or remaining > 0:
    for key, _ in sel.select():
        if key.fileobj is listener:
            try:
                conn = listener.accept()
            except BlockingIOError:
                continue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
            unsent[conn] = collections.deque()
            continue
        conn = key.fileobj
        queue = unsent[conn]
        try:
            while True:  # until BlockingIOError: the fd stays readable until then
                while queue:
                    conn.send(queue[0])
                    queue.popleft()
                queue.append(conn.recv())
        except BlockingIOError:
            pass  # wait for the fd: a message arrived, or room for the held-back echo
        except (EOFError, ConnectionResetError):
            sel.unregister(conn)
            del unsent[conn]
            conn.close()
            if remaining is not None:
                remaining -= 1
listener.close()
