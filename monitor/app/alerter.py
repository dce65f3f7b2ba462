"""The alert jobs: rules evaluated over what the store holds, notices delivered to webhooks.

Two jobs of the poller's table (``app/job_table.py``; a running poller's ``Alerter`` is
``running_alerter``'s):

- ``alerts`` evaluates every rule (``monitor/core/alert_rules.py``, pure) over the latest stored poll,
  diagnoses, reachability checks and scores, right after every scrape and reachability round and at
  least every ``alerts.check_period``; it stores what changed (alerts, notices, one pending delivery
  per notice and webhook) in one transaction, so a restarted poller neither repeats nor loses a notice;
- ``alert-delivery`` sends pending deliveries, oldest first and in order per webhook, retrying a
  failed one with exponential backoff (``retry_backoff``, doubling up to an hour) until
  ``max_attempts``, after which it is marked failed (shown on /alerts and /metrics). Deliveries
  of one webhook made together (one evaluation, or within ``group_wait``) go as one message; an
  Alertmanager webhook also gets the alerts still firing re-sent every ``alertmanager_resend``
  (it forgets an alert whose ``endsAt`` passed).

Before each evaluation the job reads the silences and maintenance windows not over yet; with the
inhibition rules they hold alerts back (``core/muting.py``).

Only the poller runs these (one per store); web workers only read what they wrote.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Callable, Optional

from monitor.app import apprise_notify, owner_hooks, webhooks
from monitor.alert_settings import WebhookConfig
from monitor.core import alert_rules as core
from monitor.core import muting
from monitor.core.assess import judged_reachability, flagged
from monitor.core.assessment import CAUSE_FAILING, CAUSE_JOINING, CAUSE_OFFLINE, CAUSE_SLOW, CAUSE_WRONG
from monitor.core.common import DAY, HOUR, short_error
from monitor.core.snapshot import JOINING, OFFLINE, ONLINE, ReachabilityResult, Snapshot
from monitor.store import owners

log = logging.getLogger(__name__)

MAX_BACKOFF = HOUR
DELIVERIES_PER_RUN = 100  # pending deliveries looked at per delivery run (the rest wait for the next)
PRUNE_EVERY = HOUR
OWNER = "owner:"  # a delivery to a server owner's webhook: "owner:<subscription id>" (store/owners.py)
OWNER_TIMEOUT = 10.0  # seconds an owner's webhook gets to answer
LOOK_AGAIN = 10.0  # seconds between two polls asked for to see whether a server that left is back
_STATE_RANK = {ONLINE: 3, JOINING: 2, OFFLINE: 1}


# ---- the view: what the store holds, as the rules see it -------------------------------------


def _reachable(check: Optional[ReachabilityResult]) -> Optional[bool]:
    if check is None or (not check.ok and check.joining):
        return None
    return check.ok


class WatchedPeers:
    """The watched peers (``targets``: ids or names of the peer rules) that neither the latest poll
    nor a model's lost servers show, looked up in the store once each: their public name and the
    models they served, for the alerts' labels. A cache of stored facts, not a memory: a poller
    that takes over looks them up the same."""

    def __init__(self) -> None:
        self.known: dict[str, tuple[Optional[str], tuple[str, ...]]] = {}  # peer id -> (name, models)
        self._looked_up: set[str] = set()

    def look_up(self, store, targets, present: set[str]) -> dict[str, tuple[Optional[str], tuple[str, ...]]]:
        """peer id -> (name, models) of the watched ``targets`` not ``present`` (ids and names)."""
        names = {name for name, _ in self.known.values() if name}
        for target in targets:
            if target in present or target in self.known or target in names or target in self._looked_up:
                continue
            self._looked_up.add(target)
            ids = [target] if len(target) >= 32 else [
                m.peer_id for m in store.search_peers(target, limit=5) if m.public_name == target]
            for peer in ids:
                record = store.peer_record(peer)
                models = tuple(sorted({a.model for a in store.last_announcements(peer)}))
                if record is not None or models:
                    self.known[peer] = (record.public_name if record else None, models)
        return self.known


def lost_known(assessments: dict) -> dict[str, tuple[Optional[str], tuple[str, ...]]]:
    """peer id -> (name, the models it served) of the servers the assessments say were lost."""
    found: dict[str, tuple[Optional[str], tuple[str, ...]]] = {}
    for prefix, assessment in sorted(assessments.items()):
        for peer, name in assessment.lost.items():
            known_name, models = found.get(peer, (None, ()))
            found[peer] = (known_name or name, tuple(sorted({*models, prefix})))
    return found


def _peer_views(snapshot: Optional[Snapshot], reachability: dict[str, ReachabilityResult], scores: dict,
                wrong: dict[str, str], failing: dict[str, str], known: dict,
                assessments: Optional[dict] = None) -> tuple[core.PeerView, ...]:
    names: dict[str, Optional[str]] = {}
    states: dict[str, str] = {}
    models: dict[str, set] = {}
    for row in snapshot.servers if snapshot else ():
        names[row.peer_id] = names.get(row.peer_id) or row.public_name
        models.setdefault(row.peer_id, set()).add(row.model)
        if _STATE_RANK.get(row.state, 0) > _STATE_RANK.get(states.get(row.peer_id, ""), 0):
            states[row.peer_id] = row.state
    confirmed = {peer for assessment in (assessments or {}).values()
                 for peer, server in assessment.servers.items() if server.confirmed}
    reachability = judged_reachability(reachability, assessments or {})  # as the assessments judged it
    peers = sorted(set(names) | {p for p, check in reachability.items() if check.kind == "server"} | set(scores)
                   | set(wrong) | set(failing) | set(known))
    return tuple(
        core.PeerView(peer_id=peer, public_name=names.get(peer) or (known[peer][0] if peer in known else None),
                      state=states.get(peer),
                      reachable=_reachable(reachability.get(peer)),
                      reachability_error=reachability[peer].error if peer in reachability else None,
                      score=scores[peer].score if peer in scores else None,
                      wrong_outputs=wrong.get(peer), failing=failing.get(peer), confirmed=peer in confirmed,
                      models=tuple(sorted(models[peer])) if peer in models else known.get(peer, (None, ()))[1])
        for peer in peers if peer
    )


def model_causes(assessment, lost, names: dict[str, str]) -> tuple[core.Cause, ...]:
    """The servers behind a model's state, each with its cause as the stored assessment judged it:
    its servers of the last hour that do not serve now (``lost``: (peer id, name); LEFT when it
    announces OFFLINE or JOINING or no poll shows it) and the ones it measured slow."""
    causes = []
    for peer, name in lost:
        server = assessment.servers.get(peer)
        if server is None or server.cause in (CAUSE_OFFLINE, CAUSE_JOINING):
            causes.append(core.Cause(peer, name or names.get(peer), core.LEFT, seen=assessment.poll_at))
        else:
            causes.append(core.Cause(peer, name or names.get(peer), server.cause, server.confirmed))
    causes += [core.Cause(peer, names.get(peer), CAUSE_SLOW, server.confirmed)
               for peer, server in sorted(assessment.servers.items()) if server.cause == CAUSE_SLOW]
    return tuple(causes)


def read_view(store, settings, watching_since: float, now: float, needs_peers: bool = True,
              watched: Optional[WatchedPeers] = None, targets: tuple[str, ...] = ()) -> core.SwarmView:
    """The latest successful poll, its assessments (with the servers each model lost and whether its
    state rests on confirmed verdicts), the latest reachability checks and scores (read in one
    transaction, ``Store.latest_state``), as a SwarmView: every verdict as the assess step stored it,
    so a poller that takes over reads what the leader read. ``watched``: the watched ``targets`` no
    poll or lost server shows, looked up once."""
    state = store.latest_state()
    snapshot = state.snapshot
    reachability = state.reachability
    assessments = state.assessments
    known = lost_known(assessments)
    if watched is not None:
        present = {v for row in (snapshot.servers if snapshot else ()) for v in (row.peer_id, row.public_name) if v}
        present |= {v for peer, (name, _) in known.items() for v in (peer, name) if v}
        known = {**watched.look_up(store, targets, present), **known}

    def model_view(model) -> core.ModelView:
        assessment = assessments[model.dht_prefix]
        return core.ModelView(dht_prefix=model.dht_prefix, name=model.name or model.dht_prefix,
                              state=assessment.state, reasons=tuple(assessment.reasons),
                              troubled=model_causes(assessment, tuple(assessment.lost.items()), names),
                              confirmed=assessment.trouble_confirmed)

    names = {row.peer_id: row.public_name for row in (snapshot.servers if snapshot else ()) if row.public_name}

    models = tuple(model_view(model) for model in (snapshot.models if snapshot else ()) if model.dht_prefix in assessments)
    configured = set(settings.resolved_initial_peers)
    bootstrap = tuple(
        core.BootstrapView(peer_id=check.peer_id or (check.address or "?"), up=check.ok, error=check.error)
        for check in reachability.values() if check.kind == "bootstrap" and check.address in configured
    )
    peers = _peer_views(snapshot, reachability, state.scores, flagged(assessments, CAUSE_WRONG),
                        flagged(assessments, CAUSE_FAILING), known, assessments) if needs_peers else ()
    return core.SwarmView(at=now, scrape_period=settings.scrape_period,
                          last_ok_poll_at=snapshot.taken_at if snapshot else None, watching_since=watching_since,
                          models=models, peers=peers, bootstrap=bootstrap)


# ---- the jobs --------------------------------------------------------------------------------


def backoff(attempts: int, first: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: first, 2×, 4× ... up to an hour."""
    return min(MAX_BACKOFF, first * 2 ** max(0, attempts - 1))


