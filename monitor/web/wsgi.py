"""The web app for a production WSGI server (gunicorn), without the poller.

    gunicorn --worker-class gthread --workers 2 --threads 8 --bind 127.0.0.1:5000 monitor.web.wsgi:app

Settings come from ``SWARM_MONITOR_*`` environment variables and the TOML file named by
``SWARM_MONITOR_CONFIG`` (see monitor/settings.py); the database must be the one the poller
(``swarm-monitor poll``, a separate process) writes. Only reads happen here: no DHT, no scheduler,
so any number of workers can serve it side by side.
"""

from __future__ import annotations

from monitor import logs
from monitor.settings import load_settings
from monitor.store import Store
from monitor.web import create_app


def make_app():
    settings = load_settings()
    logs.configure(settings.log_format)
    store = Store.from_settings(settings)
    return create_app(settings, store)


app = make_app()
