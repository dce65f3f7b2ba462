"""Speed probes at the DHT edge: a few real tokens through one server's span, timed, as a petals
client runs them (``petals.client.inference_session._ServerInferenceSession``).

What a server *announces* about its speed is untrusted and often stale; what chat traffic measured
exists only for the servers chats happened to use. A probe opens an inference session on a span,
sends a prefill, a few one-token steps and a few empty steps (see ``monitor.core.probes``),
and times each. The input's shape and dtype come from the server's own ``rpc_info`` for the span's
first block (its ``inference_schema``), so no model config is needed; a caller that has a trusted
input for the span (``monitor.swarm.correctness``) passes it instead, and gets the outputs back.

The sessions run in this process, on the monitor's DHT daemon through a P2P *replica* owned by a
``ProbeLoop`` (its own event loop thread), as petals' client does: tensors never cross hivemind's
command pipe, and the DHT process only answers one tiny call (its daemon's address). Everything a
server sends back is untrusted and checked (schema sizes bounded, outputs of the input's shape,
finite).

A probe that fails says why (``ServerProbe.error_kind``): ``SERVER_ERROR`` when the server answered
with an error of its own (its handler raised, it refused the session, or it sent something
unusable; ``error`` is then the server's own message), ``BUSY`` when its attention cache had no room
for the probe's session (it serves others), ``TIMEOUT`` when it did not answer in time,
``CLIENT_ERROR`` when the probe could not run (no connection, our own failure).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from monitor import compat  # noqa: F401  (before petals)
from monitor.core.common import cache_full, remote_error, short_error
from monitor.core.compute_checks import ComputeCheck
from monitor.core.probes import (
    BUSY,
    CLIENT_ERROR,
    DECODE_STEPS,
    EMPTY_STEPS,
    PREFILL_TOKENS,
    SERVER_ERROR,
    STEP_GAP,
    TIMEOUT,
    ServerProbe,
)
from monitor.swarm.announce import MAX_RAW_TEXT_CHARS, clean_text
from monitor.swarm.client import submit

log = logging.getLogger(__name__)

MAX_HIDDEN_SIZE = 65_536  # larger than any petals model's hidden size: a bogus schema
INPUT_SEED = 1_234  # the default probe input: the same for every server, so outputs can be compared
INPUT_STD = 1.0


@dataclass(frozen=True)
class SpanTarget:
    """One span to probe: ``inputs`` (1, tokens, hidden), or None for the default random input;
    ``keep_outputs``: return the span's outputs (for a correctness check)."""

    peer_id: str
    model: str
    start: int
    end: int
    inputs: Any = None  # a torch.Tensor (torch is imported where a probe runs)
    keep_outputs: bool = False

    @property
    def uids(self) -> list[str]:
        return [f"{self.model}.{index}" for index in range(self.start, self.end)]


@dataclass(frozen=True)
class SpanResult:
    """A probe's measurements (``probe``) and, if asked for, the span's outputs."""

    probe: ServerProbe
    outputs: Optional[object] = None  # torch.Tensor (1, tokens, hidden), float32
    torch_dtype: Optional[str] = None  # what the server computes in, from its schema


@dataclass(frozen=True)
class ForwardTarget:
    """One compute check: one token through block ``block`` of ``model`` on ``peer_id``."""

    peer_id: str
    model: str
    block: int
    requested_by: Optional[str] = None

    @property
    def uid(self) -> str:
        return f"{self.model}.{self.block}"


class ProbeError(RuntimeError):
    """The span could not be probed; the message says what failed (short, safe to show). Raised
    for what the server answered (an unusable schema or output): ``kind`` is the server's fault."""

    kind = SERVER_ERROR


