"""The examples of docs/python.md: each runs, and the docs show them verbatim."""

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
DOCS = HERE.parent.parent.parent / "docs" / "python.md"


def run(name, *args, timeout=60):
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], timeout=timeout,
                          check=True, capture_output=True, text=True).stdout


def test_echo_server_and_client(addr):
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "echo_server.py"), addr],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in server.stdout.readline()
        out = run("echo_client.py", addr)
        assert "into a buffer" in out and "'msgs_out': 4" in out
    finally:
        server.kill()
        server.wait(10)


def test_selectors_server(addr):
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "selectors_server.py"), addr, "3"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in server.stdout.readline()
        for _ in range(3):
            run("echo_client.py", addr)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_asyncio_echo(addr):
    assert "served 10 clients" in run("asyncio_echo.py", addr)


def test_pubsub(addr):
    assert "3 subscribers got 10000" in run("pubsub.py", addr)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_docs_show_the_example_verbatim(name):
    docs = DOCS.read_text()
    assert (EXAMPLES / name).read_text() in docs, f"docs/python.md does not show {name} as it is"
