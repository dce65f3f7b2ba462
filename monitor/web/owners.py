"""Owners: proof of running a server, with the server's own key (``core/ownership.py``)::

    POST /api/v1/owners/nonce   {"peer_id"}      -> {"origin", "peer_id", "nonce", "expires"}
    POST /api/v1/owners/proof   {"peer_id", "nonce", "expires", "public_key", "signature"}
                                (Authorization: Bearer <owner token> links it to that owner)
                                -> {"owner_token" (a new owner's, shown once), "peers": [...]}
    GET  /api/v1/owners/me      (Authorization: Bearer <owner token>) -> {"peers", "subscriptions"}
    POST /api/v1/owners/subscriptions {"webhook": "https://..."} (the owner token) -> {"id", "secret"}
    DELETE /api/v1/owners/subscriptions/<id>  (the owner token, or ?secret=)

A subscription hears every notice that names one of its owner's servers (down, left, unreachable,
failing, wrong outputs, slow; and their recovery), as the generic webhook body, through the same
outbox as the operators' webhooks; its address must be public when it is called
(``app/owner_hooks.py``), never the monitor's own network.

The statement signed is built by the owner's own tool (``swarm-monitor-client prove``), never
handed to it; the monitor checks its origin (``public_url``), the nonce it issued for that peer id
(single use, ``NONCE_TTL``), the expiry, the key hashing to the peer id and the signature. No
proofs are taken while ``public_url`` is unset. Bounded per address and per peer id
(``store/owners.py``).
"""

from __future__ import annotations

import re
import time
from typing import Optional
from urllib.parse import urlsplit

from flask import Blueprint, abort, jsonify, request
from pydantic import BaseModel, Field

from monitor.api_doc import MonitorError, Open, documented
from monitor.core.ownership import Claim, ProofError, check
from monitor.store import owners
from monitor.web import deps, security

bp = Blueprint("owners", __name__, url_prefix="/api/v1/owners")


class NonceBody(BaseModel):
    peer_id: str = Field(description="the server's peer id (12D3KooW... or Qm...)")


class Nonce(Open):
    origin: str
    peer_id: str
    nonce: str
    expires: int


class ProofBody(BaseModel):
    peer_id: str
    nonce: str
    expires: int
    public_key: str = Field(description="the server's RSA public key, DER (SubjectPublicKeyInfo), base64")
    signature: str = Field(description="RSA-PSS (SHA-256) over the statement (core/ownership.py), base64")


class Proven(Open):
    owner_token: Optional[str] = Field(None, description="a new owner's token, shown once: keep it")
    peers: list[dict]
    subscriptions: list[dict] = []


class SubscriptionBody(BaseModel):
    webhook: Optional[str] = Field(None, description="an http(s) URL whose address is public (checked when called)")
    email: Optional[str] = Field(None, description="an address, confirmed by the link sent to it first "
                                                   "(when the operator set owner_email)")


class Subscribed(Open):
    id: str
    secret: str = Field(description="ends the subscription without the owner token: shown once")


MAX_URL = 500


def _origin() -> str:
    origin = deps().settings.public_url
    if not origin:
        abort(503, description="this monitor takes no proofs: its operator has not set public_url")
    return origin.rstrip("/")


def _body(*fields: str) -> dict:  # (the fields it must have)
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        abort(400, description="the body must be a JSON object")
    for name in fields:
        if name not in body:
            abort(400, description=f"{name} is required")
    return body


def _bearer() -> Optional[str]:
    header = request.headers.get("Authorization", "")
    return header[7:].strip()[:200] if header.startswith("Bearer ") else None


@bp.post("/nonce")
@documented("A nonce for a proof of running a server (single use, 5 minutes)", "Owners",
            {200: Nonce, 400: MonitorError, 429: MonitorError, 503: MonitorError}, body=NonceBody)
def nonce():
    origin = _origin()
    peer_id = _body("peer_id")["peer_id"]
    if not isinstance(peer_id, str) or not security.is_peer_id(peer_id):
        abort(400, description=f"peer_id: {security.not_peer_id(str(peer_id))}")
    now = time.time()
    try:
        with deps().store.db.write("issuing an owner's nonce") as conn:
            issued, expires = owners.issue_nonce(conn, peer_id, request.remote_addr or "", now)
    except owners.OwnersFull as e:
        abort(429, description=str(e))
    return jsonify(origin=origin, peer_id=peer_id, nonce=issued, expires=int(expires))


@bp.post("/proof")
@documented("Prove you run a server: its key's signature over the statement", "Owners",
            {200: Proven, 400: MonitorError, 403: MonitorError, 429: MonitorError, 503: MonitorError}, body=ProofBody)
