"""What the chat refuses before any slot, and what it expects a request to get: whether a model is
served now (the monitor's coverage, then petals' own view), the longest session its servers accept,
routing choices no route can meet, the route a request would take, and its forecast.

``Admission`` answers these for ``chat.request`` (a request's life) and the HTTP side; it reads
the models (``chat.models``), the slots (their wait) and the load ledger (``chat.server_load``),
and changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import AbstractSet, Callable, Mapping, Optional, Sequence

from monitor.core.assessment import format_ranges, ranges
from monitor.core.forecast import Forecast, ForecastInputs, forecast
from monitor.core.route_choice import RouteChoice, RouteSeconds, allowed, unmet

from chat.capacity import Slots
from chat.client_side import ClientSideTooLarge
from chat.errors import Busy, ModelNotServed, RouteUnmet, SessionTooLong
from chat.models import Model, Models
from chat.policy import PETALS_DEFAULT_SECONDS_PER_BLOCK, RouteHop, RoutingSettings, penalty
from chat.server_load import ServerLoad
from monitor.core.snapshot import ONLINE, ModelInfo, ServerRow, session_room

logger = logging.getLogger(__name__)

AssessmentCheck = Callable[[str], tuple[bool, str]]  # dht_prefix -> (served?, why not, for people)


def server_rows(name: str, spans: Sequence) -> list[ServerRow]:
    """The sequence manager's spans (petals' ``RemoteSpanInfo``, from the DHT through petals' own
    parsing) as the rows the monitor's route estimator reads: ONLINE, one per peer."""
    rows = []
    for span in spans:
        info = span.server_info
        rows.append(ServerRow(peer_id=span.peer_id.to_base58(), model=name, start=span.start, end=span.end,
                              state=ONLINE, throughput=getattr(info, "throughput", None),
                              inference_rps=getattr(info, "inference_rps", None),
                              cache_tokens_left=getattr(info, "cache_tokens_left", None),
                              public_name=getattr(info, "public_name", None),
                              next_pings=dict(getattr(info, "next_pings", None) or {})))
    return rows


def client_rtts(manager) -> dict[str, float]:
    """peer id -> the round trip petals' client measured to it (its ping aggregator), where known."""
    try:
        return {peer.to_base58(): float(rtt) for peer, rtt in manager.ping_aggregator.to_dict().items()
                if rtt is not None and 0 <= rtt < float("inf")}
    except Exception:  # noqa: BLE001 - no pings: petals' own default per hop
        return {}


def route_pricer(name: str, num_blocks: int, spans: Sequence, *, weights: Mapping, client_rtts: Mapping[str, float],
                 cache_tokens_needed: Optional[int]) -> RouteSeconds:
    """The one route estimator (``monitor.core.coverage.route_speed``, by petals' own routing) over
    the chat's view of the swarm: for some peers, the seconds per token of the best route through
    them, measured speeds in place of announced ones; None when they do not cover every block, or
    when the estimator cannot say (an announcement petals' routing refuses): the request tries."""
    from monitor.swarm.routing import route_speed

    rows = server_rows(name, spans)
    measured = {peer: w.seconds_per_token_per_block for peer, w in weights.items()
                if w.seconds_per_token_per_block is not None and w.seconds_per_token_per_block > 0}
    model_info = ModelInfo(dht_prefix=name, num_blocks=num_blocks)

    def priced(peers: AbstractSet[str]) -> Optional[float]:
        try:
            found = route_speed(model_info, [row for row in rows if row.peer_id in peers], client_rtts=client_rtts,
                                cache_tokens_needed=cache_tokens_needed, measured=measured)
        except Exception as e:  # noqa: BLE001 - not known: let the request try
            logger.debug("no route estimate for %s: %r", name, e)
            return None
        return found.seconds_per_token if found.route else None

    return priced


@dataclass(frozen=True)
class ModelReadiness:
    """Can a model be chatted with now (``Admission.status``), and if not, why."""

    name: str  # dht_prefix
    title: str  # human name
    served: bool
    reason: str = ""  # why not, for people
    missing_blocks: tuple[int, ...] = ()


