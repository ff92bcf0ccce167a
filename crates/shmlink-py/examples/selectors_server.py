"""One thread serves many connections with selectors. Usage:
python selectors_server.py shm:many [max-connections]"""
import selectors
import sys

import shmlink

sel = selectors.DefaultSelector()
listener = shmlink.listen(sys.argv[1])
listener.setblocking(False)
sel.register(listener, selectors.EVENT_READ)
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
            continue
        conn = key.fileobj
        while True:  # drain what is there: the fd is readable until we do
            try:
                conn.send(conn.recv())
            except BlockingIOError:
                break
            except (EOFError, ConnectionResetError):
                sel.unregister(conn)
                conn.close()
                if remaining is not None:
                    remaining -= 1
                break
listener.close()
