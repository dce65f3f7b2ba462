"""The harness's fork server (``monitor/harness/fork_server.py``): what its children must not share.

hivemind makes process-shared locks on import; forked from one process, every swarm process would
share them, and one killed while it held one would hang all the others (the whole swarm of a test
session stopped answering once, after a server was killed mid-call). Each child makes its own.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from monitor import compat  # noqa: F401
    from hivemind.utils.mpfuture import SharedBytes
    from monitor.harness import fork_server

    own_locks = sys.argv[1] == "own"
    holder = os.fork()
    if holder == 0:  # a sibling killed while it holds the lock
        if own_locks:
            fork_server._own_process_locks()
        SharedBytes._lock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(holder, 0)
    other = os.fork()
    if other == 0:  # another sibling's next shared byte (every MPFuture takes one)
        if own_locks:
            fork_server._own_process_locks()
        SharedBytes.next()
        os._exit(0)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        pid, status = os.waitpid(other, os.WNOHANG)
        if pid:
            print("answered")
            sys.exit(0)
        time.sleep(0.05)
    os.kill(other, signal.SIGKILL)
    os.waitpid(other, 0)
    print("hung")
""")


def run(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_child_killed_holding_hiveminds_lock_does_not_hang_its_siblings():
    assert run("own") == "answered"


def test_without_locks_of_their_own_siblings_would_hang():
    """(what the first spec guards against, shown to happen: the lock is shared across forks)"""
    assert run("shared") == "hung"
