"""Shared pytest configuration for the monarch test suite.

Leak check: every test must leave no child process behind. The autouse fixture
``_no_leaked_child_processes`` snapshots the descendants of the pytest process before each
test and, after it, gives new descendants a grace period to exit; whatever is still
running is killed and the test errors with the pids and command lines involved. Zombies
(exited but not yet waited for) count as exited; those that are our direct children are
reaped so they do not pile up.

Thread check: a test must not leave a non-daemon thread running either (it would keep the
interpreter, and so CI, from ever exiting). ``_no_leaked_threads`` fails such a test; if
one is still alive when pytest is done, ``pytest_unconfigure`` reports it and exits the
process instead of hanging.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest_plugins = ["pytester"]

#: The suite imports torch (tests/rdma, tests/tensor) and spawns procs in most of its
#: tests, each time from a new fork-server template: preloading torch into every one
#: (what a program that imported torch gets by default) would cost seconds of CPU per
#: template. The tests that need torch in their procs ask for it (tests/tensor), and
#: scripts run as users run them (the docs tests) drop this variable.
os.environ.setdefault("MONARCH_SPAWN_FORK_SERVER_PRELOAD", "none")


def pytest_configure(config: pytest.Config) -> None:
    """Stop early, with the fix, when the extension module is not built."""
    try:
        import monarch._rust_bindings  # noqa: F401
    except ImportError as e:
        raise pytest.UsageError(
            f"cannot import monarch._rust_bindings ({e}); build it into this interpreter "
            "first: `make install` (release) or `make build-dev` (debug), then run the "
            "tests with .venv/bin/python -m pytest"
        ) from e


#: Directories whose tests share machine-wide set-ups (simulated hosts in network
#: namespaces, a Slurm cluster on them, a headless browser): under pytest-xdist each
#: of these groups runs in one worker, one test after another.
_SHARED_SETUP_GROUPS = {
    "multihost": "netns",
    "kubernetes": "netns",
    "slurm": "netns",
    "browser": "browser",
}


def _work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to under ``pytest -n N --dist loadgroup``: its
    file (so a module's fixtures are set up once), or its directory's group in
    :data:`_SHARED_SETUP_GROUPS`."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if "tests" in parts[:-1]:
        sub = parts[parts.index("tests") + 1 :]
        if len(sub) > 1 and sub[0] in _SHARED_SETUP_GROUPS:
            return _SHARED_SETUP_GROUPS[sub[0]]
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (what ``make test`` runs) hands out the work units of
    :func:`_work_unit`, the largest first. (pytest-xdist's own loadgroup reads
    ``xdist_group`` marks through the test ids, which pytest 9.2 no longer lets it
    change; this asks nothing of them.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    return _SharedSetupScheduling(config, log)


_EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Never hang at exit on a leaked non-daemon thread: report it and leave."""
    stuck = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    for t in stuck:
        t.join(LEAK_GRACE_SECONDS)
    stuck = [t for t in stuck if t.is_alive()]
    if stuck:
        names = ", ".join(t.name for t in stuck)
        print(
            f"\nconftest: non-daemon thread(s) still running after the session: {names};"
            " exiting without waiting for them",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash.get(_EXIT_STATUS, 1) or 1)


#: How long new descendants get to exit after a test before they count as leaked.
LEAK_GRACE_SECONDS = 5.0
#: How often the leak check polls /proc during the grace period.
LEAK_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class _Proc:
    """One process as read from ``/proc/<pid>/stat``."""

    pid: int
    ppid: int
    state: str
    #: Start time in clock ticks since boot; with the pid, identifies the process even if
    #: the pid is reused.
    start: int


def _read_stat(pid: int) -> _Proc | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:  # exited, or not ours to read
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces and
    # parentheses: split after the last ")".
    fields = data[data.rindex(")") + 2 :].split()
    return _Proc(pid=pid, ppid=int(fields[1]), state=fields[0], start=int(fields[19]))


def _descendants(root: int) -> dict[int, _Proc]:
    """Return every live process under ``root`` (not ``root`` itself), by pid."""
    children: dict[int, list[_Proc]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _read_stat(int(entry))) is not None:
            children.setdefault(proc.ppid, []).append(proc)
    found: dict[int, _Proc] = {}
    stack = [root]
    while stack:
        for proc in children.get(stack.pop(), []):
            found[proc.pid] = proc
            stack.append(proc.pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def _reap_zombie_children(procs: dict[int, _Proc]) -> None:
    me = os.getpid()
    for proc in procs.values():
        if proc.state == "Z" and proc.ppid == me:
            try:
                os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:  # already reaped, e.g. by its Popen
                pass


def _new_live(before: dict[int, _Proc]) -> dict[int, _Proc]:
    """Descendants that did not exist before the test and have not exited."""
    now = _descendants(os.getpid())
    _reap_zombie_children(now)
    return {
        pid: proc
        for pid, proc in now.items()
        if proc.state != "Z" and (pid not in before or before[pid].start != proc.start)
    }


@pytest.fixture(autouse=True)
def _no_leaked_child_processes() -> Iterator[None]:
    """Fail the test if it leaves a child (or any descendant) process running."""
    before = _descendants(os.getpid())
    yield
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    leaked = _new_live(before)
    while leaked and time.monotonic() < deadline:
        time.sleep(LEAK_POLL_SECONDS)  # polling /proc for exits; nothing to wait on
        leaked = _new_live(before)
    if not leaked:
        return
    report = [f"  pid {pid}: {_cmdline(pid)}" for pid in sorted(leaked)]
    for pid, proc in leaked.items():
        current = _read_stat(pid)
        if current is not None and current.start == proc.start:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # Reap what we killed, so it does not show up as a zombie in the next test.
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    while _new_live(before) and time.monotonic() < deadline:
        time.sleep(LEAK_POLL_SECONDS)
    _reap_zombie_children(_descendants(os.getpid()))
    pytest.fail(
        f"test leaked {len(leaked)} child process(es), still running "
        f"{LEAK_GRACE_SECONDS:g} s after it ended (now killed):\n"
        + "\n".join(report)
        + "\nwait for every process a test starts (Popen.wait(), a context manager, "
        "or a fixture that stops it)",
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    """Fail the test if it leaves a non-daemon thread running."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    leaked = []
    for t in threading.enumerate():
        if t in before or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            leaked.append(t)
    if leaked:
        pytest.fail(
            f"test left {len(leaked)} non-daemon thread(s) running "
            f"{LEAK_GRACE_SECONDS:g} s after it ended: "
            + ", ".join(t.name for t in leaked)
            + "\njoin every thread a test starts, or make it a daemon thread",
            pytrace=False,
        )
