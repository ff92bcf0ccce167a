"""Shared fixtures: a private rendezvous directory and unique addresses."""

import itertools
import os
import shutil
import tempfile

import pytest

# Every process of the test run (spawned peers inherit the environment) meets in one
# private rendezvous directory, removed at the end.
_DIR = tempfile.mkdtemp(prefix="shmlink-pytest-")
os.chmod(_DIR, 0o700)
os.environ["SHMLINK_DIR"] = _DIR
_counter = itertools.count()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_DIR, ignore_errors=True)


@pytest.fixture
def addr(request):
    """A fresh ``shm:`` address for one test."""
    return f"shm:{request.node.name[:40]}-{os.getpid()}-{next(_counter)}"

