"""One settings object for the whole service: defaults, then an optional TOML file, then env vars.

Every setting can come from the TOML file (``--config`` or ``SWARM_MONITOR_CONFIG``) or from an
environment variable ``SWARM_MONITOR_<NAME>`` (lists comma-separated). Settings are validated at
start: an invalid one stops the service with a message naming it.

It sits at the top of the package, beside ``compat``, because every layer reads it (the web, the
poller, the chat, the harness) and none of them may import another's modules for it.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from monitor.alert_settings import AlertSettings
from monitor.core.generation import compile_expect
from monitor.core.leadership import default_lease_seconds

ENV_PREFIX = "SWARM_MONITOR_"

# petals' PUBLIC_INITIAL_PEERS (petals/constants.py, 2.2.0.post1), what ``initial_peers = ["public"]``
# stands for. Kept here so that no layer imports petals (and torch) to read a setting: a web worker
# watching the public swarm stays a small process. tests/test_settings.py checks it equal to petals'.
PUBLIC_INITIAL_PEERS = (
    "/dns/bootstrap1.petals.dev/tcp/31337/p2p/QmedTaZXmULqwspJXz44SsPZyTNKxhnnFvYRajfH7MGhCY",
    "/dns/bootstrap2.petals.dev/tcp/31338/p2p/QmQGTqmM7NKjV6ggU1ZCap8zWiyKR89RViDXiqehSiCpY5",
    "/dns6/bootstrap1.petals.dev/tcp/31337/p2p/QmedTaZXmULqwspJXz44SsPZyTNKxhnnFvYRajfH7MGhCY",
    "/dns6/bootstrap2.petals.dev/tcp/31338/p2p/QmQGTqmM7NKjV6ggU1ZCap8zWiyKR89RViDXiqehSiCpY5",
    "/ip4/159.89.214.152/tcp/31337/p2p/QmedTaZXmULqwspJXz44SsPZyTNKxhnnFvYRajfH7MGhCY",
    "/ip4/159.203.156.48/tcp/31338/p2p/QmQGTqmM7NKjV6ggU1ZCap8zWiyKR89RViDXiqehSiCpY5",
)

# Settings renamed so that one word means one thing (README: Glossary): the old names still load,
# with a warning in the log, so an existing monitor.toml keeps working.
RENAMED = {
    "probe_period": "reachability_period",
    "probe_timeout": "reachability_timeout",
    "probe_concurrency": "reachability_concurrency",
}


class SettingsError(ValueError):
    """A setting is invalid; the message names it, its value, and what is expected."""


class ModelConfig(BaseModel):
    """A model to watch. ``path`` is a local checkpoint with client files (config, tokenizer,
    embeddings), needed only to chat with it (and for its generation check). ``expect``: a regular
    expression the generation check's answer must contain (case-insensitive; e.g. "Paris" for the
    default prompt); none: any answer is ok."""

    model_config = ConfigDict(extra="forbid")

    dht_prefix: str = Field(min_length=1, max_length=200)
    num_blocks: Optional[int] = Field(default=None, gt=0, le=10_000)
    repository: Optional[str] = None
    name: Optional[str] = None
    path: Optional[Path] = None
    expect: Optional[str] = None

    @field_validator("expect")
    @classmethod
    def _check_expect(cls, expect: Optional[str]) -> Optional[str]:
        compile_expect(expect)
        return expect or None


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    data_dir: Path = Path(os.path.expanduser("~/.cache/petals-swarm-monitor"))
    # Multiaddrs of the swarm's bootstrap peers; "public" means petals' PUBLIC_INITIAL_PEERS.
    # Empty: the embedded demo swarm fills them in.
    initial_peers: list[str] = []
    models: list[ModelConfig] = []
    discover_models: bool = True  # also watch every model announced under `_petals.models`

    scrape_period: float = Field(default=60, gt=0)
    reachability_period: float = Field(default=60, gt=0)
    reachability_timeout: float = Field(default=5, gt=0)
    reachability_concurrency: int = Field(default=32, gt=0, le=1024)
    scrape_batch_blocks: int = Field(default=256, gt=0)  # blocks per DHT call (keeps pickles small)
    score_period: float = Field(default=300, gt=0)  # peer scores read a week of history
    rollup_period: float = Field(default=3600, gt=0)

    database_url: Optional[str] = None  # default: SQLite file in data_dir
    # Several pollers on one PostgreSQL database (README: High availability): the leader holds a
    # lease this long, renewed every quarter of it; a standby takes over within 1.5 leases of the
    # leader's loss. Default: half a scrape period (at least 2 s)
    leader_lease_seconds: Optional[float] = Field(default=None, gt=0, le=3600)
    # A dead man's switch: the leader requests this URL (GET) after each successful poll, so an
    # outside service (healthchecks.io, Uptime Kuma's push monitors, ...) pages when the pings stop
    heartbeat_url: Optional[str] = Field(default=None, max_length=2000)
    raw_retention_days: float = Field(default=2, gt=0)
    rollup_retention_days: float = Field(default=90, gt=0)

    # Diagnosis thresholds
    min_tokens_per_s: float = Field(default=1.0, ge=0)  # best route slower than this -> degraded
    min_cache_tokens: int = Field(default=1024, ge=0)  # a block's cache headroom below -> degraded

    # Web
    host: str = "127.0.0.1"
    port: int = Field(default=5000, ge=0, le=65535)
    refresh_seconds: int = Field(default=10, ge=1)

    # Security (README: Security)
    admin_token: Optional[str] = Field(default=None, min_length=16, max_length=512)  # operators' token
    admin_token_file: Optional[Path] = None  # else <data_dir>/admin_token, generated at first start
    # Host headers accepted; empty: the listen address, localhost, 127.0.0.1 and [::1]
    trusted_hosts: list[str] = []
    # Origins whose pages may call the chat APIs from a browser (CORS, no credentials): "*" (any,
    # as chat.petals.dev) or "https://example.org"; read-only APIs, badges and feeds answer any origin
    chat_cors_origins: list[str] = ["*"]
    proxy_hops: int = Field(default=0, ge=0, le=8)  # >0: behind that many TLS reverse proxies (ProxyFix)
    max_request_bytes: int = Field(default=1_000_000, ge=1024, le=100_000_000)  # bodies and WebSocket messages
    chat_rate_limit: str = "30 per minute; 300 per hour"  # per client, on every chat API
    reachability_rate_limit: str = "6 per minute"  # per client, live checks of a peer
    rate_limit_storage: str = "memory://"  # Flask-Limiter storage; e.g. redis://... for several workers
    ws_idle_timeout: float = Field(default=300, gt=0, le=86400)  # seconds a WebSocket may stay silent
    ws_max_lifetime: float = Field(default=3600, gt=0, le=7 * 86400)  # seconds a WebSocket may last
    history_max_points: int = Field(default=2000, ge=10, le=100_000)  # per series in history APIs

    # Alerts (README: Alerts): rules evaluated after every scrape and probe round, notices to
    # webhooks ([alerts], [[alerts.rules]], [[alerts.webhooks]]; validated in app/alert_settings.py)
    alerts: AlertSettings = AlertSettings()

    # Chat limits (README: Security): what one visitor may send to the chat and keep in it
    max_prompt_chars: int = Field(default=100_000, ge=100, le=10_000_000)  # checked before tokenizing
    chat_conversations_per_visitor: int = Field(default=4, ge=1, le=1000)  # chat page, kept in memory
    chat_max_visitors: int = Field(default=500, ge=1, le=1_000_000)  # the least recently active idle one goes
    # the chat page's conversations in the store (chat/conversations.py): per visitor, bounded
    chat_keep_conversations: bool = True  # off: nothing is stored, and the page says so
    chat_conversation_retention_days: float = Field(default=30, gt=0, le=3650)  # after the last message
    chat_conversations_kept: int = Field(default=100, ge=1, le=10_000)  # per visitor
    chat_conversation_max_chars: int = Field(default=200_000, ge=1000, le=10_000_000)  # of one conversation
    chat_new_visitors_per_address: int = Field(default=20, ge=1, le=100_000)  # a day, from one address
    chat_conversations_in_all: int = Field(default=100_000, ge=1, le=100_000_000)  # every visitor's together

    # Measured speed and correctness (README: Measured speed and correctness): server probes
    # Compute checks (monitor/core/compute_checks.py): one token through the first block of every
    # ONLINE server's span each period (a failed one confirmed 2 s later): names a server that died,
    # froze or fails every step within a period and a few seconds
    compute_check_period: float = Field(default=20, gt=0)
    compute_check_timeout: float = Field(default=5, gt=0, le=120)  # seconds for its answer
    compute_check_concurrency: int = Field(default=16, gt=0, le=256)  # checks at once, all servers
    speed_probe_period: float = Field(default=100, gt=0)  # each server probed once per period (a verdict-changing probe confirmed after half)
    speed_probe_timeout: float = Field(default=10, gt=0, le=600)  # seconds per step of a probe session
    speed_probe_concurrency: int = Field(default=12, gt=0, le=64)  # probe sessions at once, all servers (500 servers in ~85 s)
    speed_probe_max_share: float = Field(default=0.02, gt=0, le=0.5)  # of a server's time, at most
    correctness_checks: bool = True  # outputs vs the monitor's own blocks (models with a path) or vs peers

    # Generation checks (monitor/app/generation_check.py): every model with a path generates
    # generation_check_tokens tokens of generation_check_prompt (greedy, in the model's chat format)
    # through the chat's own engine and routing once per period, outside the users' chat places; its
    # cost on the swarm is one short session per model per period (a prompt of some 20 tokens and 8
    # new ones every 300 s); ModelConfig.expect: what the answer must contain
    generation_check_period: float = Field(default=300, gt=0)
    generation_check_tokens: int = Field(default=8, ge=1, le=64)
    generation_check_prompt: str = Field(default="What is the capital of France?", min_length=1, max_length=2000)

    # Peer search and "my server" (README: Dashboard): the search box on every page
    search_max_results: int = Field(default=20, ge=1, le=100)  # peers one search answers with

    # Chat
    routing: Literal["health", "default"] = "health"
    min_peer_score: float = Field(default=30, ge=0, le=100)
    pinned_peers: list[str] = []
    blocked_peers: list[str] = []
    # Chat capacity (README: Chat capacity; chat/capacity.py): generation slots are held only while
    # an answer is computed, kept-open sessions (chat.petals.dev's WebSocket, one per tab) are bounded
    # apart; waiting requests are served per client in turn
    max_chat_sessions: int = Field(default=4, gt=0, le=1024)  # generation slots: answers computed at once
    chat_queue_size: int = Field(default=32, ge=0, le=100_000)  # requests waiting for a slot (a thread each)
    chat_queue_timeout: float = Field(default=60, gt=0, le=3600)  # seconds one may wait, then 429
    max_slots_share: float = Field(default=0.5, gt=0, le=1)  # of the slots (and queue) one client holds
    max_open_sessions: int = Field(default=32, ge=1, le=100_000)  # kept open; the LRU idle one makes room
    max_sessions_per_client: int = Field(default=4, ge=1, le=10_000)  # kept open by one client
    max_batch_rows: int = Field(default=16, ge=1, le=256)  # answers of one request (prompts × n)
    max_logprobs: int = Field(default=20, ge=0, le=100)  # alternatives per token (top_logprobs)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        if isinstance(values, dict) and any(old in values for old in RENAMED):
            import logging

            values = dict(values)
            for old, new in RENAMED.items():
                if old in values:
                    logging.getLogger(__name__).warning("setting %r is now called %r", old, new)
                    values.setdefault(new, values.pop(old))
        return values

    @field_validator("initial_peers")
    @classmethod
    def _check_peers(cls, peers: list[str]) -> list[str]:
        if peers == ["public"]:
            return peers
        for peer in peers:
            if not peer.startswith("/") or "/p2p/" not in peer:
                raise ValueError(f"{peer!r} is not a multiaddr like /ip4/1.2.3.4/tcp/31337/p2p/Qm...")
        return peers

    @property
    def resolved_initial_peers(self) -> list[str]:
        if self.initial_peers == ["public"]:
            return list(PUBLIC_INITIAL_PEERS)
        return list(self.initial_peers)

    @field_validator("heartbeat_url")
    @classmethod
    def _check_heartbeat_url(cls, url: Optional[str]) -> Optional[str]:
        if url and not (url.startswith("http://") or url.startswith("https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url or None

    @property
    def resolved_leader_lease_seconds(self) -> float:
        return self.leader_lease_seconds or default_lease_seconds(self.scrape_period)

    @property
    def resolved_trusted_hosts(self) -> list[str]:
        """Host names a request's Host header may name (ports are not compared)."""
        if self.trusted_hosts:
            return list(self.trusted_hosts)
        hosts = ["localhost", "127.0.0.1", "[::1]", "::1"]
        if self.host not in ("0.0.0.0", "::", ""):
            hosts.insert(0, self.host)
        return hosts

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'monitor.db'}"


_LIST_FIELDS = {"initial_peers", "pinned_peers", "blocked_peers", "trusted_hosts", "chat_cors_origins"}


def _from_env(environ) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in [*Settings.model_fields, *RENAMED]:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        if name in _LIST_FIELDS:
            values[name] = [item.strip() for item in raw.split(",") if item.strip()]
        elif name == "models":
            values[name] = json.loads(raw)
        else:
            values[name] = raw
    return values


def load_settings(config_file: Optional[Path] = None, environ=None, **overrides) -> Settings:
    """Build the settings; raise SettingsError naming the first invalid setting."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        path = Path(config_file)
        try:
            values.update(tomllib.loads(path.read_text()))
        except FileNotFoundError:
            raise SettingsError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"config file {path} is not valid TOML: {e}") from None
    try:
        values.update(_from_env(environ))
    except json.JSONDecodeError as e:
        raise SettingsError(f"{ENV_PREFIX}MODELS must be a JSON list of models: {e}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**values)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise SettingsError(
            f"invalid setting {where!r}: {first['msg']} (got {first.get('input')!r})"
        ) from None
