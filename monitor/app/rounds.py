"""One background thread per job that runs in rounds (server probes, generation checks): a round,
then a pause, until stopped. A failed round is logged and counted in the poller's ``JobStats``
under the job's name, and the next one comes as planned: a round must never end its job."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

log = logging.getLogger(__name__)


def start_rounds(name: str, run_once: Callable[[], object], pause: Callable[[], float], stop: threading.Event, *,
                 stats=None, first_pause: Optional[float] = None) -> threading.Thread:
    """Start a daemon thread calling ``run_once`` then waiting ``pause()`` seconds (or until
    ``stop`` is set), after waiting ``first_pause`` seconds first when given; returns it."""
    def loop():
        if first_pause:
            stop.wait(first_pause)
        while not stop.is_set():
            try:
                run_once()
                if stats is not None:
                    stats.ok(name)
            except Exception as e:  # noqa: BLE001 - a failed round must not end the job
                log.exception("%s round failed", name)
                if stats is not None:
                    stats.failed(name, e)
            stop.wait(pause())

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