def failure_kind(error: BaseException) -> tuple[str, str]:
    """(``error_kind``, text) of a failed probe: the server's own message when its handler raised
    (hivemind's ``P2PHandlerError``), a timeout, an unusable answer, or our own failure."""
    from hivemind.p2p import P2PHandlerError

    if isinstance(error, asyncio.TimeoutError):
        return TIMEOUT, short_error(error)
    if isinstance(error, ProbeError):
        return error.kind, str(error)
    if isinstance(error, P2PHandlerError):  # a stream's error names the handler, a unary call's is a repr
        if cache_full(error):
            return BUSY, remote_error(error) or short_error(_unrepr(str(error)))
        return SERVER_ERROR, remote_error(error) or short_error(_unrepr(str(error)))
    return CLIENT_ERROR, short_error(error)


_REPR = re.compile(r"""^\s*[A-Za-z_][\w.]*\((['"])(.*)\1\)\s*$""", re.S)


def _unrepr(text: str) -> str:
    """``RuntimeError('CUDA error: …')`` (how a unary call's failure reaches us) -> ``CUDA error: …``."""
    found = _REPR.match(text)
    return found.group(2) if found else text


def default_input(hidden_size: int, tokens: int = PREFILL_TOKENS + DECODE_STEPS, seed: int = INPUT_SEED):
    """The fixed random input every server of a model gets when there is no reference: seeded,
    so servers of the same blocks can be compared with one another."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, tokens, hidden_size, generator=generator) * INPUT_STD


class ProbeLoop:
    """An event loop thread with a P2P replica of the monitor's DHT daemon, for probe sessions.

    The first ``probe`` asks the DHT process for its daemon's address (one tiny ``run_coroutine``)
    and connects; ``reset()`` drops the connection (the next probe connects again); ``close()``
    disconnects and stops the thread."""

    def __init__(self, dht, *, concurrency: int = 2):
        self.dht = dht
        self.concurrency = concurrency
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="server-probes", daemon=True)
        self._thread.start()
        self._p2p = None
        self._semaphore: Optional[asyncio.Semaphore] = None
        self._lock = threading.Lock()
        self._schemas: dict = {}  # (peer, uid) -> (schema, when read): the compute checks' rpc_info, reused

    def _call(self, coroutine, timeout: float):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def p2p(self):
        """The replica, connected on first use (and again after ``reset``)."""
        with self._lock:
            if self._p2p is None:
                future = submit(self.dht, _daemon_address)
                address = future.result(30)
                self._p2p = self._call(_replicate(address), 30)
                self._semaphore = self._call(_make_semaphore(self.concurrency), 5)
            return self._p2p

    def reset(self) -> None:
        """Drop the replica (e.g. the daemon restarted); the next probe connects again."""
        with self._lock:
            holder, self._p2p = [self._p2p], None
        if holder[0] is not None:
            try:
                self._call(_close_replica(holder), 10)
            except Exception as e:  # noqa: BLE001 - it is being dropped anyway
                log.debug("closing the probe P2P replica failed: %r", e)

    def probe(self, targets: Sequence[SpanTarget], *, timeout: float) -> list[SpanResult]:
        """Probe every target, at most ``concurrency`` at once; a failure costs its own target."""
        # each session is bounded by its timeout per step; waiting for its turn by the others'
        per_session = timeout * (3 + DECODE_STEPS + EMPTY_STEPS) + STEP_GAP * (DECODE_STEPS + EMPTY_STEPS)
        return self._run_all(targets, lambda p2p, semaphore, target: _probe_one(p2p, semaphore, target, timeout),
                             per_session, 30,
                             lambda target, e: _failed(target, time.time(), None,
                                                       f"probe did not finish: {short_error(e)}", TIMEOUT))

    def forward_checks(self, targets: Sequence[ForwardTarget], *, timeout: float) -> list[ComputeCheck]:
        """A compute check of every target (one token through one block, ``rpc_forward``), at most
        ``concurrency`` at once; each bounded by ``timeout`` (its rpc_info and its forward step)."""
        return self._run_all(targets, lambda p2p, semaphore, target: _forward_one(p2p, semaphore, target, timeout,
                                                                                  self._schemas),
                             2 * timeout, 10,
                             lambda target, e: _check_failed(target, time.time(), None,
                                                             f"check did not finish: {short_error(e)}", TIMEOUT))

    def _run_all(self, targets: Sequence, coroutine, each: float, slack: float, failed) -> list:
        """``coroutine(p2p, semaphore, target)`` for every target on the loop, at most ``concurrency``
        at once, all within ``each`` seconds per turn plus ``slack``; one that does not finish (or
        that the loop failed) becomes ``failed(target, error)`` and costs only itself."""
        if not targets:
            return []
        p2p = self.p2p()
        semaphore = self._semaphore
        futures = [asyncio.run_coroutine_threadsafe(coroutine(p2p, semaphore, target), self._loop) for target in targets]
        deadline = time.monotonic() + each * (1 + len(targets) / max(1, self.concurrency)) + slack
        results = []
        for target, future in zip(targets, futures):
            try:
                results.append(future.result(max(0.0, deadline - time.monotonic())))
            except Exception as e:  # noqa: BLE001 - a timeout, or the loop failed this one
                future.cancel()
                results.append(failed(target, e))
        return results

    def close(self) -> None:
        self.reset()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


# ---- coroutines -------------------------------------------------------------------------------


async def _daemon_address(dht, node):
    """(runs in the DHT process) the daemon's listen multiaddr: a few bytes each way."""
    return node.p2p.daemon_listen_maddr


