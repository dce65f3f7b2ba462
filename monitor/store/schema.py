"""The schema: one SQLModel class per table, and nothing else. The classes are the schema (there
is no second list of tables): queries use ``Class.__table__`` at the point of use, and Alembic's
revisions in ``migrations/`` must match these classes exactly (``tests/test_store.py`` checks it).
The operators' tables (silences, maintenance, pollers, notes, job requests) live in
``schema_operations``, the contribution ledger's in ``schema_ledger``; both are re-exported here, so
every table is importable from this module.

Times are unix seconds (float), as in ``core/snapshot.py``. Peers are interned (``peers.id``), so
the hot tables carry a small integer key rather than a 52-character peer id.
"""

from __future__ import annotations

from typing import Any, Optional

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from monitor.store.schema_types import PEER_POLICIES, BigId, _json_field, metadata  # noqa: F401  (re-exported)

# ---- tables ----------------------------------------------------------------------------------


class Peer(SQLModel, table=True):
    """Every peer ever seen (announced, checked for reachability, or chatted with); ``id`` is the key
    other tables use."""

    __tablename__ = "peers"
    __table_args__ = (sa.UniqueConstraint("peer_id"), sa.Index(None, "public_name"))  # (name: peer search)
    id: Optional[int] = Field(default=None, primary_key=True)
    peer_id: str
    first_seen: Optional[float] = None  # first/last poll that saw it announce (None: never announced)
    last_seen: Optional[float] = None
    public_name: Optional[str] = None  # the last one it announced


class WatchedModel(SQLModel, table=True):
    __tablename__ = "models"
    dht_prefix: str = Field(primary_key=True)
    num_blocks: int
    repository: Optional[str] = None
    name: Optional[str] = None
    official: bool = False
    first_seen: float
    last_seen: float


