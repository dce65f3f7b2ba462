"""Make sure the DHT processes and p2pd daemons a process starts do not outlive it.

hivemind starts p2pd from the DHT's child process; if our process dies without calling
``DHT.shutdown()`` (SIGKILL, an uncaught error at exit), the daemon keeps running. A tiny watchdog
process holds the read end of a pipe from us: when we die, even by SIGKILL, the pipe closes and
the watchdog ends the daemons we registered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

_WATCHDOG = r"""
import os, signal, sys
pids = set()
for line in sys.stdin:
    pids.add(int(line))
for pid in pids:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
"""

_lock = threading.Lock()
_watchdog: subprocess.Popen | None = None
_owner_pid: int | None = None


def _ensure_watchdog() -> subprocess.Popen:
    global _watchdog, _owner_pid
    if _watchdog is None or _owner_pid != os.getpid() or _watchdog.poll() is not None:
        _watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True,
        )
        _owner_pid = os.getpid()
    return _watchdog


def guard(pids) -> None:
    """Kill these processes when the current process dies."""
    with _lock:
        pipe = _ensure_watchdog().stdin
        assert pipe is not None  # (the watchdog reads its stdin: started with a pipe)
        for pid in pids:
            pipe.write(f"{pid}\n")
        pipe.flush()


def guard_dht_daemons(dht) -> None:
    """Register a started hivemind DHT's child process (a fork that outlives a killed parent)
    and the p2pd daemons under it."""
    import psutil

    try:
        children = psutil.Process(dht.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return
    guard([dht.pid] + [child.pid for child in children if "p2pd" in child.name()])
