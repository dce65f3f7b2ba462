"""The chat over HTTP: the chat page, chat.petals.dev's API and the OpenAI API, in one
blueprint named "chat" (templates link its endpoints as ``chat.<view>``).

Thin views: each reads and checks its parameters (``params``; a bad one is a 400 that names
it), hands the work to ``chat.engine.ChatEngine`` and maps its errors to statuses (unknown model
404, model not fully served 503, busy 429 with Retry-After). Nobody gets a Python traceback.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint

from chat.engine import ChatEngine
from chat.http import openai_api, page, petals_api

PACKAGE = Path(__file__).resolve().parent.parent  # chat/
TEMPLATES = PACKAGE.parent / "templates"


def create_blueprint(engine: ChatEngine) -> Blueprint:
    """The chat page (/chat), the chat.petals.dev API (/api/v1/generate, ws /api/v2/generate) and
    the OpenAI API (/v1/...). The ws route needs a server that speaks WebSocket (werkzeug,
    gunicorn with threads)."""
    bp = Blueprint("chat", __name__, template_folder=str(TEMPLATES), static_folder=str(PACKAGE / "static"),
                   static_url_path="/chat/static")
    petals_api.register(bp, engine)
    openai_api.register(bp, engine)
    page.register(bp, engine)
    return bp
