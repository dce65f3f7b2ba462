"""The generation check job: for every watched model the monitor can load (a local ``path``), a few
tokens of a fixed prompt generated end to end, once per ``generation_check_period``.

It asks the question a user asks — can I generate with this model right now, and how fast? — the
way a user would: through the chat's own engine (``chat.engine.ChatEngine``: the same client-side
model, the health-aware sequence manager's routing, petals' retries and the chat's session code),
with ``generation_check_tokens`` greedy tokens of ``generation_check_prompt`` in the model's chat
format. It records success or the error (the servers' own errors when they failed the steps), time
to first token, tokens per second, the route taken, the answer, and whether the answer matched the
model's ``expect`` pattern (``core.generation.judge_answer``: a mismatch is a failure).

What it must not do:
- take a user's place: ``ChatEngine.check_answer`` neither takes nor waits for one of the chat's
  sessions (a chat with every place held does not delay the check, nor the check a chat);
- count as a user's chat: each server's outcome goes to the check's own record, never to the
  chat outcomes that scores and routing learn from;
- cost the swarm more than a user would: one check per model per period, one after the other, each
  one short inference session (the prompt, a dozen tokens or so, then ``generation_check_tokens``
  one-token steps, 8 by default: with a 300 s period, about 20 tokens per model every 5 minutes).
  A check that cannot finish is bounded by the engine's own limits (petals' request timeout and
  retries, the session's stall timeout).

The engine: the one the process's chat serves with, when it has one (``swarm-monitor serve``,
``demo``: ``Poller.chat_engine``); else (``swarm-monitor poll`` alone) one made for the checks, with
the chat's routing settings and peer weights and neither outcome sink nor coverage check.
After each round the newest poll is diagnosed again (``after_round``), as after a probe round.
A round with a failed check is followed by the next after ``RETRY_AFTER`` seconds (not a period),
until every check succeeds: a model a failed check calls broken is seen working again within a
minute of its servers (the failure itself asks for compute checks of the servers that failed it).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from monitor.core.common import remote_error, short_error
from monitor.core.generation import ANSWER_CHARS, GenerationCheck, RouteSpan, judge_answer, servers_failed
from monitor.core.snapshot import ChatOutcome
from monitor.app.rounds import start_rounds

log = logging.getLogger(__name__)

RETRY_AFTER = 30.0  # seconds: after a round with a failed check, the next one (at most the period)


def _spans(outcomes: list[ChatOutcome]) -> list[RouteSpan]:
    """The spans whose servers failed a step, with the server's own error where it sent one (each
    once: petals may retry the same server)."""
    return list(dict.fromkeys(RouteSpan(o.peer_id, o.start, o.end, error=remote_error(o.error) or short_error(o.error))
                              for o in outcomes if not o.ok))


class GenerationChecker:
    """Checks every model with a path, one after the other; stores each round's checks."""

    def __init__(self, settings, store, *, engine: Callable[[], Any],
                 after_round: Optional[Callable[[], object]] = None,
                 close_engine: Optional[Callable[[], None]] = None):
        """``engine``: returns the ChatEngine to generate with (called for each round);
        ``after_round``: called once a round's checks are stored (to diagnose again with them);
        ``close_engine``: called by ``close`` (an engine made for the checks only)."""
        self.settings = settings
        self.store = store
        self.engine = engine
        self.after_round = after_round
        self.close_engine = close_engine
        self.models = [m for m in settings.models if m.path is not None]
        self.rounds = self.checks = self.failures = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ---- one round -------------------------------------------------------------------------------
    def run_once(self) -> list[Optional[GenerationCheck]]:
        """Check every model once; returns the checks (None: a model whose servers were too busy to
        say, ``check``) and stores those that say something."""
        if not self.models:
            return []
        engine = self.engine()
        checks = [self.check(engine, model) for model in self.models if not self._stop.is_set()]
        said = [check for check in checks if check is not None]
        self.store.record_generation_checks(said)
        self.rounds += 1
        self.checks += len(said)
        self.failures += sum(1 for c in said if not c.ok)
        if self.after_round is not None:
            self.after_round()
        return checks

    def check(self, engine, model) -> Optional[GenerationCheck]:
        """One check of ``model`` (a ModelConfig with a path): never raises, a failure is its result.
        None when no server had attention-cache room for the check (``ServersFull``): the servers are
        busy, which says nothing of whether they generate; the next round (``RETRY_AFTER``) asks again."""
        from chat.decoding import Finished, GenerationParams
        from chat.errors import ChatError, ModelNotServed, ServersFull

        at, started = time.time(), time.perf_counter()
        outcomes: list[ChatOutcome] = []
        finished: Optional[Finished] = None
        try:
            input_ids, stops = engine.models.encode_chat(model.dht_prefix, [
                {"role": "user", "content": self.settings.generation_check_prompt}])
            params = GenerationParams(max_new_tokens=self.settings.generation_check_tokens, temperature=0.0,
                                      stop_sequences=stops)
            with engine.check_answer(model.dht_prefix, input_ids, params, outcome_sink=outcomes.append) as answer:
                for event in answer:
                    if isinstance(event, Finished):
                        finished = event
        except ServersFull as e:
            log.info("generation check of %s not made: %s", model.dht_prefix, e)
            return None
        except Exception as e:  # noqa: BLE001 - whatever failed, it is this check's result
            from chat.feedback import ask_to_confirm

            for outcome in outcomes:  # the servers that failed it: a compute check confirms each now
                ask_to_confirm(self.store, outcome, None, by="generation-check")
            failed = _spans(outcomes)
            if isinstance(e, ModelNotServed):
                error = e.reason
            else:  # the servers' own errors if they sent some, else what the engine said (for people)
                error = servers_failed(failed) or short_error(str(e) if isinstance(e, ChatError) else e)
            log.info("generation check of %s failed: %s", model.dht_prefix, error)
            return GenerationCheck(model=model.dht_prefix, at=at, ok=False, error=error, expect=model.expect,
                                   duration=time.perf_counter() - started, route=tuple(failed))
        if finished is None or not finished.token_ids:
            return GenerationCheck(model=model.dht_prefix, at=at, ok=False, expect=model.expect,
                                   error="the swarm answered without generating a token",
                                   duration=time.perf_counter() - started, route=tuple(_spans(outcomes)))
        route = tuple(RouteSpan(hop.peer_id, hop.start, hop.end) for hop in finished.route) + tuple(_spans(outcomes))
        check = GenerationCheck(
            model=model.dht_prefix, at=at, ok=True, answer=finished.text[:ANSWER_CHARS],
            time_to_first_token=finished.time_to_first_token, tokens_per_second=finished.tokens_per_second,
            tokens=finished.completion_tokens, duration=time.perf_counter() - started, route=route,
        )
        return judge_answer(check, model.expect)

    # ---- the job's thread ------------------------------------------------------------------------
    def start(self, *, stats=None, run_now: bool = True) -> "GenerationChecker":
        """Run a round every ``generation_check_period`` on a thread of its own (a round may take
        long while servers fail; it delays only the next round); ``stats``: the poller's JobStats,
        where each round counts as job "generation" (failures with their error)."""
        period = self.settings.generation_check_period
        began = [time.monotonic()]
        failed = [False]

        def round_() -> None:
            began[0] = time.monotonic()
            failed[0] = True  # (until the round says otherwise: a round that raised is retried soon too)
            failed[0] = not all(check is not None and check.ok for check in self.run_once())

        def pause() -> float:
            wait = min(period, RETRY_AFTER) if failed[0] else period
            return max(1.0, wait - (time.monotonic() - began[0]))

        self._thread = start_rounds("generation", round_, pause, self._stop, stats=stats,
                                    first_pause=None if run_now else period)
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop after the check under way (waiting at most ``timeout`` s for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.close_engine is not None:
            self.close_engine()


class _OwnEngine:
    """The checks' engine when the process serves no chat: made on first use, closed with the job."""

    def __init__(self, settings, store, dht):
        self.settings, self.store, self.dht = settings, store, dht
        self.engine = self.weights = None
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            if self.engine is None:
                from chat.client_side import ClientSideSettings
                from chat.engine import ChatEngine
                from chat.feedback import StoreWeights
                from chat.policy import RoutingSettings

                self.weights = StoreWeights(self.store).start()
                self.engine = ChatEngine(self.dht, [m for m in self.settings.models if m.path],
                                         score_source=self.weights,
                                         routing=RoutingSettings.from_settings(self.settings), slots=1,
                                         client_side=ClientSideSettings.from_settings(self.settings))
            return self.engine

    def close(self) -> None:
        with self._lock:
            if self.engine is not None:
                self.engine.close()
            if self.weights is not None:
                self.weights.close()
            self.engine = self.weights = None


# ---- the job (``app/job_table.py``) -----------------------------------------------------------


def generation_check(ctx) -> list:
    """``swarm-monitor job generation-check --once``: one round, by a checker of its own."""
    checker = generation_checker(ctx)
    if checker is None:
        return []
    try:
        return checker.run_once()
    finally:
        checker.close()


def generation_checker(ctx) -> Optional[GenerationChecker]:
    """The generation check job, not started (None if no model has a path): the engine is the
    process's ``chat_engine`` if it serves a chat, else one of its own."""
    if not any(m.path is not None for m in ctx.settings.models):
        return None
    own = _OwnEngine(ctx.settings, ctx.store, ctx.dht)

    def engine():
        return ctx.chat_engine if ctx.chat_engine is not None else own()

    return GenerationChecker(ctx.settings, ctx.store, engine=engine, after_round=ctx.assess_latest,
                             close_engine=own.close)


def start_generation_checks(ctx, run_now: bool = True) -> Optional[GenerationChecker]:
    """The ``generation-check`` rounds on a thread of their own (None if no model has a path)."""
    checker = generation_checker(ctx)
    return checker.start(stats=ctx.stats, run_now=run_now) if checker is not None else None