class Poll(SQLModel, table=True):
    __tablename__ = "polls"
    __table_args__ = (sa.Index(None, "at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    at: float
    duration: float = 0.0
    n_models: int = 0
    n_servers: int = 0
    invalid_records: int = 0
    errors: Any = _json_field()  # list of strings
    models: Any = _json_field()  # the polled models' dht_prefixes, in order
    ok: bool = True
    # added by revision 0005: announced values bounded (swarm/announce.py, and non-finite ones the
    # store nulled), and rows of this poll the database refused (named in ``errors``)
    clamped_values: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    dropped_rows: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    ledger_basis: Any = _json_field()  # what each server earns until the next poll (core/contributions.py basis; 0026)


class ServerObservationRow(SQLModel, table=True):
    __tablename__ = "server_observations"
    __table_args__ = (sa.Index(None, "poll_id"), sa.Index(None, "peer", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    poll_id: int = Field(foreign_key="polls.id")
    at: float
    model: str
    peer: int = Field(foreign_key="peers.id")
    state: str
    start: int
    end: int
    throughput: Optional[float] = None
    inference_rps: Optional[float] = None
    forward_rps: Optional[float] = None
    network_rps: Optional[float] = None
    cache_tokens_left: Optional[int] = Field(default=None, sa_type=sa.BigInteger)
    version: Optional[str] = None
    torch_dtype: Optional[str] = None
    quant_type: Optional[str] = None
    using_relay: Optional[bool] = None
    public_name: Optional[str] = None
    adapters: Any = _json_field()  # list of strings; NULL when none


class ServerPingsRow(SQLModel, table=True):
    """A server's announced RTTs to the next servers; kept ``writes.PINGS_RETENTION`` (an hour) only."""

    __tablename__ = "server_pings"
    __table_args__ = (sa.Index(None, "poll_id"),)
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    poll_id: int = Field(foreign_key="polls.id")
    at: float
    peer: int = Field(foreign_key="peers.id")
    model: str
    next_pings: Any = _json_field()


class ModelStatusRow(SQLModel, table=True):
    __tablename__ = "model_status"
    __table_args__ = (sa.Index(None, "poll_id"), sa.Index(None, "model", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    poll_id: int = Field(foreign_key="polls.id")
    at: float
    model: str
    state: str
    reasons: Any = _json_field()
    coverage_pct: Optional[float] = None
    servers_online: Optional[int] = None
    min_redundancy: Optional[int] = None
    est_tokens_per_s: Optional[float] = None


class BlockCoverageRow(SQLModel, table=True):
    """One poll's per-block coverage of one model: arrays indexed by block."""

    __tablename__ = "block_coverage"
    __table_args__ = (sa.Index(None, "model", "at"),)
    poll_id: int = Field(foreign_key="polls.id", primary_key=True)
    model: str = Field(primary_key=True)
    at: float
    servers: Any = _json_field()  # serving servers per block
    throughput: Any = _json_field()  # their total throughput per block


class ModelStateChangeRow(SQLModel, table=True):
    """A model's state changed between two consecutive polls (kept as long as the rollups)."""

    __tablename__ = "model_state_changes"
    __table_args__ = (sa.Index(None, "model", "at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    at: float
    model: str
    from_state: Optional[str] = None  # None: the first status recorded for the model
    to_state: str
    reasons: Any = _json_field()


class ReachabilityCheckRow(SQLModel, table=True):
    """One reachability check of one peer (``core.snapshot.ReachabilityResult``); renamed from
    ``probe_results`` by revision 0022 (``latest_probes`` and ``hourly_probes`` too)."""

    __tablename__ = "reachability_results"
    __table_args__ = (sa.Index(None, "peer", "at"), sa.Index(None, "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    peer: int = Field(foreign_key="peers.id")
    kind: str
    ok: bool
    rtt: Optional[float] = None
    error: Optional[str] = None
    joining: bool = False
    address: Optional[str] = None


class LatestReachabilityRow(SQLModel, table=True):
    """Each peer's latest reachability check, so ``latest.latest_reachability`` reads a few hundred rows,
    not the history."""

    __tablename__ = "latest_reachability"
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    at: float
    kind: str
    ok: bool
    rtt: Optional[float] = None
    error: Optional[str] = None
    joining: bool = False
    address: Optional[str] = None


class ChatOutcomeRow(SQLModel, table=True):
    """What one chat request saw of one peer's span; written by the chat (its own process or thread)."""

    __tablename__ = "chat_outcomes"
    __table_args__ = (sa.Index(None, "peer", "at"), sa.Index(None, "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    peer: int = Field(foreign_key="peers.id")
    model: str
    start: int
    end: int
    ok: bool
    seconds_per_token: Optional[float] = None
    error: Optional[str] = None  # added by revision 0002


class PeerScoreRow(SQLModel, table=True):
    """Each peer's latest score (the score job recomputes them from history every score period)."""

    __tablename__ = "peer_scores"
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    at: float
    score: float
    explanation: Any = _json_field()  # list of sentences
    components: Any = _json_field()  # name -> {value, weight, points}, as PeerScore.to_dict() has them


class PeerPolicyRow(SQLModel, table=True):
    """An operator's routing decision about one peer, "pinned" or "blocked": written by the web (the
    peer page), read by the chat's router."""

    __tablename__ = "peer_policies"
    peer_id: str = Field(primary_key=True, max_length=128)
    policy: str = Field(max_length=16)
    at: float


class AssessmentRow(SQLModel, table=True):
    """Each model's assessment (``Assessment.to_dict()``) per poll: written with the poll and
    replaced whenever a later input of the same poll is stored (the newest is the one read), so
    every reader reads one verdict and web workers show it without running petals' routing. Kept
    for ``ASSESSMENT_RETENTION`` (the history of states lives in ``model_status``)."""

    __tablename__ = "assessments"
    poll_id: int = Field(sa_type=BigId, primary_key=True)
    model: str = Field(primary_key=True, max_length=256)
    at: float = Field(index=True)  # when it was assessed (its ``assessed_at``)
    assessment: Any = _json_field()


class StoreMetaRow(SQLModel, table=True):
    """Key/value bookkeeping: ``rolled_up_until`` (the rollup watermark; writes into an hour before
    it move it back) and ``raw_pruned_until`` (raw rows before it are gone)."""

    __tablename__ = "store_meta"
    key: str = Field(primary_key=True)
    value: str


# ---- alerts (revision 0006): the evaluator's memory, every notice, and its deliveries ------


class AlertRow(SQLModel, table=True):
    """An alert pending or firing, one per rule and subject (``core/alerts.py``'s ``Alert``): kept
    here so that a restarted poller neither repeats a notice nor forgets one."""

    __tablename__ = "alerts"
    rule: str = Field(primary_key=True, max_length=100)
    subject: str = Field(primary_key=True, max_length=256)
    kind: str = Field(max_length=32)
    label: str = Field(max_length=400)
    status: str = Field(max_length=16)  # pending | firing
    state: str = Field(max_length=32)
    severity: str = Field(max_length=16)
    summary: str = Field(max_length=400)
    details: Any = _json_field()  # list of strings
    since: float
    fired_at: Optional[float] = None
    notified_at: Optional[float] = None
    next_state: Optional[str] = Field(default=None, max_length=32)
    next_since: Optional[float] = None
    # added by revision 0013: what the alert concerns (labels), why it is held, what was told
    models: Any = _json_field()  # list of DHT prefixes
    peer: Optional[str] = Field(default=None, max_length=128)
    peer_name: Optional[str] = Field(default=None, max_length=200)
    held: Any = _json_field()  # list of reasons (``core/muting.py``)
    announced_state: Optional[str] = Field(default=None, max_length=32)
    causes: Any = _json_field()  # a model alert's servers behind it: [[peer id, name, why, since, told], ...]
    clear_since: Optional[float] = None  # (revision 0017) fired on confirmation, clear since


class AlertEventRow(SQLModel, table=True):
    """Every notice an alert gave (firing, changed, repeat, resolved): the alerts' history, kept
    ``alerts.history_days``."""

    __tablename__ = "alert_events"
    __table_args__ = (sa.Index(None, "at"),)
    id: Optional[int] = Field(default=None, primary_key=True)
    at: float
    rule: str = Field(max_length=100)
    subject: str = Field(max_length=256)
    kind: str = Field(max_length=32)
    label: str = Field(max_length=400)
    event: str = Field(max_length=16)
    state: str = Field(max_length=32)
    previous_state: Optional[str] = Field(default=None, max_length=32)
    severity: str = Field(max_length=16)
    summary: str = Field(max_length=400)
    details: Any = _json_field()
    since: float
    # added by revision 0013
    models: Any = _json_field()
    peer: Optional[str] = Field(default=None, max_length=128)
    peer_name: Optional[str] = Field(default=None, max_length=200)
    held: Optional[str] = Field(default=None, max_length=300)  # why it was not sent (NULL: it was)
    causes: Any = _json_field()  # (revision 0024) a model notice's told servers: [[peer id, name, cause], ...]


class AlertDeliveryRow(SQLModel, table=True):
    """One notice to one webhook (the outbox): written with the notice, in its transaction, then
    sent, retried with backoff, or given up; the dashboard shows the ones that failed."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (sa.Index(None, "status", "next_attempt_at"), sa.Index(None, "event_id"))
    id: Optional[int] = Field(default=None, primary_key=True)
    event_id: int = Field(foreign_key="alert_events.id")
    webhook: str = Field(max_length=100)
    status: str = Field(max_length=16)  # pending | delivered | failed
    attempts: int = 0
    created_at: float
    next_attempt_at: Optional[float] = None
    last_attempt_at: Optional[float] = None
    delivered_at: Optional[float] = None
    last_error: Optional[str] = Field(default=None, max_length=300)


# ---- server probes (revision 0007): measured speed and correctness of each server ----------


class ServerProbeRow(SQLModel, table=True):
    """One speed probe of one server's span (``core/probes.py``'s ``ServerProbe``), with its
    correctness verdict when it was checked; kept ``raw_retention_days`` like the other raw rows."""

    __tablename__ = "server_probes"
    __table_args__ = (sa.Index(None, "at"), sa.Index(None, "peer", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    peer: int = Field(foreign_key="peers.id")
    model: str = Field(max_length=256)
    start: int
    end: int
    ok: bool
    seconds_per_token: Optional[float] = None  # median 1-token step of the span, round trip included
    rtt: Optional[float] = None  # median empty step
    prefill_seconds: Optional[float] = None
    duration: Optional[float] = None  # the steps' total: the server's time the probe took
    error: Optional[str] = Field(default=None, max_length=300)
    error_kind: Optional[str] = Field(default=None, max_length=16)  # server | timeout | client; NULL: ok (or before 0010)
    verdict: Optional[str] = Field(default=None, max_length=16)  # ok | wrong | disagrees; NULL: not checked
    error_ratio: Optional[float] = None
    tolerance: Optional[float] = None
    checked_against: Optional[str] = Field(default=None, max_length=16)  # reference | peers
    detail: Optional[str] = Field(default=None, max_length=300)
    room: Optional[int] = Field(default=None, sa_type=sa.BigInteger)  # (revision 0024) announced cache tokens


# ---- compute checks (revision 0017): does each server still compute ---------------------------


class ComputeCheckRow(SQLModel, table=True):
    """One compute check (``core/compute_checks.py``'s ``ComputeCheck``): one token through one block
    of one server; kept ``compute_checks.RETENTION`` (an hour), pruned with every round."""

    __tablename__ = "compute_checks"
    __table_args__ = (sa.Index(None, "at"), sa.Index(None, "peer", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    peer: int = Field(foreign_key="peers.id")
    model: str = Field(max_length=256)
    block: int
    ok: bool
    duration: Optional[float] = None
    error: Optional[str] = Field(default=None, max_length=300)
    error_kind: Optional[str] = Field(default=None, max_length=16)  # server | timeout | client; NULL: ok
    requested_by: Optional[str] = Field(default=None, max_length=64)  # NULL: its turn


# hourly rollups: ``hour`` is the hour's start (unix seconds); rows exist for completed hours only.


class HourlyPollsRow(SQLModel, table=True):
    __tablename__ = "hourly_polls"
    hour: float = Field(primary_key=True)
    polls: int
    ok_polls: int
    mean_duration: Optional[float] = None


class HourlyObservationsRow(SQLModel, table=True):
    __tablename__ = "hourly_observations"
    __table_args__ = (sa.Index(None, "hour"),)  # (revision 0009: the scores read the last week's hours)
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    model: str = Field(primary_key=True)
    hour: float = Field(primary_key=True)
    polls: int  # ok polls in the hour since the peer was first seen
    samples: int  # of those, polls that saw it (any state)
    online: int
    joining: int
    mean_throughput: Optional[float] = None
    mean_inference_rps: Optional[float] = None
    min_start: Optional[int] = None
    max_end: Optional[int] = None
    # added by revision 0008, for the scores (store/aggregates.py); NULL for hours rolled up before:
    # pairs of consecutive ok polls of the hour whose first saw it ONLINE, and of those, the ones
    # whose second did not (it left ONLINE)
    flap_chances: Optional[int] = None
    flaps: Optional[int] = None


class HourlyModelStatusRow(SQLModel, table=True):
    __tablename__ = "hourly_model_status"
    model: str = Field(primary_key=True)
    hour: float = Field(primary_key=True)
    samples: int
    states: Any = _json_field()  # state -> polls
    worst_state: str
    reasons: Any = _json_field()  # distinct reasons seen in the hour (first 20)
    mean_coverage_pct: Optional[float] = None
    mean_servers_online: Optional[float] = None
    min_redundancy: Optional[int] = None
    mean_tokens_per_s: Optional[float] = None


class HourlyBlockCoverageRow(SQLModel, table=True):
    __tablename__ = "hourly_block_coverage"
    model: str = Field(primary_key=True)
    hour: float = Field(primary_key=True)
    samples: int
    min_servers: Any = _json_field()
    mean_servers: Any = _json_field()
    min_throughput: Any = _json_field()
    mean_throughput: Any = _json_field()


class HourlyReachabilityRow(SQLModel, table=True):
    """A peer's reachability checks per hour, kept past raw retention: what the scores count
    (``store/aggregates.py``)."""

    __tablename__ = "hourly_reachability"
    __table_args__ = (sa.Index(None, "hour"),)  # (revision 0009: the scores read the last day's hours)
    peer: int = Field(foreign_key="peers.id", primary_key=True)
    hour: float = Field(primary_key=True)
    n: int
    ok: int
    joining: int
    mean_rtt: Optional[float] = None
    # added by revision 0008 (NULL for hours rolled up before): the RTT histogram of ok checks as
    # core/quantiles.py buckets them, flat (decodes faster): [bucket, count, sum, bucket, ...], kept
    # as long as raw rows (the scores read a day of it); and the latest failure's error
    rtt_bins: Any = _json_field()
    last_error: Optional[str] = None


# ---- generation checks (revision 0011): a few tokens end to end through the chat's engine -------


class GenerationCheckRow(SQLModel, table=True):
    """One generation check of one model (``core/generation.py``'s ``GenerationCheck``); kept
    ``raw_retention_days`` like the other raw rows (one row per model per check period)."""

    __tablename__ = "generation_checks"
    __table_args__ = (sa.Index(None, "at"), sa.Index(None, "model", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    model: str = Field(max_length=256)
    ok: bool
    error: Optional[str] = Field(default=None, max_length=300)
    answer: Optional[str] = Field(default=None, max_length=300)
    expect: Optional[str] = Field(default=None, max_length=200)
    matched: Optional[bool] = None  # NULL: no pattern, or no answer
    time_to_first_token: Optional[float] = None
    tokens_per_second: Optional[float] = None
    tokens: int = 0
    duration: Optional[float] = None
    route: Any = _json_field()  # [{peer_id, start, end, error}, ...]: the spans taken, then those that failed


class RequestRow(SQLModel, table=True):
    """One request the chat served (``core/requests.py``'s ``RequestRecord``): no prompt or answer
    text; kept ``raw_retention_days`` like the other raw rows."""

    __tablename__ = "requests"
    __table_args__ = (sa.Index(None, "at"), sa.Index(None, "model", "at"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    at: float
    model: str = Field(max_length=256)
    api: str = Field(max_length=16)  # page | petals | openai
    outcome: str = Field(max_length=16)  # ok | error | cancelled
    error_kind: Optional[str] = Field(default=None, max_length=32)
    waited: Optional[float] = None
    time_to_first_token: Optional[float] = None
    tokens: int = 0
    tokens_per_second: Optional[float] = None
    failovers: int = 0
    route: Any = _json_field()  # [[peer_id, start, end], ...]
    # a follow-up (it came with its previous answer's handle), whether it continued that answer's kept
    # session, and the prompt tokens the swarm did not get again (revision 0023)
    follow_up: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})
    continued: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})
    tokens_not_resent: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    forecast: Any = _json_field()  # the forecast it was given at admission (core/calibration.py Given; revision 0025)


class HourlyRequestsRow(SQLModel, table=True):
    """An hour of a model's request rows, rolled up (``core/requests.py`` ``hour_figures``): kept
    the rollup retention, after the raw rows are gone (revision 0019)."""

    __tablename__ = "hourly_requests"
    model: str = Field(primary_key=True, max_length=256)
    hour: float = Field(primary_key=True)
    requests: int
    ok: int
    error: int
    cancelled: int
    failovers: int
    tokens: int
    quantiles: Any = _json_field()  # {"time_to_first_token": {"p50": …}, "tokens_per_second": …, "waited": …}
    bins: Any = _json_field()  # {"time_to_first_token": [count per bucket], "tokens_per_second": […]}


class RequestHopRow(SQLModel, table=True):
    """One server of a request's route (``RequestRow.route``), so that a server's figures are read
    by its own index; deleted with its request."""

    __tablename__ = "request_hops"
    __table_args__ = (sa.Index(None, "peer", "at"), sa.Index(None, "request"))
    id: Optional[int] = Field(default=None, primary_key=True, sa_type=BigId)
    request: int = Field(sa_column=sa.Column(BigId, sa.ForeignKey("requests.id", ondelete="CASCADE"), nullable=False))
    at: float
    peer: int = Field(foreign_key="peers.id")
    start: int
    end: int


# the operators' tables (their own module, re-exported: every table is a class of this schema)
from monitor.store.schema_operations import (  # noqa: E402,F401
    ChatWorkerRow,
    JobRequestRow,
    SilenceRow,
    MaintenanceWindowRow,
    MuteChangeRow,
    PollerLeaseRow,
    PollerMemberRow,
    PollerTermRow,
    IncidentNoteRow,
    IncidentNoteUpdateRow,
)
# the contribution ledger's tables (their own module, re-exported too)
from monitor.store.schema_ledger import (  # noqa: E402,F401
    ContributionDayRow, ContributionHourRow, ContributionTotalRow, OwnerNonceRow, OwnerPeerRow, OwnerRow, OwnerSubscriptionRow)


# ---- the chat page's conversations (revision 0020): per visitor, the one place text is kept -------


class ChatVisitorRow(SQLModel, table=True):
    """A visitor of the chat page (a browser, by its signed cookie): when it was first seen, from
    which address (a keyed hash: new visitors per address are bounded), and last seen."""

    __tablename__ = "chat_visitors"
    __table_args__ = (sa.Index(None, "address", "created_at"), sa.Index(None, "last_seen"))
    id: str = Field(primary_key=True, max_length=64)
    address: str = Field(max_length=64)
    created_at: float
    last_seen: float


class ChatConversationRow(SQLModel, table=True):
    """One conversation of one visitor: its title, model, system prompt and messages (``[{role,
    content, meta}]``: an answer's route and speed in ``meta``), and the lower-cased text searched."""

    __tablename__ = "chat_conversations"
    __table_args__ = (sa.Index(None, "visitor", "updated_at"), sa.Index(None, "updated_at"))
    id: str = Field(primary_key=True, max_length=32)
    visitor: str = Field(max_length=64)
    title: str = Field(max_length=200)
    model: str = Field(max_length=256)
    system: str = Field(default="", sa_type=sa.Text)
    messages: Any = _json_field()
    search_text: str = Field(default="", sa_type=sa.Text)
    chars: int = 0
    created_at: float
    updated_at: float

