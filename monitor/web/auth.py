"""Two roles: anyone reads and chats; operators change things. Operators prove it with a token.

A monitor like this runs on a public address, so every visitor is untrusted. Reading every page and
API, and chatting within limits, needs nothing. Every state change (pinning or blocking a peer, the
demo's chaos controls, and whatever is added later) needs the operator role:

- **scripts and the CLI** send ``Authorization: Bearer <token>``;
- **browsers** log in once at ``/login`` with the token (or open the login URL the service prints,
  ``/login?token=...``, as Jupyter does) and get a signed, HttpOnly, SameSite session cookie; their
  forms and htmx requests carry a CSRF token (Flask-WTF), so another site cannot act through them.

The token is ``admin_token`` from the settings, else the file ``admin_token_file``, else
``<data_dir>/admin_token``, created at first start with a random token, readable by its owner only
(0600): the CLI's ``chaos`` command of the same user, and every web worker, find it there. The
session-signing key is derived from the token, so all workers agree and changing the token logs
everybody out.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlsplit

from flask import Blueprint, Flask, abort, current_app, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect
from werkzeug.exceptions import Forbidden

log = logging.getLogger(__name__)

TOKEN_FILE_NAME = "admin_token"
MIN_TOKEN_CHARS = 16
SESSION_KEY = "operator"

bp = Blueprint("auth", __name__)


class TokenError(ValueError):
    """The configured token cannot be used; the message says why and what to do."""


def token_path(settings) -> Path:
    return Path(settings.admin_token_file) if settings.admin_token_file else settings.data_dir / TOKEN_FILE_NAME


def resolve_token(settings, *, create: bool = True) -> Optional[str]:
    """The operator token: configured, or read from its file, or (``create``) generated into it."""
    if settings.admin_token:
        return settings.admin_token
    path = token_path(settings)
    try:
        return _read_token(path)
    except FileNotFoundError:
        if not create or settings.admin_token_file:
            if settings.admin_token_file:
                raise TokenError(f"admin_token_file {path} does not exist; create it with a token of at least "
                                 f"{MIN_TOKEN_CHARS} characters, or unset it") from None
            return None
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    try:  # O_EXCL: several workers starting at once agree on the first one's token
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_token(path)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def _read_token(path: Path) -> str:
    token = path.read_text().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the operator token in {path} is shorter than {MIN_TOKEN_CHARS} characters")
    return token


def login_url(base_url: str, token: str) -> str:
    return f"{base_url.rstrip('/')}/login?token={token}"


def init_app(app: Flask, settings) -> None:
    """Operator auth, sessions and CSRF on ``app``."""
    token = resolve_token(settings)
    app.extensions["operator_token"] = token
    app.config.update(
        SECRET_KEY=hmac.new(token.encode(), b"swarm-monitor session key", hashlib.sha256).hexdigest(),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.proxy_hops > 0,  # behind a TLS proxy: cookies over https only
        SESSION_COOKIE_NAME="swarm_monitor_session",
        WTF_CSRF_TIME_LIMIT=None,  # valid for the session's life (pages stay open for hours)
        WTF_CSRF_SSL_STRICT=False,  # Referer checks break behind proxies; the token is the check
        WTF_CSRF_CHECK_DEFAULT=False,  # checked in _check_csrf below, which knows the exemptions
    )
    csrf = CSRFProtect(app)  # the app's own (it keeps its exemptions on itself)
    app.register_blueprint(bp)

    @app.before_request
    def _check_csrf():
        # Browsers' unsafe requests to pages need the CSRF token. Exempt: a bearer token (browsers
        # never send one by themselves), and the JSON APIs, whose anonymous calls change nothing
        # a visitor may not (operator calls there must use the bearer token, see is_operator).
        if request.method in ("GET", "HEAD", "OPTIONS") or _bearer_ok() or _is_api_path():
            return
        csrf.protect()

    @app.context_processor
    def _role():
        return {"is_operator": is_operator()}

    @app.errorhandler(CSRFError)
    def _csrf_failed(error):
        return app.handle_http_exception(Forbidden(
            description=f"this form has expired or did not come from this site ({error.description}); "
                        f"reload the page and try again"))


def _bearer_ok() -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    token = current_app.extensions.get("operator_token")
    return scheme.lower() == "bearer" and bool(token) and hmac.compare_digest(given.strip().encode(), token.encode())


def _is_api_path() -> bool:
    return request.path.startswith(("/api/", "/v1/"))


def is_operator() -> bool:
    """A valid bearer token, or a logged-in browser session on a CSRF-checked (non-API) path."""
    return _bearer_ok() or (session.get(SESSION_KEY) is True and not _is_api_path())


def operator_required(view: Callable) -> Callable:
    """401 for anonymous clients (with how to log in), else the view."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not is_operator():
            abort(401, description="operators only: log in at /login with the operator token, or send "
                                   "'Authorization: Bearer <token>'")
        return view(*args, **kwargs)

    return wrapped


def _safe_next(target: Optional[str]) -> str:
    """Only paths on this site (never another host) after logging in."""
    if target and target.startswith("/") and not target.startswith("//") and not urlsplit(target).netloc:
        return target
    return url_for("pages.overview")


def _log_in(given: str) -> bool:
    token = current_app.extensions["operator_token"]
    if given and hmac.compare_digest(given.strip().encode(), token.encode()):
        session.clear()
        session[SESSION_KEY] = True
        session.permanent = True
        return True
    return False


@bp.route("/login", methods=["GET", "POST"])
def login():
    if request.method == "GET" and request.args.get("token"):
        # the login URL the service prints: log in, then drop the token from the address bar
        if _log_in(request.args["token"]):
            return redirect(_safe_next(request.args.get("next")), code=303)
        return render_template("login.html", error="That token is not the operator token."), 403
    if request.method == "POST":
        if _log_in(request.form.get("token", "")):
            return redirect(_safe_next(request.form.get("next")), code=303)
        return render_template("login.html", error="That token is not the operator token.",
                               next=request.form.get("next")), 403
    return render_template("login.html", next=request.args.get("next"))


@bp.post("/logout")
def logout():
    session.clear()
    return redirect(url_for("pages.overview"), code=303)
