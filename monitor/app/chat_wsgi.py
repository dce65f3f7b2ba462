"""A chat worker for a production WSGI server: ONE gunicorn worker holding the DHT client, with threads.

    gunicorn --worker-class gthread --workers 1 --threads 32 --timeout 120 \\
        --bind 127.0.0.1:5001 monitor.app.chat_wsgi:app

Why one gunicorn worker: a chat worker holds a DHT client (a hivemind daemon, ~450 MiB with
torch), petals' routing state, its open and kept sessions and the chat page's turns in flight in
memory; threads serve the streams and WebSockets (each holds one while it lasts). More chat
workers are more such processes, each with its tag (``chat_worker``), sharing their load, slots
and rate limits through Redis (``chat_shared``) behind a proxy that keeps each conversation on its
worker (README: Several chat workers). Why no
``--preload``: the DHT client must start in the worker, after gunicorn forks (a forked DHT client
does not work). ``--timeout`` covers the start-up (torch, petals and the DHT: seconds to a minute).

Settings come from ``SWARM_MONITOR_*`` environment variables and the TOML file named by
``SWARM_MONITOR_CONFIG`` (monitor/settings.py), the same as the poller's and the web workers':
the chat reads peer scores and model coverage from the database the poller writes and records its
requests' outcomes there. No poller runs here (``swarm-monitor poll`` is its own process). A
reverse proxy sends the chat's routes here and everything else to ``monitor.web.wsgi`` (README:
Production serving).
"""

from __future__ import annotations

import atexit
import logging
import signal

from monitor.app.service import Service, drain_on
from monitor import logs
from monitor.settings import load_settings

log = logging.getLogger(__name__)


def make_service() -> Service:
    settings = load_settings()
    logs.configure(settings.log_format)
    if not settings.resolved_initial_peers:
        raise SystemExit("the chat needs the swarm's initial peers: set SWARM_MONITOR_INITIAL_PEERS (or 'public')")
    if not any(model.path for model in settings.models):
        raise SystemExit("no model to chat with: give a model a local checkpoint path in SWARM_MONITOR_MODELS "
                         "or the config file's [[models]] (path = ...)")
    service = Service(settings, run_poller=False, enable_chat=True).start()
    atexit.register(service.close)  # gunicorn's worker exits through sys.exit: the DHT daemon goes with it
    drain_on(signal.SIGTERM, service.engine)
    log.info("chat serving %s", ", ".join(service.engine.models.names))
    return service


service = make_service()
app = service.app
