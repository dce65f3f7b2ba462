"""Incident notes over HTTP: operators post, update and resolve them; everyone reads them.

- ``GET /api/v1/notes`` (``?days=``: resolved ones of the last days too, default 7, at most 90) and
  ``GET /api/v1/notes/<id>`` — notes with their history, for anyone;
- ``POST /api/v1/notes`` (``scope`` swarm | model | peer, ``target``, ``text``, ``author``),
  ``POST /api/v1/notes/<id>`` (new ``text``) and ``POST /api/v1/notes/<id>/resolve`` (optional
  last ``text``) — operators only, with ``Authorization: Bearer <token>``; JSON or a form;
- the same three under ``/notes`` for the status page's forms (a logged-in session and its CSRF
  token); they answer with a redirect to the status page (or a same-site ``next``).

Everything sent is checked here, where it enters (``core.incidents``' rules for the text and
author, ``security`` for the target): an anonymous request gets 401 (403 without a CSRF token),
a bad field, a text too long or with control characters, or an id that is not a number 400, an
unknown id 404 — and the store is left as it was. Templates escape the text; it is never markup.
The overview, the model page and the status page show the notes (``incident_notes``).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from flask import Blueprint, abort, jsonify, redirect, request, url_for

from monitor.api_doc import OPERATOR, MonitorError, documented
from monitor.core.common import DAY
from monitor.core.incidents import Note
from monitor.store import StoreError
from monitor.web import api_models as m
from monitor.web import auth, deps

log = logging.getLogger(__name__)

bp = Blueprint("notes", __name__)

MAX_ID_DIGITS = 15


def _fields(model):
    """The request's JSON object or form, as ``model`` (a 400 saying what is wrong)."""
    body = request.get_json(silent=True) if request.is_json else None
    if request.is_json and not isinstance(body, dict):
        abort(400, description="send a JSON object with scope, target and text (or a form)")
    try:
        return m.checked(model, body if body is not None else request.form.to_dict())
    except m.BadInput as e:
        abort(400, description=str(e))


def _note_id(raw: str) -> int:
    if not raw.isdigit() or len(raw) > MAX_ID_DIGITS:
        abort(400, description=f"{raw[:40]!r} is not a note id (a positive number)")
    return int(raw)


def _found(note: Optional[Note], note_id: str) -> Note:
    """The note, or a 404 when the store has no note of that id."""
    if note is None:
        abort(404, description=f"no note {note_id}")
    return note


def _via() -> str:
    return "api token" if request.headers.get("Authorization", "").lower().startswith("bearer ") else "browser session"


def _is_api() -> bool:
    return request.path.startswith("/api/")


def _answer(note: Note, status: int = 200):
    if _is_api():
        return jsonify(note=note.to_dict()), status
    target = request.form.get("next") or ""
    safe = target.startswith("/") and not target.startswith("//") and "\\" not in target
    return redirect(target if safe else url_for("status.page") + f"#note-{note.id}", code=303)


@bp.get("/api/v1/notes")
@documented("Open notes, and those resolved within the last `days`", "Notes", {200: m.Notes, 400: MonitorError},
            query=m.NotesQuery)
def list_api():
    """Open notes, and those resolved within ``?days=`` (default 7), newest change first."""
    try:
        days = m.checked(m.NotesQuery, request.args.to_dict()).days
    except m.BadInput as e:
        abort(400, description=str(e))
    found = deps().store.notes(resolved_since=time.time() - days * DAY)
    return jsonify(notes=[n.to_dict() for n in found])


@bp.get("/api/v1/notes/<note_id>")
@documented("A note with its history", "Notes", {200: m.OneNote, **m.ERRORS})
def one_api(note_id: str):
    return jsonify(note=_found(deps().store.note(_note_id(note_id)), note_id).to_dict())


@bp.post("/api/v1/notes")
@bp.post("/notes")
@documented("Post a note", "Notes", {201: m.OneNote, 400: MonitorError}, body=m.NoteBody, form=True, auth=OPERATOR)
@auth.operator_required
def post():
    note = _fields(m.NoteBody)
    store = deps().store
    note_id = store.post_note(note.scope, note.target, note.text, author=note.author, via=_via())
    return _answer(store.note(note_id), 201)


@bp.post("/api/v1/notes/<note_id>")
@bp.post("/notes/<note_id>")
@documented("Update a note's text", "Notes", {200: m.OneNote, **m.ERRORS}, body=m.NoteUpdate, form=True, auth=OPERATOR)
@auth.operator_required
def update(note_id: str):
    key = _note_id(note_id)
    change = _fields(m.NoteUpdate)
    return _answer(_found(deps().store.update_note(key, change.text, author=change.author, via=_via()), note_id))


@bp.post("/api/v1/notes/<note_id>/resolve")
@bp.post("/notes/<note_id>/resolve")
@documented("Resolve a note (with an optional last word)", "Notes", {200: m.OneNote, **m.ERRORS}, body=m.NoteResolution,
            form=True, auth=OPERATOR)
@auth.operator_required
def resolve(note_id: str):
    key = _note_id(note_id)
    change = _fields(m.NoteResolution)
    return _answer(_found(deps().store.resolve_note(key, text=change.text, author=change.author, via=_via()), note_id))


def incident_notes(model: Optional[str] = None, peers: tuple[str, ...] = (), *, everything: bool = False) -> list[Note]:
    """Open notes for a page: all of them (``everything``: the overview), else the swarm's and
    those about ``model`` or ``peers``. Never raises: while the database is away the pages show
    the last state they read, without notes."""
    try:
        found = [n for n in deps().store.notes(resolved_since=None) if n.open]
    except StoreError as e:
        log.warning("incident notes unavailable: %s", e)
        return []
    return found if everything else [n for n in found if n.about(model=model, peers=tuple(peers))]


@bp.app_context_processor
def _helpers():
    return {"incident_notes": incident_notes}
