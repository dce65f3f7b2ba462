"""Make petals 2.2 import on hivemind 1.1.12, and fail at once where a dead server closed a stream.

petals 2.2 imports names such as ``hivemind.PeerID`` and ``hivemind.get_logger`` that hivemind
1.1.12 no longer re-exports at the top level. Copying the public names of the submodules back
onto the package is enough; nothing else differs for what petals uses. Import this module before
petals, in every process (our own and every petals server we start). ``import_petals()`` is the
one import path for petals in this codebase.

Two behaviours are mended. First (``_close_server_sessions_without_deadlock``): petals closes an
inference session's stream to a server in ``__del__`` by running a coroutine on hivemind's
``RemoteExpertWorker`` thread and waiting for it; when Python's cycle collector happens to run on that
very thread, the thread waits on itself forever and every chat in the process stops (seen about once
in 5–10 spec swarms under load). And a close that raised (``BrokenPipeError`` from a dead server)
left the session marked open, to be closed again by ``__del__``. Now a close on the worker's own
thread is scheduled there instead of awaited, and a session is marked closed whatever its close
raised. Second (``_end_streams_when_the_connection_closes``): when a server dies in the
middle of a streaming call (an inference session: the chat, a generation check, a speed probe),
its connection closes, but hivemind's client side of the stream then waits for its own writer,
which waits for the caller's next request, which petals sends only once this step is answered.
The step hung until petals' ``request_timeout`` (60 s in the chat) before petals tried another
server; now it fails as soon as the connection is gone, and petals moves on at once.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import pkgutil
import threading
import warnings
from contextlib import closing

# transformers 4.34 uses a torch API that torch 2.13 deprecates; the warning is noise here.
warnings.filterwarnings("ignore", message=r".*_register_pytree_node.*", category=FutureWarning)

import hivemind  # noqa: E402,F401  (its import installs its logging handler, which monitor.logs then formats)

from monitor import logs  # noqa: E402

logs.format_hivemind()  # (JSON logs: hivemind's handler, which petals puts on the root logger, writes JSON too)

_SOURCES = ("hivemind.p2p", "hivemind.compression", "hivemind.dht", "hivemind.moe")


def _public_names(module):
    names = getattr(module, "__all__", None)
    return names if names is not None else [n for n in vars(module) if not n.startswith("_")]


def _restore_top_level_names() -> None:
    import hivemind.utils

    modules = [importlib.import_module(name) for name in _SOURCES]
    modules.append(hivemind.utils)
    for info in pkgutil.iter_modules(hivemind.utils.__path__, "hivemind.utils."):
        modules.append(importlib.import_module(info.name))
    for module in modules:
        for name in _public_names(module):
            if not hasattr(hivemind, name) and hasattr(module, name):
                setattr(hivemind, name, getattr(module, name))


def _quiet_petals_startup() -> None:
    # petals checks PyPI for a newer version on import of its server CLI and asks the hub for
    # model metadata: nothing may leave loopback, and no hub is reachable here.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("BITSANDBYTES_NOWELCOME", "1")


def _end_streams_when_the_connection_closes() -> None:
    """hivemind's ``P2P._iterate_protobuf_stream_handler`` as in 1.1.12, but when the connection
    closes while its writer waits for the caller's next request (the other side is gone, and the
    caller sends that request only after an answer), the writer is ended and the read raises
    ``ConnectionResetError`` instead of waiting for it. A writer still sending, or done (a stream
    the other side ends after the last request, as petals' close does), is awaited as before, and
    every error is as before."""
    from hivemind.p2p import P2P, P2PHandlerError

    async def _iterate_protobuf_stream_handler(self, peer_id, name, requests, output_protobuf_type):
        _, reader, writer = await self.call_binary_stream_handler(peer_id, name)
        awaiting_request = False  # the writer is suspended waiting for the caller's next request

        async def write_to_stream() -> None:
            nonlocal awaiting_request
            pending = requests.__aiter__()
            while True:
                awaiting_request = True
                try:
                    request = await pending.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    awaiting_request = False
                await P2P.send_protobuf(request, writer)
            await P2P.send_protobuf(P2P.END_OF_STREAM, writer)

        async def read_from_stream():
            with closing(writer):
                try:
                    while True:
                        try:
                            response, err = await P2P.receive_protobuf(output_protobuf_type, reader)
                        except asyncio.IncompleteReadError:  # the connection is closed
                            break
                        if err is not None:
                            raise P2PHandlerError(f"Failed to call handler `{name}` at {peer_id}: {err.message}")
                        yield response
                    if awaiting_request:  # (then its task is suspended, not done: the flag is reset on every way out)
                        raise ConnectionResetError(f"{peer_id} closed the stream of `{name}` before the call ended")
                    await writing_task
                finally:
                    writing_task.cancel()

        writing_task = asyncio.create_task(write_to_stream())
        return read_from_stream()

    P2P._iterate_protobuf_stream_handler = _iterate_protobuf_stream_handler


def _close_server_sessions_without_deadlock() -> None:
    """petals' ``_ServerInferenceSession.close`` as in 2.2, but never blocking the worker thread on
    itself, and marking the session closed even when closing its stream fails."""
    from hivemind.moe.client.remote_expert_worker import RemoteExpertWorker
    from petals.client.inference_session import _ServerInferenceSession

    def close(self):
        if self._outputs_stream is None or getattr(self, "_closing", False):
            return  # already closed, or being closed on the worker's loop

        def forget(*_) -> None:
            self._outputs_stream = self._inputs_queue = None
            self.closed = True

        worker = RemoteExpertWorker._event_loop_fut
        worker_loop = worker.result() if worker is not None and worker.done() and not worker.exception() else None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is worker_loop:  # (the collector, on the worker's thread)
            self._closing = True
            running.create_task(self._aclose_stream()).add_done_callback(forget)
            return
        try:
            RemoteExpertWorker.run_coroutine(self._aclose_stream())
        finally:
            forget()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise; the stream is gone with its server
            pass

    _ServerInferenceSession.close = close
    _ServerInferenceSession.__del__ = __del__


_quiet_petals_startup()
_restore_top_level_names()
_end_streams_when_the_connection_closes()


# Building a model (petals' client model, a server block, transformers' ``from_pretrained`` with
# ``low_cpu_mem_usage``) goes through accelerate's ``init_empty_weights``, which swaps
# ``torch.nn.Module.register_parameter`` for the whole process and swaps it back on exit: two
# threads building at once can leave it swapped for good, and every module built afterwards has
# its weights on the meta device (a chat that answers garbage, a reference that cannot compute).
# Whoever builds a model in a process that may build another at the same time holds this lock.
MODEL_BUILD_LOCK = threading.RLock()


def import_petals():
    """Return the petals package, imported after the compat shims are in place."""
    import petals

    _mend_petals()
    return petals


_mended = False


def _mend_petals() -> None:
    global _mended
    if not _mended:
        _close_server_sessions_without_deadlock()
        _mended = True
