"""The product in one process: DHT client, store, poller, chat engine and web app, wired together.

``swarm-monitor serve`` and ``swarm-monitor demo`` build a Service; the gunicorn entry
(``monitor.web.wsgi``) builds only the web part, ``swarm-monitor poll`` only the poller, so
several web workers never run several schedulers, and the chat's gunicorn entry
(``monitor.app.chat_wsgi``) a Service without the poller: DHT client, chat engine and web app.

A Service starts whether or not the swarm answers: the DHT client keeps trying in the background
(``swarm.DhtClient``) while the dashboard and /metrics say why nothing is polled, and whatever
needs the DHT (the chat engine, the poller, live reachability checks) gets it once it is up. Its
poller takes its place among the pollers of the database (``app/leadership.py``): it leads, or
stands by while another does.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
from typing import Any, Optional

from monitor import compat  # noqa: F401  (must precede petals)
from monitor.settings import Settings

log = logging.getLogger(__name__)


class Service:
    def __init__(self, settings: Settings, *, run_poller: bool = True, enable_chat: bool = True,
                 demo_controls=None):
        self.settings = settings
        self.run_poller = run_poller
        self.enable_chat = enable_chat
        self.demo_controls = demo_controls
        # each set by ``start`` (None until then, and where the process has none)
        self.store: Any = None  # monitor.store.Store
        self.dht_client: Any = None  # monitor.swarm.DhtClient
        self.dht: Any = None  # the hivemind DHT, once the DHT client is up
        self.migration: Any = None
        self.poller: Any = None  # monitor.app.jobs.Poller
        self.engine: Any = None  # chat.engine.ChatEngine
        self.weights: Any = None
        self.requests: Any = None
        self.forecasts: Any = None
        self.worker_beat: Any = None  # the chat worker's report of itself (the overview's chat workers)
        self.app: Any = None  # the Flask app
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "Service":
        from monitor.store import Store
        from monitor.swarm import DhtClient

        self.store = Store.from_settings(self.settings)
        self.migration = self.store.migrate()
        self.dht_client = DhtClient(self.settings.resolved_initial_peers).start()
        self.dht = self.dht_client.dht
        if self.enable_chat and any(m.path for m in self.settings.models):
            self.engine = self._make_chat_engine()
            from chat.feedback import WorkerBeat

            self.worker_beat = WorkerBeat(self.store, self.engine).start()
        self.dht_client.on_up(self._dht_up)
        if self.run_poller:
            from monitor.app.jobs import Poller
            from monitor.app.leadership import for_settings

            self.poller = Poller(self.settings, self.store, self.dht_client,  # (the generation checks
                                 leadership=for_settings(self.store, self.settings),  # use the chat's engine)
                                 chat_engine=self.engine)
            self.poller.start()
        if self.demo_controls is not None:  # a chaos control's stop or start: the leader polls at once
            self.demo_controls.on_change = lambda: self.store.request_job("scrape", by="demo")
        self.app = self._make_app()
        return self

    def _make_chat_engine(self):
        from chat.client_side import ClientSideSettings
        from chat.engine import Capacity, ChatEngine
        from chat.feedback import StoreForecasts, StoreRequests, StoreWeights, store_assessment_check, store_outcome_sink
        from chat.policy import RoutingSettings

        self.weights = StoreWeights(self.store).start()
        self.requests = StoreRequests(self.store, on_written=self._refresh_forecasts_soon).start()
        chat_models = [m for m in self.settings.models if m.path]
        self.forecasts = StoreForecasts(self.store, [m.dht_prefix for m in chat_models]).start()
        return ChatEngine(
            self.dht, [m for m in self.settings.models if m.path],
            score_source=self.weights,
            outcome_sink=store_outcome_sink(self.store, self.weights),
            assessment_check=store_assessment_check(self.store),
            routing=RoutingSettings.from_settings(self.settings),
            capacity=Capacity.from_settings(self.settings),
            max_batch_rows=self.settings.max_batch_rows,
            max_logprobs=self.settings.max_logprobs,
            cache_wait=self.settings.chat_cache_wait,
            request_sink=self.requests,
            forecast_source=self.forecasts,
            client_side=ClientSideSettings.from_settings(self.settings),
            keep_seconds=self.settings.chat_keep_sessions,
            keep_headroom=self.settings.chat_keep_headroom,
            shared=self.settings.chat_shared,
            worker=self.settings.chat_worker,
        )

    def _refresh_forecasts_soon(self) -> None:
        if self.forecasts is not None:
            self.forecasts.refresh_soon()

    def _make_app(self):
        from monitor.web import create_app

        blueprints = []
        if self.engine is not None:
            from chat.http import create_blueprint
            from chat.conversations import ConversationLimits, ConversationStore
            from chat.http.limits import ChatLimits

            blueprints.append(create_blueprint(self.engine, ChatLimits.from_settings(self.settings), ConversationStore(
                self.store, ConversationLimits.from_settings(self.settings))))
        app = create_app(self.settings, self.store, chat_blueprints=blueprints,
                         demo_controls=self.demo_controls, reachability_check=self.reachability_check)
        # This process has imported torch and petals (hundreds of thousands of long-lived objects):
        # move them out of the collector's reach, or every full collection stalls a request ~190 ms.
        gc.collect()
        gc.freeze()
        return app

    def _dht_up(self, dht) -> None:
        self.dht = dht
        if self.engine is not None:
            self.engine.dht = dht  # (petals' client takes the hivemind DHT itself)

    def reachability_check(self, peer_id: str):
        from monitor.core.snapshot import ReachabilityResult
        from monitor.swarm import check_servers

        if self.dht is None:
            return ReachabilityResult(peer_id=peer_id, kind="server", ok=False, error=self.dht_client.problem)
        batch = check_servers(self.dht, [peer_id], timeout=self.settings.reachability_timeout, concurrency=1)
        return batch.results[0] if batch.results else None

    def serve_in_thread(self, host: Optional[str] = None, port: Optional[int] = None) -> int:
        """Serve the web app on a background thread; returns the bound port (0 picks a free one)."""
        from werkzeug.serving import make_server

        self._server = make_server(host or self.settings.host, self.settings.port if port is None else port,
                                   self.app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="web", daemon=True)
        self._thread.start()
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
        if self.poller is not None:
            self.poller.shutdown()
        if self.worker_beat is not None:
            self.worker_beat.close()  # (its last report: stopped)
            self.worker_beat = None
        if self.engine is not None:
            self.engine.close()
        if self.weights is not None:
            self.weights.close()
        if self.requests is not None:
            self.requests.close()  # (what waits is written first)
        if self.forecasts is not None:
            self.forecasts.close()
        if self.dht_client is not None:
            self.dht_client.shutdown()
            self.dht_client = self.dht = None
        if self.store is not None:
            self.store.close()


def drain_on(signum: int, engine) -> None:
    """On ``signum`` (gunicorn's graceful stop: SIGTERM), the engine drains first
    (``ChatEngine.drain``: answers in progress finish, no new one starts), then gunicorn's own
    handler runs (it stops accepting and waits up to ``--graceful-timeout`` for the requests in
    flight). Installed after gunicorn's: the worker loads the app after setting its handlers."""
    previous = signal.getsignal(signum)

    def handler(sig, frame):
        try:
            engine.drain()
        except Exception:  # noqa: BLE001 - the stop goes on whatever the drain met
            log.exception("draining the chat failed")
        if callable(previous):
            previous(sig, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    signal.signal(signum, handler)
