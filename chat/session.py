"""One petals inference session and the answers generated in it.

An answer runs transformers' ``generate`` on a worker thread (petals' client is blocking) and
hands each token to the caller through a queue, so the caller can stream it, stop it, and give up
on a swarm that stalls. The session keeps one of the engine's places until it is closed; the
route each answer took and every peer's outcome come from ``chat.sequence``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

from monitor.core.common import short_error

from chat.decoding import Delta, Finished, GenerationParams, StreamDecoder
from chat.errors import ChatError, GenerationFailed, InvalidRequest, ModelNotServed
from chat.policy import RouteHop
from chat.remote_model import sequence_manager_of
from chat.sequence import TimedInferenceSession

logger = logging.getLogger(__name__)

Event = Union[Delta, Finished]


class _Streamer:
    """transformers' streamer protocol: ``put`` gets the prompt once, then every new token."""

    def __init__(self, on_token: Callable[[int], None]):
        self._on_token = on_token
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for token_id in value.reshape(-1).tolist():
            self._on_token(token_id)

    def end(self) -> None:
        pass


class _AnswerRun:
    """What one answer's worker thread and its consumer share: the decoder, the queue of events,
    the token clock and the two ways to stop (the caller's ``stop_event``; ``cancel`` when the
    consumer leaves)."""

    def __init__(self, tokenizer: Any, params: GenerationParams, stop_event: Optional[threading.Event]):
        self.decoder = StreamDecoder(tokenizer, stop_sequences=params.stop_sequences, stop_mode=params.stop_mode,
                                     skip_special_tokens=params.skip_special_tokens)
        self.events: queue.Queue = queue.Queue()
        self.stop_event = stop_event or threading.Event()
        self.cancel = threading.Event()
        self.started = time.perf_counter()
        self.first: Optional[float] = None  # when the first token came
        self.last: Optional[float] = None  # when the latest token came

    def on_token(self, token_id: int) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        delta = self.decoder.feed(token_id)
        if delta is not None:
            self.events.put(delta)

    def should_stop(self) -> bool:
        return self.decoder.stopped or self.stop_event.is_set() or self.cancel.is_set()

    def finish_reason(self, budget: int, eos_token_id: Optional[int]) -> str:
        ids = self.decoder.ids
        if self.decoder.stopped or (ids and ids[-1] == eos_token_id):
            return "stop"
        if self.stop_event.is_set():
            return "cancelled"
        if len(ids) >= budget:
            return "length"
        return "stop"

    def timings(self) -> tuple[Optional[float], Optional[float]]:
        """(seconds to the first token, tokens per second after it; over the whole answer when
        only one token came)."""
        n, first, last = len(self.decoder.ids), self.first, self.last
        ttft = first - self.started if first else None
        if n >= 2 and last > first:
            return ttft, (n - 1) / (last - first)
        if n and first:
            return ttft, n / (first - self.started)
        return ttft, None