class Alerter:
    """Evaluates the rules and delivers the notices for one store (the poller's)."""

    def __init__(self, settings, store, *, stats=None, watching_since: Optional[float] = None,
                 stopping: Callable[[], bool] = lambda: False):
        """``stopping``: whether to judge and send nothing now (the scheduler shuts down, or this
        poller no longer leads: the leader does)."""
        self.settings = settings
        self.store = store
        self.stats = stats
        self.config = settings.alerts
        self.public_url = settings.public_url  # (e-mail confirmation links point there)
        self.rules = self.config.rules_in_force(settings.scrape_period)
        self.hooks: dict[str, WebhookConfig] = {hook.name: hook for hook in self.config.webhooks}
        self.watching_since = time.time() if watching_since is None else watching_since
        self.deliver_soon: Optional[Callable[[], None]] = None  # schedule_alerts: deliver() in the background
        self.stopping = stopping
        self._needs_peers = any(rule.kind in core.PEER_KINDS for rule in self.rules)
        self._targets = tuple(dict.fromkeys(t for rule in self.rules for t in rule.peers))
        self._watched = WatchedPeers()
        self.inhibit = self.config.inhibit_in_force()
        self._resent_at: dict[str, float] = {}  # Alertmanager webhook -> its latest re-send
        self._evaluating = threading.Lock()
        self._delivering = threading.Lock()
        self._pruned_at = 0.0
        self._beat_at = float("-inf")  # when the store last heard that the rules were evaluated
        self._more_to_send = threading.Event()  # a running delivery looks again before it ends
        self._owners: dict[str, list[str]] = {}  # peer id -> its owners' webhooks (read with each evaluation)

    def _webhooks_for(self, notice: core.Notice) -> list[str]:
        """The rule's webhooks, and the webhooks of the owners of the servers the notice names."""
        peers = [notice.peer] + [peer for peer, _, _ in notice.causes]
        mine = dict.fromkeys(OWNER + sid for peer in peers if peer for sid in self._owners.get(peer, ()))
        return self._webhooks_for_rule(notice.rule) + list(mine)

    def _count(self, job: str, error: Optional[BaseException] = None) -> None:
        if self.stats is not None:
            self.stats.failed(job, error) if error is not None else self.stats.ok(job)

    def evaluate(self, now: Optional[float] = None) -> Optional[core.Evaluation]:
        """One evaluation of every rule; stores what changed. None if the store failed (logged)."""
        with self._evaluating:
            if self.stopping():  # a poller shutting down judges nothing: its jobs no longer run
                return None
            now = time.time() if now is None else now
            try:
                view = read_view(self.store, self.settings, self.watching_since, now, self._needs_peers,
                                 self._watched, self._targets)
                result = core.evaluate(self.rules, view, self.store.alerts(), now, self.mutes(now))
                if result.notices:
                    with self.store.db.read("reading owners' webhooks") as conn:
                        self._owners = owners.subscribed(conn)
                if self.stopping():
                    return None
                if core.awaiting_poll(self.rules, result.alerts, view.last_ok_poll_at, now):  # back by now?
                    self.store.request_job("scrape", by="alerts", min_interval=LOOK_AGAIN,
                                           why="a server that left is due to be told: is it back?")
                if result.writes or now - self._beat_at >= core.HEARTBEAT:
                    self.store.record_alert_evaluation(result, self._webhooks_for, now,
                                                       group_wait=self.config.group_wait)
                    self._beat_at = now
                self._prune(now)
            except Exception as e:  # noqa: BLE001 - the next run tries again; nothing was half-written
                log.warning("alert evaluation failed: %s", short_error(e))
                self._count("alerts", e)
                return None
            self._count("alerts")
        for notice in result.notices:
            log.info("alert %s: %s", notice.event, notice.summary)
        for notice in result.held:
            log.info("alert %s held (%s): %s", notice.event, notice.held, notice.summary)
        if result.notices:
            self._more_to_send.set()
            if self.deliver_soon is not None:
                self.deliver_soon()
        return result

    def mutes(self, now: float) -> muting.Mutes:
        """The silences and maintenance windows not over yet, and the inhibition rules."""
        return muting.Mutes(silences=tuple(self.store.silences(ending_after=now)),
                            windows=tuple(self.store.maintenance_windows(ending_after=now)), inhibit=self.inhibit)

    def _prune(self, now: float) -> None:
        if now - self._pruned_at >= PRUNE_EVERY:
            self.store.prune_alerts(now - self.config.history_days * DAY)
            self._pruned_at = now

    def deliver(self, now: Optional[float] = None) -> dict[str, int]:
        """Send what is due, per webhook in order, stopping at its first failure or not-yet-due retry
        (a later notice never overtakes an earlier one). Returns counts of this run."""
        counts = {"delivered": 0, "retry": 0, "failed": 0}
        if self.stopping():
            return counts  # what is pending stays in the store: the next poller sends it
        if not self._delivering.acquire(blocking=False):
            self._more_to_send.set()
            return counts  # a run is under way: it looks again before it ends
        try:
            while True:
                self._more_to_send.clear()
                self._deliver_due(now, counts)
                if not self._more_to_send.is_set() or now is not None:
                    break
        except Exception as e:  # noqa: BLE001 - database away: the next run tries again
            log.warning("alert delivery failed: %s", short_error(e))
            self._count("alert-delivery", e)
        finally:
            self._delivering.release()
        return counts

    def _deliver_due(self, now: Optional[float], counts: dict[str, int]) -> None:
        """One pass over the pending deliveries; ``now``: the clock (a test's), else the real one.
        A webhook's first due delivery goes with the ones made with it (within ``group_wait``)."""
        self._send_confirmations(time.time() if now is None else now)
        blocked: set[str] = set()
        pending = self.store.pending_alert_deliveries(limit=DELIVERIES_PER_RUN)
        done: set[int] = set()
        for index, delivery in enumerate(pending):
            at = time.time() if now is None else now
            if delivery.id in done or delivery.webhook in blocked or self.stopping():
                continue
            if delivery.next_attempt_at is not None and delivery.next_attempt_at > at:
                blocked.add(delivery.webhook)
                continue
            group = [delivery] + [
                d for d in pending[index + 1:] if d.webhook == delivery.webhook and d.id not in done
                and d.created_at <= delivery.created_at + self.config.group_wait][:webhooks.MAX_GROUP - 1]
            done.update(d.id for d in group)
            outcome = self._attempt(group, at)
            counts[outcome] += len(group)
            if outcome != "delivered":
                blocked.add(delivery.webhook)
        at = time.time() if now is None else now
        self._resend_firing({d.webhook for d in pending}, at)

    def _attempt(self, group: list, at: float) -> str:
        """One attempt at deliveries to one webhook as one message, recorded for each; "delivered",
        "retry" or "failed" (given up)."""
        first = group[0]
        if first.webhook.startswith(OWNER):
            return self._attempt_owner(group, at)
        hook = self.hooks.get(first.webhook)
        try:
            if hook is None:
                raise webhooks.DeliveryError(f"no webhook named {first.webhook!r} is configured any more")
            if hook.resolved_format == "apprise":
                title, text = apprise_notify.text([d.notice for d in group], self.config.dashboard_url)
                apprise_notify.send(hook.url, title, text, timeout=hook.timeout)
            else:
                body = webhooks.group_payload([(d.event_id, d.notice) for d in group], hook.resolved_format,
                                              self.config.dashboard_url, now=at, ttl=self._ttl)
                webhooks.send(hook.endpoint, body, timeout=hook.timeout, headers=hook.headers)
        except webhooks.DeliveryError as e:
            return self._attempted(group, at, e, give_up=hook is None)
        return self._attempted(group, at, None)

    def _attempt_owner(self, group: list, at: float) -> str:
        """To a server owner's webhook (``owner_hooks``: public addresses only), the generic body."""
        first = group[0]
        with self.store.db.read("reading an owner's webhook") as conn:
            url = owners.subscription_url(conn, first.webhook[len(OWNER):])
        try:
            if url is None:
                raise webhooks.DeliveryError("the owner ended this subscription")
            if url.startswith("mailto:"):
                if not self.config.owner_email:
                    raise webhooks.DeliveryError("the operator no longer sends e-mail (owner_email is unset)")
                title, text = apprise_notify.text([d.notice for d in group], self.config.dashboard_url)
                apprise_notify.send(apprise_notify.to(self.config.owner_email, url[len("mailto:"):]), title, text,
                                    timeout=OWNER_TIMEOUT)
                return self._attempted(group, at, None)
            body = webhooks.group_payload([(d.event_id, d.notice) for d in group], "generic",
                                          self.config.dashboard_url, now=at, ttl=self._ttl)
            owner_hooks.send(url, body, timeout=OWNER_TIMEOUT, allow_private=self.config.owner_webhooks_private)
        except webhooks.DeliveryError as e:
            return self._attempted(group, at, e, give_up=url is None)
        return self._attempted(group, at, None)

    def _send_confirmations(self, at: float) -> None:
        """The link of each e-mail subscription not sent one yet (``store.owners.to_confirm``); one
        that cannot be sent is tried again at the next pass, for a day at most."""
        if not self.config.owner_email or not self.public_url:
            return
        with self.store.db.write("sending owners' confirmation links") as conn:
            pending = owners.to_confirm(conn, at)
        for sid, address, code in pending:
            link = f"{self.public_url.rstrip('/')}/api/v1/owners/subscriptions/{sid}/confirm?code={code}"
            try:
                apprise_notify.send(apprise_notify.to(self.config.owner_email, address),
                                    "Confirm your petals server notices",
                                    f"Someone asked {self.public_url} to e-mail this address when their petals "
                                    f"servers are in trouble. To confirm, open: {link} - if it was not you, "
                                    f"ignore this message.", timeout=OWNER_TIMEOUT)
            except webhooks.DeliveryError as e:
                log.warning("an owner's confirmation e-mail was not sent (tried again later): %s", e)
                with self.store.db.write("an owner's confirmation to send again") as conn:
                    owners.not_sent(conn, sid, at)

    def _attempted(self, group: list, at: float, error: Optional[Exception], give_up: bool = False) -> str:
        """Records one attempt for each delivery of ``group``: delivered, to retry with backoff, or given up."""
        if error is None:
            for delivery in group:
                self.store.record_alert_delivery(delivery.id, ok=True, at=at)
            return "delivered"
        attempts = group[0].attempts + 1
        give_up = give_up or attempts >= self.config.max_attempts
        retry_at = None if give_up else at + backoff(attempts, self.config.retry_backoff)
        log.warning("alert delivery to %s failed (attempt %d of %d%s): %s", group[0].webhook, attempts,
                    self.config.max_attempts, ", giving up" if give_up else "", error)
        for delivery in group:
            self.store.record_alert_delivery(delivery.id, ok=False, at=at, error=str(error), retry_at=retry_at)
        return "failed" if give_up else "retry"

    @property
    def _ttl(self) -> float:
        """How long an Alertmanager keeps a firing alert without hearing of it again: four re-sends."""
        return 4 * self.config.alertmanager_resend

    def _resend_firing(self, waiting: set[str], at: float) -> None:
        """Alertmanager webhooks with nothing waiting in the outbox (a re-send never overtakes a
        notice) hear again of every alert they were told fires, every ``alertmanager_resend``."""
        due = [hook for hook in self.config.webhooks if hook.resolved_format == "alertmanager"
               and hook.name not in waiting and at - self._resent_at.get(hook.name, float("-inf"))
               >= self.config.alertmanager_resend]
        if not due or self.stopping():
            return
        told = [a for a in self.store.alerts().values() if a.status == core.FIRING and a.announced_state is not None]
        for hook in due:
            self._resent_at[hook.name] = at
            mine = [core.Notice(rule=a.rule, kind=a.kind, subject=a.subject, label=a.label, event=core.REPEATED,
                                state=a.state, severity=a.severity, summary=a.summary, at=at, since=a.since,
                                details=a.details, models=a.models, peer=a.peer, peer_name=a.peer_name,
                                causes=core.told_causes(a))
                    for a in told if hook.name in self._webhooks_for_rule(a.rule)]
            if not mine:
                continue
            try:
                body = webhooks.resend_payload(mine, self.config.dashboard_url, now=at, ttl=self._ttl)
                webhooks.send(hook.endpoint, body, timeout=hook.timeout, headers=hook.headers)
            except webhooks.DeliveryError as e:
                log.warning("re-sending %d firing alerts to Alertmanager webhook %s failed: %s", len(mine),
                            hook.name, e)
                self._count("alert-delivery", e)

    def _webhooks_for_rule(self, rule: str) -> list[str]:
        return [hook.name for hook in self.config.webhooks_for(rule)]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def running_alerter(ctx) -> Alerter:
    """The alerter of a running poller (the runner's, at its start): it judges and sends nothing
    while the poller stops or does not lead (the leader does), and a notice's first delivery
    attempt runs at once in a thread of its own."""
    found = Alerter(ctx.settings, ctx.store, stats=ctx.stats, stopping=lambda: ctx.stopping or not ctx.leads())
    found.deliver_soon = lambda: threading.Thread(target=found.deliver, name="alert-delivery", daemon=True).start()
    return found


def _alerter(ctx) -> Alerter:
    return ctx.alerter or Alerter(ctx.settings, ctx.store, stats=ctx.stats)


def alerts(ctx) -> Optional[core.Evaluation]:
    """The ``alerts`` job: every rule evaluated over the stored state; what changed stored."""
    return _alerter(ctx).evaluate()


def alert_delivery(ctx):
    """The ``alert-delivery`` job: the pending notices sent (retries with backoff)."""
    return _alerter(ctx).deliver()
