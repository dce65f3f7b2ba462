"""Start the swarm's processes by forking one that has already imported petals.

Every bootstrap peer and petals server the harness starts is a process of its own
(``monitor.harness.server_process``), and a fresh Python process spends about 4 CPU-seconds
importing torch, transformers, hivemind and petals before it does anything: the test suite starts
about a hundred of them, the demo four. The fork server pays that once per harness process: it
imports them, then forks a child for each process asked for. The child is what
``python -m monitor.harness.server_process ARGS`` would be — ``server_process.main(ARGS)`` in a
session of its own (its process group is ended together, p2pd included), its output appended to its
log, SIGINT raising KeyboardInterrupt — and it shares the imported code with its siblings
copy-on-write.

A child also makes its own process-shared locks, which hivemind creates on import
(``_own_process_locks``): shared among siblings, one killed while holding one would hang the rest.

Forking is safe only while the forking process has a single thread. The fork server counts its
threads (``/proc/self/task``) after its imports and refuses to fork otherwise (numpy's OpenBLAS
starts a pool unless ``OMP_NUM_THREADS=1``, which the harness sets); it never starts a thread
itself (it reaps its children and watches its parent from its one select loop). When it cannot
run, the harness starts each process with ``subprocess`` as before (``SWARM_FORK_SERVER=0`` asks
for that).

The protocol is one JSON line each way on the fork server's stdin and stdout: ``{"argv": [...],
"log": path, "exit": path}`` → ``{"pid": N}``. When a child ends, the fork server writes its
return code (subprocess's convention: ``-N`` for signal N) to its ``exit`` file. When the harness
goes away (its end of the pipe closes, or the fork server is orphaned), the fork server kills every
child's process group it started and exits.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

DISABLE = "SWARM_FORK_SERVER"  # set to 0: start every swarm process with subprocess
READY_TIMEOUT = 180.0  # seconds the imports may take on a loaded machine
REAP_EVERY = 0.2  # seconds between the fork server's looks for ended children and a gone parent


# ---- the fork server's side --------------------------------------------------------------------


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no procfs: cannot prove it is safe
        return -1


def _preload() -> None:
    from monitor import compat  # noqa: F401  (must precede petals)
    import petals.cli.run_dht  # noqa: F401
    import petals.models  # noqa: F401  (every family's block classes)
    import petals.server.reachability  # noqa: F401
    import petals.server.server  # noqa: F401
    import petals.utils.peft  # noqa: F401  (and bitsandbytes: each server's first block imports them)

    import monitor.harness.server_process  # noqa: F401


def _run_child(request: dict) -> None:
    """In the forked child: become what ``python -m monitor.harness.server_process`` would be."""
    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        try:
            import numpy

            numpy.random.seed()  # siblings would share the fork server's state
        except ImportError:
            pass
        _own_process_locks()
        from monitor.harness import server_process

        sys.argv = ["server_process", *request["argv"]]
        try:
            server_process.main(request["argv"])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - the child's end is reported in its log and exit code
            import traceback

            traceback.print_exc()
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _own_process_locks() -> None:
    """hivemind makes process-shared locks when it is imported (MPFuture's and SharedBytes', the
    async executor's): in the fork server's children they would be one lock for every sibling, and a
    sibling killed while it held one (kill -9, a swarm's teardown) would hang every other one's next
    DHT call for good. Each child makes its own, as a process that imported hivemind itself has."""
    import multiprocessing as mp

    from hivemind.utils.asyncio import _AsyncContextWrapper
    from hivemind.utils.mpfuture import MPFuture

    MPFuture.reset_backend()  # hivemind's own: MPFuture's two locks and SharedBytes'
    _AsyncContextWrapper.EXECUTOR_LOCK = mp.Lock()


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = children.pop(pid, None)
        if path:
            tmp = f"{path}.tmp"
            Path(tmp).write_text(str(os.waitstatus_to_exitcode(status)))
            os.replace(tmp, path)


def serve() -> None:
    """The fork server's loop (``python -m monitor.harness.fork_server``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness ends it, by closing the pipe
    requests = sys.stdin.buffer
    replies = os.fdopen(os.dup(1), "w")  # the harness reads replies only: what is printed goes to stderr
    sys.stdout.flush()
    os.dup2(2, 1)  # (bitsandbytes prints a line to stdout when it is imported)
    parent = os.getppid()

    def reply(payload: dict) -> None:
        replies.write(json.dumps(payload) + "\n")
        replies.flush()

    _preload()
    threads = _threads()
    reply({"ready": threads == 1, "threads": threads})
    if threads != 1:
        return
    children: dict[int, str] = {}
    try:
        while True:
            readable, _, _ = select.select([requests], [], [], REAP_EVERY)
            _reap(children)
            if os.getppid() != parent:
                return
            if not readable:
                continue
            line = requests.readline()
            if not line:
                return
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(replies.fileno())  # the fork server's end of the harness's pipe is not the child's
                _run_child(request)
            children[pid] = request["exit"]
            reply({"pid": pid})
    finally:
        for pid in list(children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 10
        while children and time.monotonic() < deadline:
            _reap(children)
            time.sleep(0.05)


# ---- the harness's side ------------------------------------------------------------------------


class ForkedProcess:
    """A child of the fork server, as much of ``subprocess.Popen`` as the harness uses."""

    def __init__(self, pid: int, args: list[str], exit_path: Path, server: subprocess.Popen):
        self.pid = pid
        self.args = args
        self.returncode: Optional[int] = None
        self._exit_path = exit_path
        self._server = server

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                self.returncode = int(self._exit_path.read_text())
            except (OSError, ValueError):
                # an ended child is a zombie until its fork server reaps it (within REAP_EVERY) and
                # writes its code; with the fork server gone nobody will: it was killed with it
                if self._server.poll() is not None and not _exists(self.pid):
                    self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ForkServer:
    """One per harness process, started on first use (``spawn``) and ended by ``shutdown`` or at exit."""

    def __init__(self):
        self._lock = threading.Lock()
        self._popen: Optional[subprocess.Popen] = None
        self._usable: Optional[bool] = None
        self._log: Optional[Path] = None

    def spawn(self, argv: list[str], log_path: Path, env: dict) -> Optional[ForkedProcess]:
        """Fork ``server_process.main(argv)``; None when the fork server cannot be used (the
        caller starts the process with subprocess)."""
        with self._lock:
            if not self._start(env):
                return None
            exit_path = Path(f"{log_path}.exit")
            exit_path.unlink(missing_ok=True)
            try:
                self._popen.stdin.write((json.dumps({"argv": argv, "log": str(log_path),
                                                     "exit": str(exit_path)}) + "\n").encode())
                self._popen.stdin.flush()
                answer = json.loads(self._popen.stdout.readline() or "{}")
            except (OSError, ValueError):
                answer = {}
            if "pid" not in answer:
                self._usable = False  # it died: the rest start with subprocess
                return None
            return ForkedProcess(answer["pid"], argv, exit_path, self._popen)

    def _start(self, env: dict) -> bool:
        if self._usable is not None:
            return self._usable
        self._usable = False
        if env.get(DISABLE, "1") == "0" or not Path("/proc/self/task").is_dir():
            return False
        import tempfile

        fd, log = tempfile.mkstemp(prefix="swarm-fork-server-", suffix=".log")
        self._log = Path(log)
        self._popen = subprocess.Popen(
            [sys.executable, "-m", "monitor.harness.fork_server"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=fd, env=env, start_new_session=True,
        )
        os.close(fd)
        atexit.register(self.shutdown)
        readable, _, _ = select.select([self._popen.stdout], [], [], READY_TIMEOUT)
        try:
            hello = json.loads(self._popen.stdout.readline() or "{}") if readable else {}
        except ValueError:
            hello = {}
        self._usable = bool(hello.get("ready"))
        if self._usable:  # it is up: what it might still print is of no use, and no file is left behind
            self._log.unlink(missing_ok=True)
            self._log = None
        else:
            why = (f"it has {hello['threads']} threads after its imports" if "threads" in hello
                   else f"it did not start: {self._log.read_text(errors='replace')[-500:]}")
            print(f"swarm harness: not forking swarm processes ({why}); starting each with subprocess",
                  file=sys.stderr)
            self._stop()
        return self._usable

    def shutdown(self) -> None:
        """End the fork server (and whatever children it still has); the next spawn starts one anew."""
        with self._lock:
            self._stop()
            self._usable = None

    def _stop(self) -> None:
        if self._popen is None:
            return
        try:
            self._popen.stdin.close()
            self._popen.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self._popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._popen.wait(timeout=10)
        self._popen.stdout.close()
        self._popen = None
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None


FORK_SERVER = ForkServer()


if __name__ == "__main__":
    serve()
    # its children are reaped and its replies sent: an interpreter's teardown with torch and petals
    # loaded would only keep the harness waiting (a second or more, at every shutdown)
    sys.stderr.flush()
    os._exit(0)
