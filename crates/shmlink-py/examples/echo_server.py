"""Echo server: one thread per connection. Usage: python echo_server.py shm:echo"""
import sys
import threading

import shmlink


def serve(conn):
    with conn:
        try:
            for msg in conn:  # until the client closes (EOFError ends the loop)
                conn.send(msg)
        except ConnectionResetError:
            pass  # the client died


with shmlink.listen(sys.argv[1]) as listener:
    print("listening on", listener.local_addr, flush=True)
    while True:
        conn = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