async def _replicate(address):
    from hivemind.p2p import P2P

    return await P2P.replicate(address)


async def _close_replica(holder: list) -> None:
    """Shut the replica down and drop its last reference here, in its own event loop: hivemind's
    ``P2P.__del__`` closes the client again and needs a running loop in the thread it runs in."""
    p2p = holder.pop()
    await p2p.shutdown()
    del p2p


async def _make_semaphore(concurrency: int) -> asyncio.Semaphore:
    return asyncio.Semaphore(concurrency)


def _failed(target: SpanTarget, at: float, duration: Optional[float], error: str, kind: str) -> SpanResult:
    text = clean_text(error[:MAX_RAW_TEXT_CHARS]) or "probe failed"
    return SpanResult(ServerProbe(peer_id=target.peer_id, model=target.model, start=target.start, end=target.end,
                                  at=at, ok=False, duration=duration, error=text, error_kind=kind))


async def _probe_one(p2p, semaphore: asyncio.Semaphore, target: SpanTarget, timeout: float) -> SpanResult:
    async with semaphore:
        at, started = time.time(), time.perf_counter()
        try:
            return await _session(p2p, target, timeout, at, started)
        except asyncio.TimeoutError:
            return _failed(target, at, time.perf_counter() - started, f"no answer within {timeout:g} s", TIMEOUT)
        except Exception as e:  # noqa: BLE001 - whatever the server did, it is this probe's result
            kind, text = failure_kind(e)
            return _failed(target, at, time.perf_counter() - started, text, kind)


async def _schema(stub, uid: str, timeout: float) -> tuple[int, Any, Any]:
    """(hidden size, dtype, compression) of the block's inference input, from its rpc_info."""
    import torch
    from hivemind import MSGPackSerializer
    from hivemind.proto import runtime_pb2

    answer = await asyncio.wait_for(stub.rpc_info(runtime_pb2.ExpertUID(uid=uid), timeout=timeout), timeout)
    info = MSGPackSerializer.loads(answer.serialized_info)
    try:
        descriptor = info["inference_schema"][0][0]
        hidden = int(descriptor.shape[-1])
        dtype, compression = descriptor.dtype, descriptor.compression
    except Exception as e:  # noqa: BLE001 - any malformed answer
        raise ProbeError(f"the server's rpc_info for {uid} has no usable inference_schema ({short_error(e)})") from None
    if not 0 < hidden <= MAX_HIDDEN_SIZE or not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ProbeError(f"the server's rpc_info for {uid} announces an unusable input ({hidden} × {dtype})")
    return hidden, dtype, compression


