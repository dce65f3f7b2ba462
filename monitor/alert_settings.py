"""The ``alerts`` setting: rules and webhooks, validated at start like every other setting.

In the TOML settings file::

    [alerts]
    dashboard_url = "https://monitor.example.org"   # links in notices (optional)

    [[alerts.rules]]
    name = "gpu-box-offline"
    kind = "peer_offline"
    peers = ["my-gpu-box"]          # public names or peer ids
    for = "5m"                      # seconds, or "90s", "5m", "2h", "1d" (monitor/durations.py)

    [[alerts.webhooks]]
    name = "ops"
    url = "https://hooks.slack.com/services/..."   # format: auto (from the URL), generic, slack, discord,
                                                   # alertmanager (the Alertmanager's base URL)

    [[alerts.inhibit_rules]]          # the default one: a firing model alert holds its servers' peer alerts
    source = ['kind=~"model_.*"']
    target = ['kind=~"peer_.*"']
    equal = ["model"]

A bad rule stops start-up with a message that names it and says what is wrong. The rule kinds and
what they mean are in ``monitor/core/alert_rules.py`` and README's "Alerts".
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, Optional
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from monitor.core import alert_rules as core
from monitor.core import muting
from monitor.core.common import DAY, STALE_PERIODS
from monitor.durations import days, parse_duration  # noqa: F401  (parse_duration: also read from here)

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"
MAX_RULES, MAX_WEBHOOKS, MAX_TARGETS, MAX_HEADERS = 200, 20, 100, 10


Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=30 * DAY)]
Kind = Literal["model_degraded", "model_broken", "bootstrap_down", "peer_offline", "peer_unreachable",
               "peer_wrong_outputs", "peer_failing", "peer_score_below", "monitor_stale"]  # core.KINDS (a test keeps them equal)


class AlertRuleConfig(BaseModel):
    """One rule. ``for``: how long the condition must hold before anyone hears of it (default two
    scrape periods, none for monitor_stale); ``left_for``: the same for a server that left (OFFLINE
    or gone from the DHT; default 45 s, or ``for`` if shorter; ``for`` when ``for`` is set);
    ``repeat``: remind this often while it fires (default 4 h, 0: never)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=_NAME)
    kind: Kind
    for_: Optional[Duration] = Field(default=None, alias="for")
    left_for: Optional[Duration] = None
    repeat: Optional[Duration] = None
    models: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default=[], max_length=MAX_TARGETS)
    peers: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(default=[], max_length=MAX_TARGETS)
    below: Optional[float] = Field(default=None, ge=0, le=100)
    periods: float = Field(default=STALE_PERIODS, gt=0, le=10_000)
    webhooks: list[str] = []  # names of webhooks that hear of it; empty: every webhook

    @model_validator(mode="after")
    def _fits_kind(self) -> "AlertRuleConfig":
        if self.kind in core.PEER_KINDS and not self.peers:
            raise ValueError(f"a {self.kind} rule needs `peers`: the peer ids or public names to watch")
        if self.peers and self.kind not in core.PEER_KINDS:
            raise ValueError(f"`peers` applies to peer_* rules only, not to {self.kind}")
        if self.models and self.kind not in core.MODEL_KINDS:
            raise ValueError(f"`models` applies to model_* rules only, not to {self.kind}")
        if (self.kind == core.PEER_SCORE_BELOW) != (self.below is not None):
            raise ValueError("a peer_score_below rule needs `below` (0-100); no other kind takes it")
        if "periods" in self.model_fields_set and self.kind != core.MONITOR_STALE:
            raise ValueError("`periods` applies to monitor_stale rules only")
        return self

    def to_rule(self, scrape_period: float) -> core.Rule:
        left = self.left_for if self.left_for is not None else None if self.for_ is not None else core.LEFT_HOLD
        return core.Rule(
            name=self.name, kind=self.kind, left_seconds=left,
            for_seconds=self.for_ if self.for_ is not None else core.default_for(self.kind, scrape_period),
            repeat_seconds=self.repeat if self.repeat is not None else core.DEFAULT_REPEAT,
            models=tuple(self.models), peers=tuple(self.peers), below=self.below, periods=self.periods,
        )


WEBHOOK_FORMATS = ("generic", "slack", "discord", "alertmanager")
ALERTMANAGER_PATH = "/api/v2/alerts"


def quiet_apprise() -> None:
    """Apprise logs every attempt at INFO and every failure at WARNING, hosts and recipients
    included: never into the monitor's log (a failed delivery's reason says what went wrong)."""
    import logging

    logger = logging.getLogger("apprise")
    logger.setLevel(logging.CRITICAL)
    logger.propagate = False


def apprise_knows(url: str) -> bool:
    """Whether Apprise knows the URL's scheme and can make a target of it."""
    import apprise

    quiet_apprise()
    return apprise.Apprise.instantiate(url) is not None


