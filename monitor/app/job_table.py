"""The poller's jobs, listed once: name, what it does, its period, whether only the leader runs it.

Each job is a plain call on the poller's store and DHT client (``Poller``'s method of the same
name); none calls back into another. A job that wants another to run soon writes a request into
the store (``Store.request_job``: "scrape now", "check this server now"), which the leader's
``requests`` job carries out — so a chat worker in another process, the web or a standby asks the
same way. ``swarm-monitor job NAME --once`` runs any one of them against the configured store, as
a cron line or an operator would (a leader-only job refuses while another poller leads).

``scheduled``: the poller's scheduler runs it every ``period`` (``probes``, ``compute-checks`` and
``generation-check`` run in rounds on threads of their own, due by server; ``compute-check`` runs
when requested; ``alerts`` and ``alert-delivery`` are added
with their listeners by ``app.alerter.schedule_alerts``; ``assess`` runs after every stored input,
``heartbeat`` after every stored poll).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from monitor.settings import Settings

REQUESTS_PERIOD = 2.0  # seconds between two looks for requested jobs


@dataclass(frozen=True)
class Job:
    name: str
    what: str
    period: Callable[[Settings], Optional[float]]  # seconds; None: not periodic (triggered)
    leader_only: bool = True
    needs_dht: bool = False
    scheduled: bool = True  # added to the poller's scheduler as an interval job
    at_start: bool = True  # its first run at the poller's start (else a period later)

    def run(self, poller):
        """Run it once now (the poller's method of the job's name); its log lines say which job."""
        from monitor import logs

        with logs.about(job=self.name):
            return getattr(poller, "job_" + self.name.replace("-", "_"))()


JOBS: tuple[Job, ...] = (
    Job("scrape", "read every block's servers from the DHT, assess the poll, store both",
        lambda s: s.scrape_period, needs_dht=True),
    Job("reachability", "check that every ONLINE server and bootstrap peer answers, then assess again",
        lambda s: s.reachability_period, needs_dht=True),
    Job("probes", "speed and correctness probes of the servers that are due, then assess again",
        lambda s: s.speed_probe_period, needs_dht=True, scheduled=False),
    Job("compute-checks", "one token through the first block of every ONLINE server that is due; a "
        "changed verdict assessed at once", lambda s: s.compute_check_period, needs_dht=True, scheduled=False),
    Job("compute-check", "a compute check now of the servers a request names (a user met them failing), "
        "else of every ONLINE server",
        lambda s: None, needs_dht=True, scheduled=False),
    Job("generation-check", "a few tokens end to end per model through the chat's engine, then assess again",
        lambda s: s.generation_check_period, needs_dht=True, scheduled=False),
    Job("assess", "each model's assessment of the newest poll from the newest stored inputs",
        lambda s: None, scheduled=False),
    Job("scores", "every peer's score from a week of history and the assessments", lambda s: s.score_period),
    Job("rollup", "hourly rollups, and pruning past the retention", lambda s: s.rollup_period, at_start=False),
    Job("alerts", "evaluate the alert rules over the stored state; store what changed",
        lambda s: s.alerts.check_period, scheduled=False),
    Job("alert-delivery", "send the pending notices to their webhooks", lambda s: s.alerts.check_period,
        scheduled=False),
    Job("requests", "carry out the jobs other processes asked for through the store",
        lambda s: REQUESTS_PERIOD, needs_dht=True),
    Job("heartbeat", "ping the heartbeat URL (after every stored poll)", lambda s: None, scheduled=False),
    Job("standby", "a standby keeps its DHT client warm and reports what it cannot reach",
        lambda s: s.reachability_period, leader_only=False, needs_dht=True),
)

BY_NAME = {job.name: job for job in JOBS}