async def _session(p2p, target: SpanTarget, timeout: float, at: float, started: float) -> SpanResult:
    import torch
    from hivemind import MSGPackSerializer, deserialize_torch_tensor, serialize_torch_tensor
    from hivemind.p2p import PeerID
    from hivemind.proto import runtime_pb2
    from hivemind.utils.asyncio import anext
    from petals.data_structures import CHAIN_DELIMITER
    from petals.server.handler import TransformerConnectionHandler
    from petals.utils.misc import DUMMY, DUMMY_INT64
    from petals.utils.packaging import pack_args_kwargs

    stub = TransformerConnectionHandler.get_stub(p2p, PeerID.from_base58(target.peer_id))
    uids = target.uids
    hidden, dtype, compression = await _schema(stub, uids[0], timeout)
    inputs = target.inputs if target.inputs is not None else default_input(hidden)
    if inputs.ndim != 3 or inputs.shape[0] != 1 or inputs.shape[2] != hidden:
        raise ProbeError(f"the server's blocks take hidden size {hidden}, the probe input has {tuple(inputs.shape)}")
    tokens = inputs.shape[1]
    prefill = min(PREFILL_TOKENS, tokens)

    queue: asyncio.Queue = asyncio.Queue()

    async def requests():
        while True:
            request = await queue.get()
            yield request
            if not request.tensors:
                break

    stream = await asyncio.wait_for(stub.rpc_inference(requests()), timeout)
    session_id, first = str(uuid.uuid4()), True

    async def step(chunk: torch.Tensor) -> tuple[float, torch.Tensor]:
        nonlocal first
        flat, structure = pack_args_kwargs(chunk.to(dtype), DUMMY, DUMMY_INT64)
        metadata = {"session_id": session_id, "step_id": str(uuid.uuid4()), "args_structure": structure}
        if first:
            metadata["max_length"] = int(tokens)
            first = False
        request = runtime_pb2.ExpertRequest(
            uid=CHAIN_DELIMITER.join(uids),
            tensors=[serialize_torch_tensor(t, compression if t.is_floating_point() else 0) for t in flat],
            metadata=MSGPackSerializer.dumps(metadata),
        )
        begun = time.perf_counter()
        await queue.put(request)
        answer = await asyncio.wait_for(anext(stream), timeout)
        elapsed = time.perf_counter() - begun
        if not answer.tensors:
            raise ProbeError("the server answered a step without outputs")
        output = deserialize_torch_tensor(answer.tensors[0])
        if tuple(output.shape) != tuple(chunk.shape):
            raise ProbeError(f"the server answered {tuple(output.shape)} for an input of {tuple(chunk.shape)}")
        return elapsed, output.float()

    async def pause() -> None:
        await asyncio.sleep(random.uniform(0, STEP_GAP))

    try:
        prefill_seconds, first_out = await step(inputs[:, :prefill])
        outputs, decode, empty = [first_out], [], []
        for position in range(prefill, tokens):
            await pause()
            seconds, out = await step(inputs[:, position:position + 1])
            decode.append(seconds)
            outputs.append(out)
        for _ in range(EMPTY_STEPS):
            await pause()
            empty.append((await step(inputs[:, :0]))[0])
        await queue.put(runtime_pb2.ExpertRequest())  # "done sending": the server closes the session
        try:
            await asyncio.wait_for(anext(stream), timeout)
        except (StopAsyncIteration, OSError, asyncio.TimeoutError) as e:
            # measured already; the server may close its end first (as petals' client, ignore it)
            log.debug("closing the probe session on %s: %r", target.peer_id, e)
    finally:
        if queue.empty():
            queue.put_nowait(runtime_pb2.ExpertRequest())
    duration = prefill_seconds + sum(decode) + sum(empty)
    joined = torch.cat(outputs, dim=1)
    probe = ServerProbe(
        peer_id=target.peer_id, model=target.model, start=target.start, end=target.end, at=at, ok=True,
        seconds_per_token=statistics.median(decode) if decode else None,
        rtt=statistics.median(empty) if empty else None,
        prefill_seconds=prefill_seconds, duration=duration,
    )
    # non-finite outputs are kept as they are: the correctness check judges them wrong
    return SpanResult(probe, outputs=joined if target.keep_outputs else None,
                      torch_dtype=str(dtype).replace("torch.", ""))


