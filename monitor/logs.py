"""The process's log lines: plain text (the default), or one JSON object per line
(``log_format = "json"``) for Loki, Elastic, journald and their kin.

A JSON line has ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``, the
``request`` (method and path) or ``job`` (the poller's job) it belongs to when there is one
(``context``), and ``error`` with the traceback when one is logged. hivemind, imported with petals,
puts a handler of its own on the root logger; that handler is given the same formatter
(``monitor.compat`` calls ``format_hivemind``), so every line of the process is JSON.

The context is a ``contextvars.ContextVar`` set for the length of a request (the web app) or a job
(the poller): each thread and task sees its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from typing import Iterator, Optional

from monitor.core.timefmt import iso

TEXT, JSON = "text", "json"
FORMATS = (TEXT, JSON)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MESSAGE_CHARS = 20_000  # one line stays a line a pipeline takes
# the standard names, whatever a library renamed them to (hivemind calls WARNING "WARN")
LEVELS = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
          logging.CRITICAL: "CRITICAL"}

context: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("log_context", default=None)
_format = TEXT


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": iso(record.created, milliseconds=True),
                "level": LEVELS.get(record.levelno, record.levelname), "logger": record.name,
                "message": record.getMessage()[:MESSAGE_CHARS]}
        line.update(context.get() or {})
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)[-MESSAGE_CHARS:]
        elif record.stack_info:
            line["stack"] = record.stack_info[-MESSAGE_CHARS:]
        return json.dumps(line, ensure_ascii=False, default=str)


def formatter() -> logging.Formatter:
    return JsonFormatter() if _format == JSON else logging.Formatter(TEXT_FORMAT)


def configure(log_format: str = TEXT, *, level: int = logging.INFO) -> None:
    """The root logger's one handler (stderr) in ``log_format``; hivemind's handler too, if it was
    made already (and when it is, ``format_hivemind``)."""
    global _format
    if log_format not in FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(FORMATS)}, not {log_format!r}")
    _format = log_format
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(formatter())
    root.setLevel(level)
    logging.captureWarnings(log_format == JSON)  # Python's warnings are log lines too (py.warnings)
    if "hivemind.utils.logging" in sys.modules:
        format_hivemind()


def format_hivemind() -> None:
    """hivemind's default handler (which petals moves to the root logger) in our format: in JSON
    mode, its lines are JSON too. Only once hivemind is imported (``monitor.compat``)."""
    if _format != JSON:
        return
    from hivemind.utils import logging as hivemind_logging

    hivemind_logging._initialize_if_necessary()  # (its handler exists from then on: give it our formatter)
    handler = getattr(hivemind_logging, "_default_handler", None)
    if handler is not None:
        handler.setFormatter(formatter())


class _Held(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held() -> Iterator[list]:
    """Log records made inside (reading the settings, before their ``log_format`` is known) are
    held, then told through the root logger's handlers in the format ``configure`` set inside it."""
    root = logging.getLogger()
    before, holder = list(root.handlers), _Held()
    for handler in before:
        root.removeHandler(handler)
    root.addHandler(holder)
    try:
        yield holder.records
    finally:
        root.removeHandler(holder)
        for handler in before:
            handler.setFormatter(formatter())
            if handler not in root.handlers:
                root.addHandler(handler)
        if not root.handlers:
            root.addHandler(logging.StreamHandler(sys.stderr))
            root.handlers[0].setFormatter(formatter())
        for record in holder.records:
            for handler in root.handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)


@contextlib.contextmanager
def about(**fields) -> Iterator[None]:
    """Log lines inside belong to this request or job (``request="GET /models/x"``, ``job="scrape"``)."""
    token = context.set({**(context.get() or {}), **fields})
    try:
        yield
    finally:
        context.reset(token)
