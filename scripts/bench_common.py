"""What every benchmark script shares: machine line, statistics, the BENCHMARKS.md table writer.

Benchmarks are scripts, not tests: each prints its figure and rewrites its own section of
BENCHMARKS.md (between ``<!-- bench:NAME -->`` markers), so the file always holds the latest run.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
for _path in (str(ROOT), str(SCRIPTS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from monitor.core import timefmt  # noqa: E402  (the checkout, on the path above)


def stamp() -> str:
    """Now, as a section of BENCHMARKS.md says when it was run (the pages' style: ``timefmt``)."""
    return timefmt.utc(time.time(), seconds=False)


def machine() -> str:
    """Cores, CPU model and load: figures are only comparable on the same machine and load."""
    load = os.getloadavg()[0]
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = os.cpu_count()
    busy = " (UNDER LOAD: other processes were busy)" if load > 0.5 * cores else ""
    return f"{cores} cores ({cpu}), load average {load:.1f} at start{busy}"


AT_START = machine()  # the machine and its load when the benchmark started (its section says so)


def wait(predicate, timeout: float, step: float = 0.2):
    """``predicate()``'s first true answer within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return None


def fmt(seconds) -> str:
    """Seconds as ``12.3 s``; ``—`` for None."""
    return "—" if seconds is None else f"{seconds:.1f} s"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def verdict(ok: bool) -> str:
    return "met" if ok else "**MISSED**"


def table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, markdown: str) -> None:
    """Replace this benchmark's section of BENCHMARKS.md (appended if it has none yet). The machine
    line is the one read when the script started (``AT_START``): at the end, the load average would
    be the benchmark's own."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n_Last run {stamp()}, {AT_START}._\n\n{markdown.strip()}\n{end}"
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(text)
    print(f"\nwrote the '{name}' section of {BENCHMARKS_MD}")


@contextlib.contextmanager
def bootstrap_peer() -> Iterator[list[str]]:
    """A bootstrap DHT peer on loopback (the swarm harness's); yields its multiaddrs."""
    from monitor.harness.local_swarm import LocalSwarm

    swarm = LocalSwarm(Path(os.devnull), "unused")  # only the bootstrap peer is started
    try:
        swarm.start_bootstrap()
        yield swarm.initial_peers
    finally:
        swarm.close()


def cached_history(db: Path, wanted: dict, generator, *, regenerate: bool) -> dict:
    """A generated history in the SQLite file ``db``, reused unless ``regenerate`` while its
    parameters (``wanted``, with its ``days`` and ``servers``) match those it was made with (kept
    beside it, ``db``.json); else made anew by ``generator(store).run(days, end=now)``. Returns
    its description."""
    import json

    from monitor.store import Store

    meta_path = db.with_suffix(".json")
    if not regenerate and db.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("params") == wanted:
            print(f"reusing the history in {db} (its last poll: {time.ctime(meta['end'])}; --regenerate for a new one)")
            return meta
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{db}")
    try:
        store.migrate()
        end = time.time()
        print(f"generating {wanted['days']:g} days × {wanted['servers']} servers of polls into {db} ...", flush=True)
        stats = generator(store).run(wanted["days"], end=end)
    finally:
        store.close()
    meta = {"params": wanted, "end": end, "generation": stats}
    meta_path.write_text(json.dumps(meta, indent=2))
    return meta


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def stop_on_sigterm() -> None:
    """SIGTERM (``kill PID`` of a benchmark) exits through the ``with`` blocks, so the processes a
    benchmark started are ended with it (the default action would end only the script)."""
    import signal
    import threading

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, stop)