def proof():
    origin = _origin()
    body = _body("peer_id", "nonce", "expires", "public_key", "signature")
    fields = (body["peer_id"], body["nonce"], body["public_key"], body["signature"])
    if not all(isinstance(v, str) for v in fields) or not isinstance(body["expires"], int):
        abort(400, description="peer_id, nonce, public_key and signature are strings, expires a whole number")
    if not security.is_peer_id(body["peer_id"]):
        abort(400, description=f"peer_id: {security.not_peer_id(body['peer_id'])}")
    now = time.time()
    claim = Claim(origin=origin, peer_id=body["peer_id"], nonce=body["nonce"][:128], expires=body["expires"])
    with deps().store.db.write("checking a proof of running a server") as conn:
        bound = owners.spend_nonce(conn, claim.nonce, now)  # spent whatever comes next: never twice
    try:
        check(claim, body["public_key"], body["signature"], origin=origin, now=now, nonce_peer=bound)
    except ProofError as e:
        abort(403, description=str(e))
    try:
        with deps().store.db.write("linking a proven server") as conn:
            owner, token = owners.link(conn, owners.owner_of(conn, _bearer(), now), claim.peer_id, now)
            peers = owners.peers_of(conn, owner)
    except owners.OwnersFull as e:
        abort(429, description=str(e))
    return jsonify(owner_token=token, peers=peers)


@bp.get("/me")
@documented("The servers an owner proved they run", "Owners", {200: Proven, 401: MonitorError})
def me():
    with deps().store.db.write("reading an owner") as conn:
        owner = owners.owner_of(conn, _bearer(), time.time())
        if owner is None:
            abort(401, description="send your owner token: Authorization: Bearer <token>")
        return jsonify(owner_token=None, peers=owners.peers_of(conn, owner),
                       subscriptions=owners.subscriptions_of(conn, owner))


def _owner(conn) -> str:
    owner = owners.owner_of(conn, _bearer(), time.time())
    if owner is None:
        abort(401, description="send your owner token: Authorization: Bearer <token>")
    return owner


EMAIL = re.compile(r"^[^@\s<>\"',;]{1,64}@[A-Za-z0-9.\-]{1,190}\.[A-Za-z]{2,24}$")


@bp.post("/subscriptions")
@documented("Hear of your own servers' troubles at a webhook, or by e-mail", "Owners",
            {200: Subscribed, 400: MonitorError, 401: MonitorError, 429: MonitorError, 502: MonitorError,
             503: MonitorError}, body=SubscriptionBody)
def subscribe():
    body = _body()
    if "email" in body:
        return _subscribe_email(body["email"])
    if "webhook" not in body:
        abort(400, description="webhook or email is required")
    url = body["webhook"]
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL:
        abort(400, description=f"webhook must be an http(s) URL of at most {MAX_URL} characters")
    try:
        with deps().store.db.write("subscribing an owner") as conn:
            sid, secret = owners.subscribe(conn, _owner(conn), url, time.time())
    except owners.OwnersFull as e:
        abort(429, description=str(e))
    return jsonify(id=sid, secret=secret)


def _subscribe_email(address) -> object:
    """An e-mail subscription, pending until the link the alert job sends to the address is followed."""
    _origin()  # (the link points there)
    if not deps().settings.alerts.owner_email:
        abort(503, description="this monitor sends no e-mail: its operator has not set owner_email")
    if not isinstance(address, str) or not EMAIL.match(address):
        abort(400, description="email must be one plain address, like owner@example.org")
    try:
        with deps().store.db.write("subscribing an owner by e-mail") as conn:
            sid, secret = owners.subscribe(conn, _owner(conn), f"mailto:{address}", time.time(), pending=True)
    except owners.OwnersFull as e:
        abort(429, description=str(e))
    return jsonify(id=sid, secret=secret, confirm="a link is on its way to the address: follow it to confirm")


@bp.get("/subscriptions/<sid>/confirm")
@documented("Confirm an e-mail subscription (the link it was sent)", "Owners", {200: Open, 404: MonitorError})
def confirm(sid: str):
    with deps().store.db.write("confirming an e-mail subscription") as conn:
        done = owners.confirm(conn, sid, (request.args.get("code") or "")[:64], time.time())
    if not done:
        abort(404, description="no such subscription waiting for this code (confirmed already, or ended)")
    return jsonify(confirmed=sid)


@bp.delete("/subscriptions/<sid>")
@documented("End a subscription (the owner token, or its secret)", "Owners", {200: Open, 404: MonitorError})
def unsubscribe(sid: str):
    with deps().store.db.write("ending an owner's subscription") as conn:
        owner = owners.owner_of(conn, _bearer())
        done = owners.unsubscribe(conn, sid, owner=owner, secret=None if owner else request.args.get("secret"))
    if not done:
        abort(404, description="no such subscription of yours")
    return jsonify(ended=sid)
