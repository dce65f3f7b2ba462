"""The poller's jobs, listed once: each a plain function over the job context, with its trigger.

An entry names the function itself (``run``: ``job(ctx) -> result``, ``app/job_context.py``) and
what starts it (``triggers``), and the runner (``app/runner.py``) does the rest — nothing else
schedules a job, and no job calls another:

- ``Every(period)``: the runner's scheduler runs it every ``period(settings)`` seconds (its first
  run at the start, unless ``at_start=False``);
- ``Rounds(period, keep)``: it runs in rounds on a thread of its own while the poller leads and its
  DHT client is up: ``keep(ctx, run_now)`` starts the job's worker (which keeps what is due by
  server, and pauses about ``period`` between rounds) and the runner closes it when the poller
  stops leading; run by hand, the function uses the running worker or one of its own;
- ``After(jobs, when)``: right after a run of one of those jobs (in the thread that ran it, in the
  table's order), when ``when(result)`` holds;
- ``OnRequest()``: only when asked — another process writes a request into the store
  (``Store.request_job``: "scrape now", "check this server now"), which the leader's ``requests``
  job carries out, so a chat worker, the web or a standby asks the same way. Every job can be asked
  for; a job that takes servers (``for_servers``) is run on the servers the requests name.

``swarm-monitor job NAME --once`` runs any entry once against the configured store, as a cron
line or an operator would (a leader-only job refuses while another poller leads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from monitor.app import alerter, compute_checking, generation_check, polling, probing
from monitor.app.job_context import JobContext
from monitor.settings import Settings

REQUESTS_PERIOD = 2.0  # seconds between two looks for requested jobs

Period = Callable[[Settings], float]


@dataclass(frozen=True)
class Every:
    period: Period
    at_start: bool = True  # its first run at the poller's start (else a period later)


@dataclass(frozen=True)
class Rounds:
    period: Period
    keep: Callable[..., Any]  # (ctx, run_now) -> the running worker (``JobContext.workers``), or None


@dataclass(frozen=True)
class After:
    jobs: tuple[str, ...]
    when: Optional[Callable[[Any], bool]] = None  # the run's result -> whether to follow it


@dataclass(frozen=True)
class OnRequest:
    pass


Trigger = Union[Every, Rounds, After, OnRequest]


@dataclass(frozen=True)
class Job:
    name: str
    what: str
    run: Callable[[JobContext], Any]
    triggers: tuple[Trigger, ...] = (OnRequest(),)
    leader_only: bool = True
    needs_dht: bool = False
    enabled: Callable[[Settings], bool] = lambda settings: True  # (triggered only when this holds)
    for_servers: Optional[Callable[[JobContext, list, Optional[str]], Any]] = None  # requests naming servers

    def period(self, settings: Settings) -> Optional[float]:
        """Seconds between two runs (an interval's or a round's); None: triggered."""
        return next((t.period(settings) for t in self.triggers if isinstance(t, (Every, Rounds))), None)

    def when(self, settings: Settings) -> str:
        """Its triggers in a few words (``swarm-monitor job --list``)."""
        words = []
        for t in self.triggers:
            if isinstance(t, Every):
                words.append(f"every {t.period(settings):g} s")
            elif isinstance(t, Rounds):
                words.append(f"rounds of {t.period(settings):g} s")
            elif isinstance(t, After):
                words.append("after " + "/".join(t.jobs))
            else:
                words.append("on request")
        return ", ".join(words) + ("" if self.enabled(settings) else " (off)")

    def trigger(self, kind: type) -> Optional[Any]:
        return next((t for t in self.triggers if isinstance(t, kind)), None)

    def follows(self, name: str, result: Any) -> bool:
        """Whether a run of job ``name`` that came to ``result`` triggers this one."""
        return any(isinstance(t, After) and name in t.jobs and (t.when is None or t.when(result))
                   for t in self.triggers)


def alerts_on(settings: Settings) -> bool:
    return settings.alerts.enabled


JOBS: tuple[Job, ...] = (
    Job("scrape", "read every block's servers from the DHT, assess the poll, store both", polling.poll,
        (Every(lambda s: s.scrape_period),), needs_dht=True),
    Job("reachability", "check that every ONLINE server and bootstrap peer answers, then assess again",
        polling.reachability, (Every(lambda s: s.reachability_period),), needs_dht=True,
        for_servers=polling.check_servers),
    Job("probes", "speed and correctness probes of the servers that are due, then assess again", probing.probes,
        (Rounds(lambda s: s.speed_probe_period, probing.start_probing),), needs_dht=True,
        for_servers=probing.probe_soon),
    Job("compute-checks", "one token through the first block of every ONLINE server that is due; a "
        "changed verdict assessed at once", compute_checking.compute_checks,
        (Rounds(lambda s: s.compute_check_period, compute_checking.start_compute_checks),), needs_dht=True),
    Job("compute-check", "a compute check now of the servers a request names (a user met them failing), "
        "else of every ONLINE server", compute_checking.compute_check, needs_dht=True,
        for_servers=compute_checking.check_now),
    Job("generation-check", "a few tokens end to end per model through the chat's engine, then assess again",
        generation_check.generation_check,
        (Rounds(lambda s: s.generation_check_period, generation_check.start_generation_checks),), needs_dht=True),
    Job("assess", "each model's assessment of the newest poll from the newest stored inputs (each job that "
        "stores one asks for it)", polling.assess_job),
    Job("scores", "every peer's score from a week of history and the assessments", polling.scores,
        (Every(lambda s: s.score_period),)),
    Job("rollup", "hourly rollups, and pruning past the retention", polling.rollup,
        (Every(lambda s: s.rollup_period, at_start=False),)),
    Job("alerts", "evaluate the alert rules over the stored state; store what changed", alerter.alerts,
        (Every(lambda s: s.alerts.check_period), After(("scrape", "reachability"))), enabled=alerts_on),
    Job("alert-delivery", "send the pending notices to their webhooks (and at once after a new one)",
        alerter.alert_delivery, (Every(lambda s: s.alerts.check_period),), enabled=alerts_on),
    Job("requests", "carry out the jobs other processes asked for through the store", polling.requests,
        (Every(lambda s: REQUESTS_PERIOD),), needs_dht=True),
    Job("heartbeat", "ping the heartbeat URL after every stored poll", polling.heartbeat,
        (After(("scrape",), when=polling.stored_poll),)),
    Job("standby", "a standby keeps its DHT client warm and reports what it cannot reach", polling.standby,
        (Every(lambda s: s.reachability_period),), leader_only=False, needs_dht=True),
)

BY_NAME = {job.name: job for job in JOBS}