# ---- compute checks -----------------------------------------------------------------------------

SCHEMA_REUSE = 600.0  # seconds a server's rpc_info is reused by its compute checks
MAX_SCHEMAS = 20_000  # (peer, block) schemas remembered at most


def _check_failed(target: ForwardTarget, at: float, duration: Optional[float], error: str, kind: str) -> ComputeCheck:
    text = clean_text(error[:MAX_RAW_TEXT_CHARS]) or "check failed"
    return ComputeCheck(peer_id=target.peer_id, model=target.model, block=target.block, at=at, ok=False,
                        duration=duration, error=text, error_kind=kind, requested_by=target.requested_by)


async def _forward_one(p2p, semaphore: asyncio.Semaphore, target: ForwardTarget, timeout: float,
                       schemas: dict) -> ComputeCheck:
    async with semaphore:
        at, started = time.time(), time.perf_counter()
        try:
            await _forward_step(p2p, target, timeout, schemas)
        except asyncio.TimeoutError:
            return _check_failed(target, at, time.perf_counter() - started, f"no answer within {timeout:g} s", TIMEOUT)
        except Exception as e:  # noqa: BLE001 - whatever the server did, it is this check's result
            schemas.pop((target.peer_id, target.uid), None)  # (read it again next time)
            kind, text = failure_kind(e)
            return _check_failed(target, at, time.perf_counter() - started, text, kind)
        return ComputeCheck(peer_id=target.peer_id, model=target.model, block=target.block, at=at, ok=True,
                            duration=time.perf_counter() - started, requested_by=target.requested_by)


async def _forward_step(p2p, target: ForwardTarget, timeout: float, schemas: dict) -> None:
    """One token's hidden state through the block, as petals' client sends a forward pass
    (``petals.client.remote_forward_backward``): no session, no attention cache on the server."""
    from hivemind import MSGPackSerializer, deserialize_torch_tensor, serialize_torch_tensor
    from hivemind.p2p import PeerID
    from hivemind.proto import runtime_pb2
    from petals.server.handler import TransformerConnectionHandler
    from petals.utils.misc import DUMMY
    from petals.utils.packaging import pack_args_kwargs

    stub = TransformerConnectionHandler.get_stub(p2p, PeerID.from_base58(target.peer_id))
    key = (target.peer_id, target.uid)
    known = schemas.get(key)
    if known is None or time.monotonic() - known[1] > SCHEMA_REUSE:
        if len(schemas) >= MAX_SCHEMAS:
            schemas.clear()
        known = schemas[key] = (await _schema(stub, target.uid, timeout), time.monotonic())
    hidden, dtype, compression = known[0]
    inputs = default_input(hidden, tokens=1)
    flat, structure = pack_args_kwargs(inputs.to(dtype), DUMMY)
    request = runtime_pb2.ExpertRequest(
        uid=target.uid, tensors=[serialize_torch_tensor(t, compression if t.is_floating_point() else 0) for t in flat],
        metadata=MSGPackSerializer.dumps({"args_structure": structure}))
    answer = await asyncio.wait_for(stub.rpc_forward(request, timeout=timeout), timeout)
    if not answer.tensors:
        raise ProbeError("the server answered the forward step without outputs")
    output = deserialize_torch_tensor(answer.tensors[0])
    if tuple(output.shape) != tuple(inputs.shape):
        raise ProbeError(f"the server answered {tuple(output.shape)} for an input of {tuple(inputs.shape)}")
