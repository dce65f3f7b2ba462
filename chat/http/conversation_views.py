"""The chat page's list of stored conversations (``chat.conversations``): listed and searched as an
htmx partial, renamed and deleted (one, or all of a visitor's), exported as Markdown or as JSON
(OpenAI's ``messages``, each answer's route and speed under ``petals``) and imported from that
JSON to go on with it. Every view acts only on the visitor's own conversations; anyone else's id
answers as unknown."""

from __future__ import annotations

import secrets
from typing import Callable, Optional

from flask import Blueprint, Response, abort, render_template, request, url_for

from chat.conversations import ConversationStore, exported, imported
from chat.errors import ChatError


def register(bp: Blueprint, kept: ConversationStore, forget: Callable[..., None],
             visitor: Callable[..., Optional[str]]) -> None:
    """``visitor(create=False)``: this browser's visitor id (``create``: made if it has none)."""

    def listing(status: int = 200, error: str = "") -> Response:
        who = visitor()
        query = request.values.get("q", "")
        found = kept.listed(who, query) if who else []
        response = Response(render_template("chat/_conversations.html", conversations=found, query=query,
                                            current=request.values.get("current", ""), error=error,
                                            limits=kept.limits), status=status)
        if error:
            response.headers["X-Chat-Error"] = "1"  # (chat.js swaps it into the list like a 200)
        return response

    @bp.get("/chat/conversations")
    def conversations_partial():
        return listing()

    @bp.post("/chat/conversations/<conversation_id>/rename")
    def rename_conversation(conversation_id):
        who = visitor()
        try:
            if not who or not kept.rename(who, conversation_id, request.form.get("title", "")):
                return listing(404, "no such conversation of yours")
        except ChatError as e:
            return listing(400, str(e))
        return listing()

    @bp.post("/chat/conversations/<conversation_id>/delete")
    def delete_conversation(conversation_id):
        who = visitor()
        if who and kept.delete(who, conversation_id):
            forget(who, conversation_id)
        return listing()

    @bp.post("/chat/conversations/delete")
    def delete_conversations():
        who = visitor()
        if who:
            kept.delete(who)
            forget(who)
        return listing()

    @bp.get("/chat/conversations/<conversation_id>/export.<kind>")
    def export_conversation(conversation_id, kind):
        found = kept.get(visitor(), conversation_id)
        if found is None or kind not in ("md", "json"):
            abort(404)
        body, mimetype = exported(found, kind)
        response = Response(body, mimetype=mimetype)
        response.headers["Content-Disposition"] = f'attachment; filename="conversation-{conversation_id}.{kind}"'
        return response

    @bp.post("/chat/conversations/import")
    def import_conversation():
        who = visitor(create=True)
        upload = request.files.get("file")
        raw = upload.read(kept.limits.max_chars * 4 + 1) if upload is not None else b""
        try:
            conversation = imported(raw, kept.limits)
            kept.check_room(who, None, sum(len(m["content"]) for m in conversation["messages"]), new=True)
        except ChatError as e:
            return listing(400, f"not imported: {e}")
        new_id = secrets.token_urlsafe(12)
        kept.save(who, new_id, model=conversation["model"], system=conversation["system"],
                  messages=conversation["messages"], title=conversation["title"])
        response = Response(status=204)
        response.headers["HX-Redirect"] = url_for("chat.page", c=new_id)
        return response
