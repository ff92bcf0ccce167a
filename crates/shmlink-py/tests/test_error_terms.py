"""Errors name what a Python caller can change as Python keywords and calls, never the
Rust API's Options::… or Subscriber::connect; SHMLINK_LOG prints the library's events."""

import os
import subprocess
import sys
import tempfile

import pytest

import shmlink


def test_a_shared_directory_is_named_by_its_keyword(monkeypatch):
    with tempfile.TemporaryDirectory(prefix="shmlink-py-terms-") as d:
        os.chmod(d, 0o777)
        monkeypatch.setenv("SHMLINK_DIR", d)
        with pytest.raises(PermissionError) as err:
            shmlink.listen("shm:terms")
        msg = str(err.value)
        assert "shared_rendezvous_dir=True" in msg, msg
        assert "Options::" not in msg, msg


def test_a_plain_connect_to_a_topic_is_told_to_subscribe(addr):
    with shmlink.Publisher(addr):
        with pytest.raises(OSError) as err:
            shmlink.connect(addr, connect_timeout=5)
        msg = str(err.value)
        assert "shmlink.Subscriber(addr)" in msg, msg
        assert "::" not in msg, msg


_REFUSED = """
import shmlink, sys
addr = sys.argv[1]
with shmlink.Publisher(addr):
    try:
        shmlink.connect(addr, connect_timeout=5)
    except OSError as e:
        print("client saw:", e)
    else:
        sys.exit("a plain connect to a topic succeeded")
"""


def test_shmlink_log_prints_refusal_reasons_on_stderr(addr):
    # SHMLINK_LOG is read when the module is imported: a fresh interpreter.
    env = dict(os.environ, SHMLINK_LOG="info")
    out = subprocess.run([sys.executable, "-c", _REFUSED, addr], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    refused = [l for l in out.stderr.splitlines() if "shmlink: subscriber refused" in l]
    assert refused and "reason=" in refused[0], out.stderr
    # Without it, nothing.
    env.pop("SHMLINK_LOG")
    out = subprocess.run([sys.executable, "-c", _REFUSED, addr], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "refused" not in out.stderr, out.stderr