class Admission:
    """``assessment_check`` refuses a model the monitor saw broken before loading it;
    ``forecast_source`` gives what forecasts rest on, per model (e.g. ``chat.feedback.StoreForecasts``);
    ``retry_after``: what a ``Busy`` refusal suggests."""

    def __init__(self, models: Models, slots: Slots, server_load: ServerLoad, *, routing: RoutingSettings,
                 assessment_check: Optional[AssessmentCheck] = None,
                 forecast_source: Optional[Callable[[], Mapping[str, ForecastInputs]]] = None,
                 retry_after: int = 5):
        self.models, self.slots, self.server_load, self.routing = models, slots, server_load, routing
        self.assessment_check, self.forecast_source, self.retry_after = assessment_check, forecast_source, retry_after

    # -- coverage --------------------------------------------------------------------------------
    def status(self, name: str) -> ModelReadiness:
        """Can this model be chatted with now, and if not, why (for people)."""
        model = self.models.get(name)
        try:
            # with a coverage check, a model nobody chatted with yet is not loaded just to be listed
            self.check_served(model, load=self.assessment_check is None or model.remote is not None)
        except ModelNotServed as e:
            return ModelReadiness(model.name, model.title, False, e.reason, tuple(e.missing_blocks))
        except ClientSideTooLarge as e:
            return ModelReadiness(model.name, model.title, False, str(e))
        except Exception:  # noqa: BLE001 - a status page must still render; the cause is for the log
            logger.warning("status of %s failed", model.name, exc_info=True)
            return ModelReadiness(model.name, model.title, False, "could not check its servers right now; "
                                                              "try again in a minute")
        return ModelReadiness(model.name, model.title, True)

    def statuses(self) -> list[ModelReadiness]:
        return [self.status(name) for name in self.models.names]

    def check_served(self, model: Model, *, load: bool = True, coverage: bool = True) -> None:
        """Raise ModelNotServed unless the monitor's assessment (when ``coverage``: it does not call
        the model broken) and (when ``load``) the sequence manager's own view, which knows
        pinned/blocked/banned peers, both see every block."""
        if model.path is None:
            raise ModelNotServed(model.name, "no local checkpoint is configured for it (set the model's path)")
        if coverage and self.assessment_check is not None:
            ok, reason = self.assessment_check(model.name)
            if not ok:
                raise ModelNotServed(model.name, reason)
        if not load:
            return
        manager = self.models.sequence_manager(model.name)
        missing = manager.missing_blocks()
        if missing:
            missing = manager.missing_blocks(refresh=True)  # the view may be stale; look again
        if missing:
            restricted = " among the pinned/allowed peers" if self.routing.pinned else ""
            raise ModelNotServed(
                model.name, f"no server{restricted} holds block{'s' if len(missing) > 1 else ''} "
                f"{format_ranges(ranges(missing))} (of {len(manager)})", missing,
            )

    def session_limit(self, name: str) -> int:
        """The longest session a request to this model may open now: its context, or less where
        its servers refused longer sessions (``HealthAwareSequenceManager.longest_session``)."""
        context = self.models.context_length(name)
        longest = self.models.sequence_manager(name).longest_session()
        return context if longest is None else min(context, longest)

    def cache_room(self, name: str) -> Optional[int]:
        """The least attention-cache room, in tokens of one session through a server's whole span
        (``server_load.session_room``), that the model's servers announce now (None: none announces
        it): what bounds the headroom a session that may be kept is opened with."""
        manager = self.models.sequence_manager(name)
        with manager.lock_changes:
            rooms = [session_room(getattr(span.server_info, "cache_tokens_left", None), span.end - span.start)
                     for span in manager.state.sequence_info.spans_by_priority]
        rooms = [room for room in rooms if room is not None]
        return min(rooms) if rooms else None

    def check_session_length(self, name: str, length: int, *, param: str, prompt_tokens: int = 0) -> None:
        """``SessionTooLong`` when a session of ``length`` tokens is longer than any route accepts."""
        longest = self.models.sequence_manager(name).longest_session()
        if longest is not None and length > longest:
            raise SessionTooLong(name, param, length, longest, prompt_tokens)

    def check_route_choice(self, name: str, choice: Optional[RouteChoice], *, prompt_tokens: int, max_tokens: int,
                           field: str = "petals") -> None:
        """Refuse, before any slot, routing choices no route can meet now (``RouteUnmet``, naming the
        choice and what the swarm offers: ``monitor.core.route_choice.unmet``, on this manager's view
        of the swarm, which the operator's pins and blocks already bound), and a directed request
        (``only``) whose every server already runs its share of directed requests (``Busy``)."""
        if choice is None or choice.empty:
            return
        manager = self.models.sequence_manager(name)
        with manager.lock_changes:
            found = list(manager.state.sequence_info.spans_by_priority)
            num_blocks = len(manager)
        spans = {span.peer_id.to_base58(): (span.start, span.end) for span in found}
        weights = manager.peer_weights()
        verified = {peer for peer, weight in weights.items() if weight.verified}
        usable = allowed(choice, spans, verified=verified)
        known = self.forecast(name, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        priced = route_pricer(name, num_blocks, found, weights=weights, client_rtts=client_rtts(manager),
                              cache_tokens_needed=prompt_tokens + max_tokens)
        problem = unmet(choice, spans=spans, num_blocks=num_blocks, route_seconds=priced, allowed_peers=usable,
                        all_peers=spans, time_to_first_token=known.time_to_first_token, wait=known.wait, field=field)
        if problem is not None:
            raise RouteUnmet(problem.field, problem.message)
        if choice.directed and self.server_load.directed_full(usable):
            raise Busy(f"the servers {field + '.' if field else ''}only allows already run their share of requests "
                       f"that name their servers ({self.server_load.directed_limit} each); retry later or allow "
                       f"more servers", self.retry_after)

    def planned_route(self, name: str, tokens: int) -> list[RouteHop]:
        """The hops of the route an inference session of ``tokens`` tokens would take
        now (the sequence manager's own choice, nothing opened); [] when it cannot say."""
        try:
            spans = self.models.sequence_manager(name).make_sequence(mode="min_latency", cache_tokens_needed=tokens)
        except Exception as e:  # noqa: BLE001 - a preview, not the answer: the session finds its own route
            logger.debug("no route preview for %s: %r", name, e)
            return []
        return [RouteHop(span.peer_id.to_base58(), span.start, span.end) for span in spans]

    def route_seconds(self, name: str, hops: Sequence[RouteHop]) -> Optional[float]:
        """Seconds per token of a route, as routing prices it: each hop's blocks at its server's
        seconds per block (measured where known, else announced) times its health penalty
        (``penalty``). None when it has no hops or a hop's server is not in the swarm view now."""
        if not hops:
            return None
        manager = self.models.sequence_manager(name)
        with manager.lock_changes:
            infos = {span.peer_id.to_base58(): span.server_info for span in manager.state.sequence_info.spans_by_priority}
        weights = manager.peer_weights()
        total = 0.0
        for hop in hops:
            if hop.peer_id not in infos:
                return None
            rps = getattr(infos[hop.peer_id], "inference_rps", None)
            announced = 1.0 / rps if rps else PETALS_DEFAULT_SECONDS_PER_BLOCK
            total += (hop.end - hop.start) * penalty(weights.get(hop.peer_id), announced) * announced
        return total

    def recommendation(self, name: str) -> Optional[tuple[str, str]]:
        """(argument, reason): what a new server of this model should serve, as the stored assessment
        recommends (e.g. ``--block_indices 4:8``), if the forecast's source knows."""
        try:
            known = (self.forecast_source() if self.forecast_source is not None else {}).get(name)
        except Exception:  # noqa: BLE001 - no recommendation, not a failed request
            return None
        return (known.recommendation, known.recommendation_reason or "") if known and known.recommendation else None

    def forecast(self, name: str, *, prompt_tokens: int, max_tokens: int, continued: Optional[bool] = None) -> Forecast:
        """What a request of ``prompt_tokens`` asking for ``max_tokens`` would get if it came now
        (``monitor.core.forecast``): the queue's wait now, and what real requests (or the probes) say
        of requests at the load it would meet, on no route in particular (a model list's forecast;
        for a request about to be made, ``forecast_route``). ``continued``: a follow-up that continues
        a kept session (``chat.kept``), whose first token comes sooner."""
        return self._forecast(name, prompt_tokens, max_tokens, [], continued)

    def forecast_route(self, name: str, *, prompt_tokens: int, max_tokens: int,
                       continued: Optional[bool] = None) -> tuple[Forecast, list[RouteHop]]:
        """``forecast`` on the route the request would take now (the router's choice), and that
        route's hops ([]: unknown)."""
        hops = self.planned_route(name, prompt_tokens + max_tokens)
        return self._forecast(name, prompt_tokens, max_tokens, [peer for peer, _, _ in hops], continued), hops

    def _forecast(self, name: str, prompt_tokens: int, max_tokens: int, route: list[str],
                  continued: Optional[bool] = None) -> Forecast:
        known = {}
        if self.forecast_source is not None:
            try:
                known = self.forecast_source()
            except Exception as e:  # noqa: BLE001 - a forecast of nothing, not a failed request
                logger.warning("forecast inputs unavailable: %r", e)
        wait = self.slots.expected_wait()
        if route:  # beside the requests on its busiest server now (one that waits takes a leaver's place)
            in_flight = self.server_load.in_flight()
            busiest = max(in_flight.get(peer, 0) for peer in route)
            load = max(1, busiest) if wait > 0 else busiest + 1
            if wait > 0:  # ... on whichever route frees first, not the one planned now: like requests on any route
                route = []
        else:  # beside those generating now; one that waits, beside a full house
            slots = self.slots.load()
            load = slots.limit if wait > 0 else min(slots.limit, slots.busy + 1)
        return forecast(known.get(name) or ForecastInputs(name), wait=wait, prompt_tokens=prompt_tokens,
                        max_tokens=max_tokens, load=load, route=route or None, continued=continued)