@contextlib.contextmanager
def process(args: Sequence[str], log_path: Path, *, env: dict | None = None, cwd: Path | None = None) -> Iterator:
    """A command in its own session (in ``cwd``, the checkout by default), output to ``log_path``; on
    exit SIGTERM (60 s grace), then SIGKILL to its whole process group, so nothing it started
    outlives the benchmark."""
    import signal
    import subprocess

    stop_on_sigterm()
    log = open(log_path, "wb")
    proc = subprocess.Popen(list(args), env=env, cwd=cwd or ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def wait_http(base: str, proc, log_path: Path, timeout: float = 180.0) -> None:
    """Until ``base``/healthz answers; the process's log tail if it exits or never answers."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(base + "/healthz", timeout=5).read()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{base} did not answer /healthz; the log of {Path(proc.args[0]).name}:\n"
                                   + log_path.read_text(errors="replace")[-3000:]) from None
            time.sleep(0.5)


@contextlib.contextmanager
def simulator(initial_peers: Sequence[str], *, servers: int, models: int = 4, responders: int = 8, hung: int = 0,
              unreachable: float = 0.1, update_period: float = 60.0, timeout: float = 600.0) -> Iterator[dict]:
    """scripts/simulate_swarm.py in its own process (so its refreshes do not share our CPU time and
    GIL with what is measured); yields its ready file: summary, initial peers, peer ids by kind."""
    import json
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    ready = workdir / "ready.json"
    args = [sys.executable, str(SCRIPTS / "simulate_swarm.py"), "--servers", str(servers), "--models", str(models),
            "--responders", str(responders), "--hung", str(hung), "--unreachable", str(unreachable),
            "--update-period", str(update_period), "--ready-file", str(ready), "--initial-peers", *initial_peers]
    try:
        with process(args, workdir / "simulator.log") as proc:
            deadline = time.monotonic() + timeout
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (workdir / "simulator.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the simulator ({servers} servers) did not get ready; its log:\n{tail}")
                time.sleep(0.2)
            yield dict(json.loads(ready.read_text()), pid=proc.pid)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def peer_options(initial_peers: Sequence[str]) -> list[str]:
    """``--initial-peers`` once per peer, as swarm-monitor's CLI takes them."""
    return [arg for peer in initial_peers for arg in ("--initial-peers", peer)]


def gunicorn_args(port: int) -> list[str]:
    """The README's production line for the web app (gthread, 2 workers × 8 threads) on 127.0.0.1."""
    return [str(Path(sys.executable).parent / "gunicorn"), "--worker-class", "gthread", "--workers", "2",
            "--threads", "8", "--bind", f"127.0.0.1:{port}", "--log-level", "warning", "monitor.web.wsgi:app"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def service(initial_peers: Sequence[str], *, models: Sequence[str] = (), env: dict | None = None,
            timeout: float = 180.0, code: Path | None = None) -> Iterator[dict]:
    """``swarm-monitor serve`` in its own process with a fresh data dir on 127.0.0.1; yields
    {"base": URL, "pid": pid, "workdir": Path}. ``models``: PREFIX[:NUM_BLOCKS[:PATH]] options.
    ``code``: another checkout of the product to run (``checkout``: the code before a change, for a
    benchmark's side by side), on this checkout's environment."""
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="bench-service-"))
    port = free_port()
    command = [str(Path(sys.executable).parent / "swarm-monitor")] if code is None else \
        [sys.executable, "-c", "from monitor.app.cli import main; main()"]
    args = [*command, "serve", "--port", str(port), *peer_options(initial_peers)]
    for model in models:
        args += ["--model", model]
    full_env = dict(os.environ, SWARM_MONITOR_DATA_DIR=str(workdir), **(env or {}))
    if code is not None:
        full_env["PYTHONPATH"] = os.pathsep.join([str(code), str(code / "client")])
    base = f"http://127.0.0.1:{port}"
    try:
        with process(args, workdir / "service.log", env=full_env, cwd=code) as proc:
            wait_http(base, proc, workdir / "service.log", timeout)
            yield {"base": base, "pid": proc.pid, "workdir": workdir}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """The product at ``revision`` in a temporary git worktree (removed after): the code before a
    change, run beside the new one in one benchmark run."""
    import subprocess
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="bench-before-")) / "code"
    subprocess.run(["git", "worktree", "add", "--detach", str(where), revision], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, capture_output=True)


def stream_completion(base: str, model: str, prompt: str, max_tokens: int, timeout: float = 300.0, *,
                      chat: bool = False, sampling: dict | None = None) -> dict:
    """POST /v1/completions (``chat``: /v1/chat/completions, the prompt as the user's message, in the
    model's chat format) with stream=true; client-side time to first token and decode speed.

    ``sampling``: parameters beside greedy's ``temperature`` 0 (e.g. temperature and top_p).
    Returns {ok, error, ttft, tokens, tokens_per_s, elapsed, text, route (petals extension)}."""
    import json
    import urllib.error
    import urllib.request

    ask = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    body = json.dumps({"model": model, **ask, "max_tokens": max_tokens, "temperature": 0, **(sampling or {}),
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(base + ("/v1/chat/completions" if chat else "/v1/completions"), data=body,
                                     headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first = None
    text, usage, extension, error = "", None, None, None
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: "):]
                if payload == "[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    error = event["error"].get("message")
                    continue
                for choice in event.get("choices") or ():
                    piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if piece:
                        now = time.perf_counter()
                        first = first or now
                        text += piece
                if event.get("petals"):  # every chunk carries the session's handle; the last one the figures too
                    extension = {**(extension or {}), **event["petals"]}
                usage = event.get("usage") or usage
    except urllib.error.HTTPError as e:
        error = f"HTTP {e.code}: {e.read()[:300]!r}"
    except OSError as e:
        error = repr(e)
    elapsed = time.perf_counter() - started
    tokens = (usage or {}).get("completion_tokens", 0)
    return {
        "ok": error is None and tokens > 0, "error": error, "ttft": (first - started) if first else None,
        "tokens": tokens, "elapsed": elapsed,
        "tokens_per_s": (tokens - 1) / (elapsed - (first - started)) if first and tokens > 1 else None,
        "text": text, "petals": extension,
    }


def run_and_exit(main) -> None:
    """Run a script's ``main`` and leave with its exit code through ``os._exit``: petals'
    ``_ServerInferenceSession.__del__`` can block interpreter exit on an RPC to a server that is
    gone; everything the script started is stopped by then."""
    code = 0
    try:
        main()
    except SystemExit as exit_:  # --help, argparse errors: their own message and code
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported, then the exit below
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class TokenTimes:
    """A transformers streamer for ``generate(streamer=...)`` that notes when each generated token
    arrives (``times``; the first ``put`` is the prompt), and calls ``on_token`` for each."""

    def __init__(self, on_token=None):
        self.times: list[float] = []
        self._calls = 0
        self._on_token = on_token

    def put(self, value) -> None:
        self._calls += 1
        if self._calls > 1:
            self.times.append(time.perf_counter())
            if self._on_token is not None:
                self._on_token()

    def end(self) -> None:
        pass
