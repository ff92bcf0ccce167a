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



def require(category, reason):
    """Skips the calling test, which needs `category` that this machine lacks for
    `reason` — or fails it when SHMLINK_REQUIRE names the category (or is `all`), as
    shmlink::testing::skip does for the Rust tests."""
    required = [r.strip() for r in os.environ.get("SHMLINK_REQUIRE", "").split(",")]
    if category in required or "all" in required:
        pytest.fail(f"needs {category}: {reason} (SHMLINK_REQUIRE={os.environ['SHMLINK_REQUIRE']} "
                    "makes that a failure)")
    pytest.skip(f"{reason} [{category}]")


def pytest_runtest_logreport(report):
    """Appends every skipped test to SHMLINK_SKIP_LOG (scripts/test.sh lists and counts
    them in its closing line), named `shmlink-py/pytest::NODEID`."""
    path = os.environ.get("SHMLINK_SKIP_LOG")
    if not path or not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ").replace("\n", " ")
    with open(path, "a") as log:
        log.write(f"SKIPPED shmlink-py/pytest::{report.nodeid}: {reason}\n")
