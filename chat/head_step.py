"""The chat's own compute, shared: one **head step** for every answer of a model that is ready.

A client of the swarm computes the head itself: hidden state × the head's weight (vocabulary ×
hidden: 128,256 × 8,192 for Llama 3.1 70B, a gigabyte of bfloat16 read per step) and the logits work
after it. Computed once per answer per token, on the answer's own thread, that costs each answer a
whole pass over the weight and makes the answers fight for the cores; computed as one matrix
product for every answer that is waiting, the weight is read once and a row costs a fraction.

``HeadSteps`` (one per model) does that: an answer whose swarm step returned hands in its rows
(``next_tokens``, ``score``) and blocks; one thread takes everything handed in so far as one step
— the head over all rows, then the logits work, batched where the math allows (``chat.sampling``)
— and hands every answer its part. What is handed in while a step runs forms the next one: no
fixed window, so an answer alone never waits for company, and an answer never waits for a slower
one (the swarm steps stay per answer, on each answer's route). A step takes at most ``max_rows``
rows (a long prompt's scoring comes in chunks of ``chat.decoding.SCORE_CHUNK`` positions, each its own job, so it
never stalls the answers beside it).

The head runs in the model's precision (``ClientSide``): float32 as a matrix product; bfloat16 as a
bfloat16 matrix product where the CPU has fast bfloat16 (AVX-512 BF16 or AMX) or on a GPU, one row
as a matrix-vector product (its fastest kernel on this CPU); elsewhere as petals' ``LMHead`` does,
the weight cast to float32 chunk by chunk; on every core, or on ``threads`` of them (``[chat]
chat_head_threads``). A step reads the whole head from memory whatever its rows (2.1 GB for a 70B
model in bfloat16), so its CPU seconds are set by memory bandwidth: on this 2-core machine 160 ms
of CPU per step with one thread or two, two halving its wall time. Logits are float32 from there on. Each step's seconds
and rows go to ``StepStats`` (/metrics, the model's client side in ``GET /v1/models``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from chat.decoding import TokenLogprob, logprob_of
from chat.sampling import RowParams, next_tokens

logger = logging.getLogger(__name__)

MAX_STEP_ROWS = 256  # rows of one head step at most; more wait for the next
CHUNKED_FORWARD_STEP = 16384  # vocabulary rows cast to float32 at once without fast bfloat16 (petals' own)
STATS_WINDOW = 200  # steps the milliseconds per token are averaged over


class _Job:
    """Rows handed in by one answer, and what it gets back (``result`` or ``error``)."""

    __slots__ = ("hidden", "finish", "done", "result", "error")

    def __init__(self, hidden, finish: Callable[[Any], Any]):
        self.hidden, self.finish = hidden, finish  # finish(logits of its rows) -> result
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None

    @property
    def rows(self) -> int:
        return self.hidden.shape[0]

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


@dataclass(frozen=True)
class Picked:
    """The next token of each row handed in, and its log-probability when asked for."""

    token_ids: list[int]
    logprobs: Optional[list[TokenLogprob]] = None


class StepStats:
    """Head steps of one model: every step's seconds and rows go to the ``observe`` callback
    (Prometheus histograms: ``chat.metrics``) and into a window of the last ``STATS_WINDOW`` steps,
    from which ``ms_per_token`` (the step's seconds over its rows) is read."""

    def __init__(self, observe: Optional[Callable[[float, int], None]] = None):
        self._observe = observe
        self._recent: collections.deque = collections.deque(maxlen=STATS_WINDOW)
        self._lock = threading.Lock()
        self.steps = 0
        self.rows = 0

    def add(self, seconds: float, rows: int) -> None:
        with self._lock:
            self._recent.append((seconds, rows))
            self.steps += 1
            self.rows += rows
        if self._observe is not None:
            self._observe(seconds, rows)

    def ms_per_token(self) -> Optional[float]:
        with self._lock:
            rows = sum(r for _, r in self._recent)
            return 1000.0 * sum(s for s, _ in self._recent) / rows if rows else None

    def rows_per_step(self) -> Optional[float]:
        with self._lock:
            return sum(r for _, r in self._recent) / len(self._recent) if self._recent else None


class HeadSteps:
    """One model's head steps (see the module). ``weight``: the head's weight ([vocab, hidden]) in
    the model's precision, on its device; ``chunked``: bfloat16 weights computed in float32
    chunks (a CPU without fast bfloat16)."""

    def __init__(self, name: str, weight, *, chunked: bool = False, stats: Optional[StepStats] = None,
                 max_rows: int = MAX_STEP_ROWS, threads: int = 0):
        self.name, self.weight, self.chunked, self.max_rows = name, weight, chunked, max_rows
        self.threads = threads  # 0: torch's own count (every core)
        self.stats = stats or StepStats()
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    # -- what answers call (each blocks until its step is done) ----------------------------------
    def next_tokens(self, hidden, params: Sequence[RowParams], histories: Sequence[Any] = (),
                    logprobs: bool = False, top: int = 0) -> Picked:
        """The next token of each row of ``hidden`` ([rows, hidden size]: the final norm's output at
        each row's last position), chosen by its ``params`` (after its repetition penalty over its
        ``histories``); with ``logprobs``, each token's log-probability under the raw logits and the
        ``top`` alternatives."""
        def finish(logits):
            raw = _log_softmax(logits) if logprobs else None  # (before the penalty changes logits)
            ids = next_tokens(logits, params, histories).tolist()
            found = None if raw is None else [logprob_of(raw[i], t, top) for i, t in enumerate(ids)]
            return Picked(ids, found)

        return self._submit(hidden, finish)

    def score(self, hidden, targets: Sequence[int], top: int = 0) -> list[TokenLogprob]:
        """Each target token's log-probability after the position of the same row of ``hidden``
        ([positions, hidden size]), with ``top`` alternatives."""
        def finish(logits):
            raw = _log_softmax(logits)
            return [logprob_of(raw[i], t, top) for i, t in enumerate(targets)]

        return self._submit(hidden, finish)

    def logits_of(self, hidden):
        """The float32 logits of ``hidden``'s rows, computed in a shared step (what the specs compare
        with one answer at a time)."""
        return self._submit(hidden, lambda logits: logits.clone())

    def _submit(self, hidden, finish) -> Any:
        job = _Job(hidden, finish)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"the head steps of {self.name} are closed")
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"head-steps-{self.name}", daemon=True)
                self._thread.start()
            self._cond.notify()
        return job.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the steps -----------------------------------------------------------------------------
    def _take(self) -> list[_Job]:
        """Everything handed in so far (at most ``max_rows`` rows; a larger job alone), waiting for
        the first; [] once closed."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            jobs, rows = [], 0
            while self._queue and (not jobs or rows + self._queue[0].rows <= self.max_rows):
                job = self._queue.popleft()
                jobs.append(job)
                rows += job.rows
            return jobs

    def _run(self) -> None:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)  # (OpenMP's count is the calling thread's: this one's steps only)
        while True:
            jobs = self._take()
            if not jobs:
                return
            started = time.perf_counter()
            try:
                with torch.no_grad():
                    logits = self.logits(torch.cat([job.hidden.reshape(job.rows, -1) for job in jobs]))
                    offset = 0
                    for job in jobs:
                        try:
                            job.result = job.finish(logits[offset:offset + job.rows])
                        except Exception as e:  # noqa: BLE001 - one answer's failure costs only itself
                            job.error = e
                        offset += job.rows
            except Exception as e:  # noqa: BLE001 - the step failed: every answer in it hears why
                logger.warning("a head step of %s failed: %r", self.name, e)
                for job in jobs:
                    job.error = job.error or e
            finally:
                self.stats.add(time.perf_counter() - started, sum(job.rows for job in jobs))
                for job in jobs:
                    job.done.set()

    def logits(self, hidden):
        """The head over ``hidden`` ([rows, hidden size]) as float32 logits, in the weight's precision."""
        import torch
        import torch.nn.functional as F

        weight = self.weight
        hidden = hidden.to(weight.device)
        if weight.dtype == torch.float32:
            return F.linear(hidden.float(), weight)
        if self.chunked:  # petals' LMHead.chunked_forward: bfloat16 weights, float32 math, a chunk at a time
            hidden = hidden.float()
            out = torch.empty(hidden.shape[0], weight.shape[0], dtype=torch.float32, device=weight.device)
            for start in range(0, weight.shape[0], CHUNKED_FORWARD_STEP):
                out[:, start:start + CHUNKED_FORWARD_STEP] = F.linear(hidden,
                                                                      weight[start:start + CHUNKED_FORWARD_STEP].float())
            return out
        hidden = hidden.to(weight.dtype)
        if hidden.shape[0] == 1 and weight.device.type == "cpu":  # one row: the matrix-vector kernel is fastest
            return torch.mv(weight, hidden[0]).float()[None, :]
        return F.linear(hidden, weight).float()


def _log_softmax(logits):
    import torch

    return torch.log_softmax(logits, dim=-1)

