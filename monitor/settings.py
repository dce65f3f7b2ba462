"""One settings object for the whole service: defaults, then an optional TOML file, then env vars.

In the TOML file (``--config`` or ``SWARM_MONITOR_CONFIG``) settings are in sections ([swarm],
[[models]], [poller], [probes], [store], [web], [security], [chat], [alerts]: each field's
``section``); the old flat form (every setting at the top) is still read, with a warning. The object
itself is flat: ``settings.scrape_period``. Every setting also comes from an environment variable
``SWARM_MONITOR_<NAME>`` (lists comma-separated; the tables ``models`` and ``alerts`` as JSON).
Every time setting takes "90s", "5m", "2h", "30d" or a number in its own unit (monitor/durations.py).
Settings are validated at start: an invalid one stops the service with a message naming it.

It sits at the top of the package, beside ``compat``, because every layer reads it (the web, the
poller, the chat, the harness) and none of them may import another's modules for it.
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from monitor.alert_settings import AlertSettings
from monitor.core.generation import compile_expect
from monitor.core.leadership import default_lease_seconds
from monitor.durations import parse_duration, unit_of

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
    "max_chat_sessions": "chat_slots",  # it counts generation slots, beside max_open_sessions' sessions
}


class SettingsError(ValueError):
    """A setting is invalid; the message names it, its value, and what is expected."""


class ModelConfig(BaseModel):
    """A model to watch. ``path`` is a local checkpoint with client files (config, tokenizer,
    embeddings), needed only to chat with it (and for its generation check). ``expect``: a regular
    expression the generation check's answer must contain (case-insensitive; e.g. "Paris" for the
    default prompt); none: any answer is ok."""

    model_config = ConfigDict(extra="forbid")

    dht_prefix: str = Field(min_length=1, max_length=200, description="the model's DHT prefix (required)")
    num_blocks: Optional[int] = Field(default=None, gt=0, le=10_000,
                                      description="its blocks; none: read from the swarm")
    repository: Optional[str] = Field(default=None, description="its Hugging Face repository, for links")
    name: Optional[str] = Field(default=None, description="the name pages show; none: the DHT prefix")
    path: Optional[Path] = Field(default=None, description="a local checkpoint with client files (config, "
                                 "tokenizer, embeddings), needed to chat with it and for its generation check")
    expect: Optional[str] = Field(default=None, description="a regular expression the generation check's answer "
                                  "must contain (case-insensitive; e.g. \"Paris\"); none: any answer is ok")

    @field_validator("expect")
    @classmethod
    def _check_expect(cls, expect: Optional[str]) -> Optional[str]:
        compile_expect(expect)
        return expect or None


SECTIONS = ("swarm", "models", "poller", "probes", "store", "web", "logs", "security", "chat", "alerts")
# The sections that are one setting each, a table (alerts) or an array of tables (models): their
# TOML form is that of the setting itself ([alerts], [[models]]), the same in the old flat form.
TABLE_SECTIONS = ("models", "alerts")


def setting(default: Any = ..., *, section: str, description: str, shown: Optional[str] = None, **constraints) -> Any:
    """A field of Settings: its ``section`` in the TOML file ([poller] ...), its ``description``
    (README's configuration reference is generated from them: scripts/settings_reference.py) and
    ``shown``, the default as the reference shows it when the value itself would mislead."""
    assert section in SECTIONS, section
    extra: dict[str, Any] = {"section": section}
    if shown is not None:
        extra["shown_default"] = shown
    return Field(default=default, description=description, json_schema_extra=extra, **constraints)


class Settings(BaseModel):
    """Flat in Python (``settings.scrape_period``), in sections in the TOML file ([poller] scrape_period);
    every field's ``section`` and ``description`` come from :func:`setting`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # [swarm] the swarm to watch
    initial_peers: list[str] = setting(
        [], section="swarm", shown="(the demo's own swarm)",
        description='multiaddrs of the swarm\'s bootstrap peers, or `"public"` (petals\' public swarm); '
                    "empty: the embedded demo swarm fills them in")
    discover_models: bool = setting(True, section="swarm",
                                    description="also watch every model announced under `_petals.models`")

    # [[models]]
    models: list[ModelConfig] = setting(
        [], section="models",
        description="`[[models]]`: models to watch: `dht_prefix`, `num_blocks`, `repository`, `name`, `path` "
                    "(a local checkpoint, needed to chat with it and for its generation check), `expect` "
                    "(a regular expression the generation check's answer must contain)")

    # [poller] reading the swarm and storing what it saw
    scrape_period: float = setting(60, section="poller", gt=0, description="how often the DHT is read")
    reachability_period: float = setting(60, section="poller", gt=0,
                                         description="how often every peer's reachability is checked "
                                                     "(`probe_period` etc. still load, with a warning)")
    reachability_timeout: float = setting(5, section="poller", gt=0, description="how long a reachability check waits")
    reachability_concurrency: int = setting(32, section="poller", gt=0, le=1024,
                                            description="reachability checks at once (they never delay a scrape or a page)")
    scrape_batch_blocks: int = setting(256, section="poller", gt=0,
                                       description="blocks per DHT call of a scrape (keeps each call's pickle small)")
    score_period: float = setting(300, section="poller", gt=0,
                                  description="how often peer scores are recomputed (they read a week of history)")
    rollup_period: float = setting(3600, section="poller", gt=0,
                                   description="how often completed hours are rolled up and old rows pruned")
    # Several pollers on one PostgreSQL database (README: High availability)
    leader_lease_seconds: Optional[float] = setting(
        None, section="poller", gt=0, le=3600, shown="half of `scrape_period` (≥ 2 s)",
        description="several pollers on one database: the leader's lease, renewed every quarter of it; a standby "
                    "takes over within 1.5 leases of its loss (High availability)")
    heartbeat_url: Optional[str] = setting(
        None, section="poller", max_length=2000,
        description="a dead man's switch: the leading poller requests it (GET) after each stored poll, so an outside "
                    "service (healthchecks.io, Uptime Kuma's push monitors, ...) pages when the pings stop")
    min_tokens_per_s: float = setting(1.0, section="poller", ge=0,
                                      description="a model whose best route is slower than this is degraded")
    min_cache_tokens: int = setting(1024, section="poller", ge=0,
                                    description="a model with a block's cache headroom below this is degraded")

    # [probes] measured speed and correctness (README: Measured speed and correctness, Generation checks)
    compute_check_period: float = setting(
        20, section="probes", gt=0,
        description="each ONLINE server computes one token through its first block once per period (a failed check "
                    "is confirmed 2 s later): names a killed, frozen or failing server within a period and a few seconds")
    compute_check_timeout: float = setting(5, section="probes", gt=0, le=120,
                                           description="how long a compute check waits for its answer")
    compute_check_concurrency: int = setting(16, section="probes", gt=0, le=256,
                                             description="compute checks at once, over all servers")
    speed_probe_period: float = setting(
        100, section="probes", gt=0,
        description="each ONLINE server's span is speed-probed once per period (a probe that would change its verdict "
                    "is confirmed after half a period): a throttled server is named slow within 1.5 periods")
    speed_probe_timeout: float = setting(10, section="probes", gt=0, le=600, description="per step of a probe session")
    speed_probe_concurrency: int = setting(12, section="probes", gt=0, le=64,
                                           description="probe sessions at once over all servers (a session takes "
                                                       "1–3 s: 500 servers are probed in ~85 s)")
    speed_probe_max_share: float = setting(0.02, section="probes", gt=0, le=0.5,
                                           description="the most of a server's time the probes may take; longer "
                                                       "probes come less often")
    correctness_checks: bool = setting(True, section="probes",
                                       description="compare servers' outputs with the monitor's own blocks (models "
                                                   "with a `path`) or with each other")
    generation_check_period: float = setting(
        300, section="probes", gt=0,
        description="each model with a `path` gets one generation check per period (a few tokens through the chat's "
                    "own engine and routing); after a failed one, the next comes 30 s later (until one succeeds)")
    generation_check_tokens: int = setting(8, section="probes", ge=1, le=64,
                                           description="tokens a generation check generates (greedy)")
    generation_check_prompt: str = setting("What is the capital of France?", section="probes", min_length=1,
                                           max_length=2000,
                                           description="what a generation check asks (in the model's chat format)")

    # [store]
    data_dir: Path = setting(Path(os.path.expanduser("~/.cache/petals-swarm-monitor")), section="store",
                             shown="`~/.cache/petals-swarm-monitor`",
                             description="models, demo swarm identities, the SQLite database")
    database_url: Optional[str] = setting(None, section="store", shown="SQLite in `data_dir`",
                                          description="e.g. `postgresql+psycopg://user:pass@host/db`")
    raw_retention_days: float = setting(2, section="store", gt=0,
                                        description="raw polls (and request rows) kept this long")
    rollup_retention_days: float = setting(90, section="store", gt=0, description="hourly rollups kept this long")

    # [logs]
    log_format: Literal["text", "json"] = setting(
        "text", section="logs", description="`text`, or `json`: one object per line (time, level, logger, message, "
                                            "the request or job it belongs to, error) for Loki, Elastic, journald")

    # [web]
    host: str = setting("127.0.0.1", section="web", description="the web server's listen address")
    port: int = setting(5000, section="web", ge=0, le=65535, description="the web server's port")
    refresh_seconds: int = setting(10, section="web", ge=1, description="how often page parts refresh")
    history_max_points: int = setting(2000, section="web", ge=10, le=100_000,
                                      description="points per series in the history APIs (more are merged)")
    search_max_results: int = setting(20, section="web", ge=1, le=100,
                                      description="peers one search (the search box, `/api/v1/search`) answers with")
    max_request_bytes: int = setting(1_000_000, section="web", ge=1024, le=100_000_000,
                                     description="request bodies and WebSocket messages; larger: 413")
    ws_idle_timeout: float = setting(300, section="web", gt=0, le=86400,
                                     description="how long a WebSocket session of the chat API may stay silent")
    ws_max_lifetime: float = setting(3600, section="web", gt=0, le=7 * 86400,
                                     description="how long a WebSocket session of the chat API may last")
    public_url: Optional[str] = setting(
        None, section="web", max_length=200, pattern=r"^https?://[A-Za-z0-9.\-\[\]:]+$",
        description="the origin people reach this monitor at (`https://monitor.example.org`, no path): servers' "
                    "owners prove they run them for it (Contributors); unset: no proofs are taken")

    # [security] (README: Security)
    admin_token: Optional[str] = setting(None, section="security", min_length=16, max_length=512, shown="(generated)",
                                         description="the operators' token")
    admin_token_file: Optional[Path] = setting(None, section="security", shown="`<data_dir>/admin_token`",
                                               description="where the operators' token is read, made at first start "
                                                           "(0600) when `admin_token` is not set")
    trusted_hosts: list[str] = setting([], section="security", shown="listen address, localhost",
                                       description="`Host` headers served; others get 400 (DNS rebinding)")
    chat_cors_origins: list[str] = setting(
        ["*"], section="security",
        description='origins whose pages may call the chat APIs from a browser (CORS, never with credentials): "*" '
                    '(any, as chat.petals.dev) or "https://example.org"; read-only APIs, badges and the feed answer '
                    "any origin")
    proxy_hops: int = setting(0, section="security", ge=0, le=8,
                              description="behind N TLS reverse proxies: trust their `X-Forwarded-*`, secure cookies")
    chat_rate_limit: str = setting("30 per minute; 300 per hour", section="security",
                                   description="per client, on every chat API; past it 429 with `Retry-After`")
    reachability_rate_limit: str = setting("6 per minute", section="security",
                                           description="per client, live reachability checks of a peer")
    rate_limit_storage: str = setting("memory://", section="security", shown="`chat_shared` when set, else memory",
                                      description="Flask-Limiter storage (e.g. `redis://…` to share limits between "
                                                  "processes)")

    # [chat] routing, capacity (README: Chat capacity; chat/capacity.py) and limits
    routing: Literal["health", "default"] = setting(
        "health", section="chat", description="`health`: score-aware routing; `default`: petals' own (for comparison)")
    min_peer_score: float = setting(30, section="chat", ge=0, le=100, description="servers scored below are avoided")
    pinned_peers: list[str] = setting([], section="chat", description="when set, the only peers routing uses")
    blocked_peers: list[str] = setting([], section="chat", description="peers routing never uses")
    chat_shared: Optional[str] = setting(
        None, section="chat", pattern=r"^rediss?://\S{1,500}$",
        description="a Redis URL (`redis://127.0.0.1:6379/0`) several chat workers share: the load each puts on "
                    "each server (published every second, a lease of 8 s: a dead worker stops counting within 10 s) and, unless `rate_limit_storage` says "
                    "otherwise, their clients' rate limits (README: Several chat workers)")
    chat_worker: Optional[str] = setting(
        None, section="chat", pattern=r"^[a-z0-9][a-z0-9-]{0,31}$",
        description="this chat worker's tag (`w1`) when several run behind a proxy: the chat's answers set the "
                    "`swarm_monitor_chat_worker` cookie and say `X-Chat-Worker`, and kept sessions' handles begin "
                    "with it, so the proxy sends a conversation's requests to the worker that holds it (README: "
                    "Several chat workers)")
    chat_slots: int = setting(4, section="chat", gt=0, le=1024,
                              description="generation slots: answers computed at once (`max_chat_sessions` still "
                                          "loads, with a warning)")
    chat_queue_size: int = setting(32, section="chat", ge=0, le=100_000,
                                   description="requests waiting for a slot (a thread each)")
    chat_queue_timeout: float = setting(60, section="chat", gt=0, le=3600,
                                        description="how long a request may wait for a slot, then 429")
    chat_cache_wait: float = setting(30, section="chat", gt=0, le=600,
                                     description="how long a server is asked to wait for room in its attention "
                                                 "cache once it refused a session for want of it (then 429)")
    max_slots_share: float = setting(0.5, section="chat", gt=0, le=1,
                                     description="the share of the slots and of the queue one client may hold")
    max_open_sessions: int = setting(32, section="chat", ge=1, le=100_000,
                                     description="sessions kept open between turns: WebSocket sessions and sessions "
                                                 "kept after an answer (an idle one makes room, kept ones first)")
    max_sessions_per_client: int = setting(4, section="chat", ge=1, le=10_000,
                                           description="sessions kept open by one client")
    chat_keep_sessions: float = setting(240, section="chat", ge=0, le=280,
                                        description="seconds an answered request's session stays open for a follow-up "
                                                    "of the same client (0: none is kept; petals servers end a "
                                                    "session idle for 300 s)")
    chat_keep_headroom: int = setting(1024, section="chat", ge=0, le=1_000_000,
                                      description="tokens a session that may be kept is opened with beyond its answer, "
                                                  "for follow-ups (held in its servers' attention caches)")
    max_batch_rows: int = setting(16, section="chat", ge=1, le=256,
                                  description="answers of one request (prompts × `n`)")
    chat_dtype: Literal["auto", "float32", "bfloat16"] = setting(
        "auto", section="chat", description="precision of the models' client side (embeddings, final norm, head): "
                                            "`auto` is bfloat16 where its float32 weights pass 1 GiB and the device "
                                            "computes bfloat16 fast (a GPU; a CPU with AVX-512 BF16 or AMX), else "
                                            "float32")
    chat_device: str = setting("auto", section="chat", pattern=r"^(auto|cpu|cuda(:\d{1,3})?)$",
                               description="where the client side computes: `cpu`, `cuda`, `cuda:N`, `auto` (a GPU "
                                           "when torch sees one); a CUDA device torch does not see is refused at "
                                           "start")
    chat_head_threads: int = setting(0, section="chat", ge=0, le=1024, shown="every core",
                                     description="threads of a model's head step (0: every core); its CPU seconds "
                                                 "are set by memory bandwidth, more threads shorten it: fewer leave "
                                                 "cores to servers sharing the host")
    max_logprobs: int = setting(20, section="chat", ge=0, le=100, description="alternatives per token (`top_logprobs`)")
    max_prompt_chars: int = setting(100_000, section="chat", ge=100, le=10_000_000,
                                    description="characters of one prompt (all messages together), counted before "
                                                "tokenizing")
    chat_conversations_per_visitor: int = setting(4, section="chat", ge=1, le=1000,
                                                  description="chat page conversations of one visitor held in memory")
    chat_max_visitors: int = setting(500, section="chat", ge=1, le=1_000_000,
                                     description="chat page visitors held in memory (the least recently active idle "
                                                 "one goes)")
    chat_keep_conversations: bool = setting(True, section="chat",
                                            description="keep the chat page's conversations in the store; off: "
                                                        "nothing is stored, and the page says so")
    chat_conversation_retention_days: float = setting(30, section="chat", gt=0, le=3650,
                                                      description="a stored conversation is kept this long after "
                                                                  "its last message")
    chat_conversations_kept: int = setting(100, section="chat", ge=1, le=10_000,
                                           description="stored conversations per visitor")
    chat_conversation_max_chars: int = setting(200_000, section="chat", ge=1000, le=10_000_000,
                                               description="characters of one stored conversation")
    chat_new_visitors_per_address: int = setting(20, section="chat", ge=1, le=100_000,
                                                 description="new visitors a day from one address")
    chat_conversations_in_all: int = setting(100_000, section="chat", ge=1, le=100_000_000,
                                             description="every visitor's stored conversations together")

    # [alerts] (README: Alerts; validated in monitor/alert_settings.py)
    alerts: AlertSettings = setting(AlertSettings(), section="alerts",
                                    description="rules evaluated after every scrape and reachability round, "
                                                "notices to webhooks")

    @field_validator("*", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        """Every time setting takes "90s", "5m", "2h", "30d", or a number in its own unit."""
        unit = unit_of(info.field_name or "")
        return value if unit is None else parse_duration(value, unit)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        if isinstance(values, dict) and any(old in values for old in RENAMED):
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
    def resolved_rate_limit_storage(self) -> str:
        """Where the rate limits are counted: ``rate_limit_storage``, or the chat workers' shared
        Redis when that is set and this is left at its default."""
        if self.rate_limit_storage == "memory://" and self.chat_shared:
            return self.chat_shared
        return self.rate_limit_storage

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'monitor.db'}"


_LIST_FIELDS = {"initial_peers", "pinned_peers", "blocked_peers", "trusted_hosts", "chat_cors_origins"}
_TABLE_FIELDS = {"models", "alerts"}  # JSON in their variables (SWARM_MONITOR_MODELS='[{"dht_prefix": ...}]')
log = logging.getLogger(__name__)


def section_of(name: str) -> str:
    """The TOML section of setting ``name`` (an old name: its new name's)."""
    field = Settings.model_fields[RENAMED.get(name, name)]
    return str(field.json_schema_extra["section"])  # type: ignore[index]


def fields_in(section: str) -> list[str]:
    return [name for name, field in Settings.model_fields.items()
            if field.json_schema_extra["section"] == section]  # type: ignore[index]


def env_list(name: str, raw: str) -> list[str]:
    """A list in an environment variable: comma-separated (``a,b,c``). A JSON list (``["a", "b"]``) or
    a whitespace-separated one (``a b c``) is still read, with a warning."""
    text = raw.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = None
        if isinstance(items, list) and all(isinstance(item, str) for item in items):
            log.warning("%s%s: a JSON list is deprecated, give it comma-separated: %s", ENV_PREFIX, name.upper(),
                        ",".join(items))
            return [item.strip() for item in items if item.strip()]
    if "," not in text and len(text.split()) > 1:
        items = text.split()
        log.warning("%s%s: a whitespace-separated list is deprecated, give it comma-separated: %s", ENV_PREFIX,
                    name.upper(), ",".join(items))
        return items
    return [item.strip() for item in text.split(",") if item.strip()]


def _from_env(environ) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in [*Settings.model_fields, *RENAMED]:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is None:
            continue
        if name in _LIST_FIELDS:
            values[name] = env_list(name, raw)
        elif name == "models":
            values[name] = json.loads(raw)
        else:
            values[name] = raw
    return values


def from_sections(data: dict[str, Any], source: str = "the settings file") -> dict[str, Any]:
    """The flat settings of a TOML document in sections ([poller] scrape_period = 30 ...). Top-level
    settings (the old flat form) are still read, with one warning naming them and their sections;
    a setting in a section not its own is an error."""
    values: dict[str, Any] = {}
    flat: list[str] = []
    for key, value in data.items():
        if key in SECTIONS and key not in TABLE_SECTIONS:
            if not isinstance(value, dict):
                raise SettingsError(f"{source}: [{key}] must be a table of settings, got {value!r}")
            for name, setting_value in value.items():
                if name not in Settings.model_fields and name not in RENAMED:
                    known = ", ".join(fields_in(key))
                    raise SettingsError(f"{source}: unknown setting {name!r} in [{key}]; its settings: {known}")
                if section_of(name) != key:
                    raise SettingsError(f"{source}: setting {name!r} belongs in [{section_of(name)}], not [{key}]")
                if name in values:
                    raise SettingsError(f"{source}: setting {name!r} is given twice")
                values[name] = setting_value
        else:
            if key in values:
                raise SettingsError(f"{source}: setting {key!r} is given twice (at the top and in "
                                    f"[{section_of(key)}])")
            if key not in TABLE_SECTIONS and (key in Settings.model_fields or key in RENAMED):
                flat.append(key)
            values[key] = value  # [alerts], [[models]]; an unknown key fails in Settings, naming it
    if flat:
        moves = "; ".join(f"{name} -> [{section_of(name)}]" + (f" {RENAMED[name]}" if name in RENAMED else "")
                          for name in flat)
        log.warning("%s: settings at the top level are deprecated, put them in their sections: %s", source, moves)
    return values


def load_settings(config_file: Optional[Path] = None, environ=None, **overrides) -> Settings:
    """Build the settings; raise SettingsError naming the first invalid setting."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        path = Path(config_file)
        try:
            values.update(from_sections(tomllib.loads(path.read_text()), f"config file {path}"))
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
        what = first["msg"].removeprefix("Value error, ")
        got = first.get("input")
        if "webhooks" in where:  # a webhook's or Apprise URL often carries a secret: its name only
            got = {"name": got.get("name")} if isinstance(got, dict) else "…"
        raise SettingsError(f"invalid setting {where!r}: {what} (got {got!r})") from None
