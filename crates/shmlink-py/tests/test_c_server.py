"""A Python client to the C echo server (crates/shmlink-capi/examples/echo_server.c).

The command that runs the compiled server comes from SHMLINK_C_ECHO_SERVER (the
address is appended as its last argument); without it the test is skipped, and
scripts/python.sh records the skip in the skip log.
"""

import os
import shlex
import subprocess

import peers
from conftest import require

CMD = os.environ.get("SHMLINK_C_ECHO_SERVER")


def test_python_client_to_c_echo_server(addr):
    if not CMD:
        require("capi", "SHMLINK_C_ECHO_SERVER (the C echo server's command) is not set")
    server = subprocess.Popen(shlex.split(CMD) + [addr])
    try:
        with peers.connect_retry(addr, deadline=20) as conn:
            for n in [0, 1, 64, 65536, 1 << 20]:
                msg = os.urandom(n)
                conn.send(msg)
                assert conn.recv() == msg
        assert server.wait(20) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