def _stopping_criteria(run: _AnswerRun) -> Any:
    """transformers' stopping criteria that end ``generate`` after the token when ``run`` should stop."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs) -> bool:
            return run.should_stop()

    return StoppingCriteriaList([_Stop()])


class ChatSession:
    """One petals inference session: one or more answers that continue the same text.

    ``release`` gives the engine's place back when the session closes; ``stall_timeout`` is how
    long an answer waits for its next token before it gives up."""

    def __init__(self, remote: Any, max_length: int, *, model: str, tokenizer: Any, stall_timeout: float,
                 release: Callable[[], None]):
        self.model, self.tokenizer, self.remote, self.max_length = model, tokenizer, remote, max_length
        self._manager = sequence_manager_of(remote)
        self._petals = TimedInferenceSession(self._manager, max_length)
        self._stall_timeout = stall_timeout
        self._release = release
        self._closed = False
        self._lock = threading.Lock()
        self._route: tuple[RouteHop, ...] = ()

    @property
    def used(self) -> int:
        """Tokens the session's servers have processed or will process next (the last one)."""
        output_ids = self._petals.output_ids
        return output_ids.shape[1] if output_ids is not None else 0

    def room(self, new_input_tokens: int) -> int:
        """How many tokens may still be generated after ``new_input_tokens`` more input."""
        return self.max_length - self.used - new_input_tokens

    def route(self) -> tuple[RouteHop, ...]:
        """The route now (live while generating), else the last answer's route."""
        hops = self._petals.recorder.route(self._manager.peer_weights())
        return tuple(hops) or self._route

    def replace_last_token(self, token_id: int) -> None:
        """Make the session continue as if ``token_id`` had been generated last."""
        if self._petals.output_ids is not None:
            self._petals.output_ids[:, -1:] = token_id

    def generate(self, input_ids: Optional[Sequence[int]], params: GenerationParams,
                 *, stop_event: Optional[threading.Event] = None) -> Iterator[Event]:
        """Continue the session with ``input_ids`` (None: continue from the last token) and stream
        the answer. Stopping (the event, or leaving the iterator) ends generation after the
        current token."""
        n_input, budget = self._checked_budget(input_ids, params)
        run = _AnswerRun(self.tokenizer, params, stop_event)
        prompt_tokens = self.used + n_input
        with self._lock:
            worker = threading.Thread(target=self._generate_on_worker, name=f"chat-{self.model}", daemon=True,
                                      args=(run, list(input_ids) if n_input else None, budget, params))
            worker.start()
            try:
                yield from self._deltas(run)
                tail = run.decoder.finish()
                if tail is not None:
                    yield tail
                yield self._finished(run, prompt_tokens, budget)
            finally:
                run.cancel.set()
                worker.join(self._stall_timeout)

    def _checked_budget(self, input_ids: Optional[Sequence[int]], params: GenerationParams) -> tuple[int, int]:
        """(new input tokens, tokens the answer may generate), or why the session cannot answer."""
        if self._closed:
            raise GenerationFailed("the inference session is closed")
        n_input = len(input_ids) if input_ids else 0
        if not n_input and self._petals.output_ids is None:
            raise InvalidRequest("inputs", "the first request of a session needs inputs")
        budget = min(params.max_new_tokens, self.room(n_input))
        if budget <= 0:
            raise InvalidRequest("max_length", f"the session's max_length {self.max_length} is used up "
                                               f"({self.used} tokens so far, {n_input} new); open a longer session")
        return n_input, budget

    def _generate_on_worker(self, run: "_AnswerRun", input_ids: Optional[list[int]], budget: int,
                            params: GenerationParams) -> None:
        """transformers' ``generate`` through the petals session (blocking); every token, then
        ("done", None) or ("error", exception), goes into ``run.events``."""
        try:
            import torch

            inputs = torch.tensor([input_ids], dtype=torch.long) if input_ids else None
            pad = self.tokenizer.pad_token_id
            with torch.no_grad():
                self.remote.generate(
                    inputs, session=self._petals, max_new_tokens=budget,
                    streamer=_Streamer(run.on_token), stopping_criteria=_stopping_criteria(run),
                    pad_token_id=pad if pad is not None else self.tokenizer.eos_token_id,
                    **params.generate_kwargs(),
                )
            self._route = self.route()
            self._petals.recorder.flush()
            run.events.put(("done", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._petals.recorder.flush()
            run.events.put(("error", e))

    def _deltas(self, run: "_AnswerRun") -> Iterator[Delta]:
        """The worker's text as it comes, until it is done; its failure, or a stall, as a ChatError."""
        while True:
            try:
                item = run.events.get(timeout=self._stall_timeout)
            except queue.Empty:
                raise GenerationFailed(f"the swarm sent no token for {self._stall_timeout:.0f} s; "
                                       f"try again") from None
            if isinstance(item, Delta):
                yield item
                continue
            kind, error = item
            if kind == "error":
                raise _as_chat_error(self.model, error)
            return

    def _finished(self, run: "_AnswerRun", prompt_tokens: int, budget: int) -> Finished:
        end = time.perf_counter()
        ids = run.decoder.ids
        ttft, speed = run.timings()
        return Finished(text=run.decoder.emitted, token_ids=tuple(ids), prompt_tokens=prompt_tokens,
                        finish_reason=run.finish_reason(budget, self.tokenizer.eos_token_id), route=self._route,
                        time_to_first_token=ttft, tokens_per_second=speed, elapsed=end - run.started)

    def close(self) -> None:
        """End the inference session on its servers and give the engine's place back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._petals.close()
        except Exception as e:  # noqa: BLE001
            logger.debug("closing the inference session failed: %r", e)
        finally:
            self._release()


class Answer:
    """An answer being generated; closing it (or leaving the ``with``) stops it and frees its place."""

    def __init__(self, session: ChatSession, events: Iterator[Event]):
        self.session = session
        self._events = events

    def __iter__(self) -> Iterator[Event]:
        return self._events

    def close(self) -> None:
        try:
            self._events.close()
        finally:
            self.session.close()

    def __enter__(self) -> "Answer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_chat_error(model: str, error: BaseException) -> ChatError:
    from petals.client.routing.sequence_manager import MissingBlocksError

    if isinstance(error, ChatError):
        return error
    if isinstance(error, MissingBlocksError):
        return ModelNotServed(model, "servers went away while answering; some blocks have no server now")
    # the petals error names peers, addresses and internals: it is for the operator's log only
    logger.warning("generation with %s failed: %s", model, short_error(error), exc_info=error)
    return GenerationFailed(f"the swarm's servers failed while answering with {model!r}, also after retrying "
                            f"other servers; try again in a moment")