class WebhookConfig(BaseModel):
    """Where notices go: an http(s) webhook, or any Apprise URL (``format = "apprise"``, which a
    URL of another scheme gets by itself: ``mailtos://``, ``tgram://``, ``ntfy://`` ...). The URL is
    operator configuration (it often carries a secret): it is never shown on the dashboard or the
    API, only the entry's name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=_NAME)
    url: str = Field(max_length=2000)
    format: Literal["auto", "generic", "slack", "discord", "alertmanager", "apprise"] = "auto"
    timeout: Annotated[float, BeforeValidator(parse_duration)] = Field(default=5.0, gt=0, le=60)
    headers: dict[str, str] = Field(default={}, max_length=MAX_HEADERS)  # e.g. Authorization

    @model_validator(mode="after")
    def _url_fits_format(self) -> "WebhookConfig":
        parts = urlsplit(self.url)
        if self.resolved_format == "apprise":
            if "\n" in self.url or "\r" in self.url or not apprise_knows(self.url):
                raise ValueError("url: not a URL Apprise can send to (e.g. mailtos://user:password@host?to=ops@example.org, "
                                 "tgram://bottoken/chat_id, ntfy://topic; see Apprise's list of services)")
        elif parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: must be an http:// or https:// URL with a host (or an Apprise URL with "
                             "format = \"apprise\")")
        return self

    @field_validator("headers")
    @classmethod
    def _plain_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not re.match(r"^[A-Za-z0-9\-]{1,64}$", name) or any(c in value for c in "\r\n") or len(value) > 2000:
                raise ValueError(f"header {name[:64]!r}: names are letters, digits and '-', values one line")
        return headers

    @property
    def resolved_format(self) -> str:
        """``auto``: Slack's and Discord's webhook hosts get their format, anything else the generic one."""
        if self.format != "auto":
            return self.format
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https"):
            return "apprise"
        host = (parts.hostname or "").lower()
        if host == "hooks.slack.com":
            return "slack"
        if host in ("discord.com", "discordapp.com", "ptb.discord.com", "canary.discord.com") \
                and parts.path.startswith("/api/webhooks/"):
            return "discord"
        return "generic"

    @property
    def endpoint(self) -> str:
        """Where to POST: the URL, or for an Alertmanager its ``/api/v2/alerts`` under the URL given."""
        if self.resolved_format != "alertmanager" or urlsplit(self.url).path.rstrip("/").endswith(ALERTMANAGER_PATH):
            return self.url
        return self.url.rstrip("/") + ALERTMANAGER_PATH


def _matchers(texts: list[str], what: str) -> tuple[muting.Matcher, ...]:
    try:
        return tuple(muting.parse_matcher(text) for text in texts)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


class InhibitRuleConfig(BaseModel):
    """While an alert matching ``source`` fires, alerts matching ``target`` that share every
    ``equal`` label with it are held (matchers as in Alertmanager: ``kind=~"peer_.*"``)."""

    model_config = ConfigDict(extra="forbid")

    source: list[str] = Field(min_length=1, max_length=muting.MAX_MATCHERS)
    target: list[str] = Field(min_length=1, max_length=muting.MAX_MATCHERS)
    equal: list[str] = Field(default=[], max_length=len(muting.LABEL_NAMES))

    @model_validator(mode="after")
    def _parses(self) -> "InhibitRuleConfig":
        self.to_rule()
        unknown = [name for name in self.equal if name not in muting.LABEL_NAMES]
        if unknown:
            raise ValueError(f"equal: unknown labels {unknown}; labels are {', '.join(muting.LABEL_NAMES)}")
        return self

    def to_rule(self) -> muting.InhibitRule:
        return muting.InhibitRule(_matchers(self.source, "source"), _matchers(self.target, "target"),
                                  tuple(self.equal))


class AlertSettings(BaseModel):
    """The ``[alerts]`` table. Rules are evaluated by the poller after every scrape and reachability
    round (and every ``check_period``); notices go to every webhook unless a rule names its own."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="evaluate the rules and send notices")
    default_rules: bool = Field(default=True, description="model-health, bootstrap-down and monitor-stale rules "
                                "(a rule of the same name replaces one)")
    rules: list[AlertRuleConfig] = Field(default=[], description="`[[alerts.rules]]`: name, kind, for, repeat, "
                                         "models, peers, below, periods, webhooks (see Alerts)")
    webhooks: list[WebhookConfig] = Field(default=[], description="`[[alerts.webhooks]]`: name, url (http(s), or any Apprise URL), format, "
                                          "timeout, headers (see Alerts)")
    check_period: Duration = Field(default=10.0, gt=0, description="evaluate and send due retries at least this often")
    max_attempts: int = Field(default=12, ge=1, le=100, description="per notice and webhook (~3.5 h), then marked failed")
    retry_backoff: Duration = Field(default=10.0, gt=0, description="first retry after this, doubling up to an hour")
    history_days: Annotated[float, BeforeValidator(days)] = Field(default=30, gt=0, le=3650,
                                                                  description="events and deliveries kept this long")
    dashboard_url: Optional[str] = Field(default=None, max_length=500, description="base URL for links in notices")
    owner_email: Optional[str] = Field(default=None, max_length=1000, description="an Apprise `mailto://` or "
                                       "`mailtos://` URL without a recipient: servers' owners may then subscribe by "
                                       "e-mail (confirmed by a link first), each message sent to their address")
    owner_webhooks_private: bool = Field(default=False, description="let servers' owners' webhooks (Contributors) "
                                         "reach private and loopback addresses: a private deployment's, or a "
                                         "spec's; never on a public monitor")
    group_wait: Duration = Field(default=0.0, description="a notice waits this long for others to the same webhook, "
                                 "sent as one message")
    default_inhibit: bool = Field(default=True, description="a firing model alert holds the per-peer alerts of its servers")
    inhibit_rules: list[InhibitRuleConfig] = Field(default=[], max_length=50, description="`[[alerts.inhibit_rules]]`: "
                                                   "source, target, equal (see Alerts)")
    public_silences: bool = Field(default=False, description="anonymous clients may read the silences in force "
                                  "(never change them)")
    alertmanager_resend: Duration = Field(default=60.0, ge=10, le=3600, description="firing alerts re-sent to "
                                          "Alertmanagers this often")

    @model_validator(mode="before")
    @classmethod
    def _from_json(cls, value: Any) -> Any:
        """``SWARM_MONITOR_ALERTS`` holds the table as JSON."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"must be a JSON object like {{\"rules\": [...], \"webhooks\": [...]}}: {e}") from None
        return value

    @field_validator("rules", mode="before")
    @classmethod
    def _each_rule_named(cls, rules: Any) -> Any:
        """Validate rule by rule, so that the message names the rule at fault."""
        if not isinstance(rules, list):
            raise ValueError("must be a list of rules ([[alerts.rules]] tables)")
        if len(rules) > MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} rules")
        checked = []
        for number, raw in enumerate(rules, start=1):
            name = raw.get("name") if isinstance(raw, dict) else getattr(raw, "name", None)
            try:
                checked.append(raw if isinstance(raw, AlertRuleConfig) else AlertRuleConfig.model_validate(raw))
            except ValidationError as e:
                error = e.errors()[0]
                where = ".".join(str(part) for part in error["loc"])
                what = error["msg"].removeprefix("Value error, ")
                raise ValueError(f"rule {name!r} (#{number}): {where + ': ' if where else ''}{what}") from None
        return checked

    @field_validator("dashboard_url")
    @classmethod
    def _base_url(cls, url: Optional[str]) -> Optional[str]:
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        return url.rstrip("/") if url else url

    @model_validator(mode="after")
    def _consistent(self) -> "AlertSettings":
        names = [rule.name for rule in self.rules]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise ValueError(f"two rules are named {duplicate!r}; names must be unique")
        hooks = [hook.name for hook in self.webhooks]
        if len(hooks) > MAX_WEBHOOKS or len(set(hooks)) != len(hooks):
            raise ValueError(f"webhook names must be unique (at most {MAX_WEBHOOKS} webhooks)")
        for rule in self.rules:
            unknown = [name for name in rule.webhooks if name not in hooks]
            if unknown:
                raise ValueError(f"rule {rule.name!r} names unknown webhooks {unknown}; known: {hooks or 'none'}")
        return self

    def rules_in_force(self, scrape_period: float) -> tuple[core.Rule, ...]:
        """The configured rules, plus the defaults the operator did not replace by name."""
        own = tuple(rule.to_rule(scrape_period) for rule in self.rules)
        if not self.default_rules:
            return own
        taken = {rule.name for rule in own}
        return tuple(r for r in core.default_rules(scrape_period) if r.name not in taken) + own

    def inhibit_in_force(self) -> tuple[muting.InhibitRule, ...]:
        """The configured inhibition rules, after the default one unless it is turned off."""
        own = tuple(rule.to_rule() for rule in self.inhibit_rules)
        return ((muting.PEERS_OF_A_FIRING_MODEL,) if self.default_inhibit else ()) + own

    def webhooks_for(self, rule_name: str) -> list[WebhookConfig]:
        rule = next((r for r in self.rules if r.name == rule_name), None)
        if rule is None or not rule.webhooks:
            return list(self.webhooks)
        return [hook for hook in self.webhooks if hook.name in rule.webhooks]

    def with_webhook_urls(self, urls: list[str]) -> "AlertSettings":
        """These settings plus one webhook per URL (``--webhook URL``), named ``cli-1``, ``cli-2`` ...;
        raises ValueError naming a bad URL."""
        added = []
        for number, url in enumerate(urls, start=1):
            try:
                added.append(WebhookConfig(name=f"cli-{number}", url=url))
            except ValidationError as e:
                raise ValueError(f"{url!r}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
        data = self.model_dump(by_alias=True, exclude_unset=True)
        data["webhooks"] = [*(hook.model_dump(exclude_unset=True) for hook in self.webhooks),
                            *(hook.model_dump(exclude_unset=True) for hook in added)]
        try:
            return AlertSettings.model_validate(data)  # names unique, rules' webhooks known
        except ValidationError as e:
            raise ValueError(e.errors()[0]["msg"].removeprefix("Value error, ")) from None
