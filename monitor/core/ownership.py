"""Proof that someone runs a server (pure): a statement signed with the server's own key.

A petals server's identity is the private key of its ``--identity_path`` (hivemind's RSA key, a
libp2p ``PrivateKey`` message around a DER key); its peer id is the multihash (SHA-256) of its
public key, as libp2p encodes it. That key also signs the server's libp2p handshakes, so an owner's
tool never signs bytes it was handed: it builds the statement itself (``statement``) from fields it
can check — the purpose, the monitor's origin, the peer id, the monitor's nonce, an expiry — and
the monitor checks every field (``check``): its own origin, the nonce it issued for that peer id
(single use, short-lived: the store's part), the expiry, the public key hashing to the peer id, and
the signature (RSA-PSS with SHA-256, as hivemind signs).

No hivemind here: the web workers check proofs, and they import neither hivemind nor torch.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Optional

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

PURPOSE = "petals-swarm-monitor/ownership-proof/v1"
MAX_FIELD = 512  # characters of any field of a statement
MAX_KEY_BYTES = 4096  # a DER public key, at most (RSA 4096 is ~550 bytes)
MAX_SIGNATURE_BYTES = 1024
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
_RSA = 0  # libp2p's KeyType.RSA


class ProofError(ValueError):
    """Why a proof is refused, in words for its sender."""


@dataclass(frozen=True)
class Claim:
    """What a proof says: the monitor's origin, the peer id, the nonce, the expiry (unix seconds)."""

    origin: str
    peer_id: str
    nonce: str
    expires: int


def statement(claim: Claim) -> bytes:
    """The bytes an owner signs: every field on a line of its own, after the purpose, so that they
    can never be a libp2p handshake's (nor any other protocol's) message."""
    for value in (claim.origin, claim.peer_id, claim.nonce):
        if not value or len(value) > MAX_FIELD or any(ch in value for ch in "\r\n\0"):
            raise ProofError("every field of a statement is one line of at most 512 characters")
    return "\n".join((PURPOSE, claim.origin, claim.peer_id, claim.nonce, str(int(claim.expires)))).encode()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def peer_id_of(public_der: bytes) -> str:
    """The libp2p peer id of an RSA public key (DER SubjectPublicKeyInfo): base58 of the SHA-256
    multihash of its ``PublicKey`` protobuf message (key type RSA, then the key)."""
    message = b"\x08" + _varint(_RSA) + b"\x12" + _varint(len(public_der)) + public_der
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(message).digest()).decode()


def _unb64(text: str, limit: int, what: str) -> bytes:
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise ProofError(f"{what} is not base64") from None
    if not data or len(data) > limit:
        raise ProofError(f"{what} is empty or too long")
    return data


def check(claim: Claim, public_key_b64: str, signature_b64: str, *, origin: str, now: float,
          nonce_peer: Optional[str]) -> None:
    """Refuses (``ProofError``) a proof that is not for this monitor (``origin``), has expired, has a
    nonce this monitor did not issue for that peer id (``nonce_peer``: the peer id the store bound
    the nonce to, None when it knows no such unused nonce), a key that is not the peer id's, or a
    signature that is not that key's over ``statement(claim)``."""
    if claim.origin != origin:
        raise ProofError(f"the proof is for {claim.origin[:100]!r}, not for this monitor ({origin})")
    if claim.expires < now:
        raise ProofError("the proof has expired: ask for a new nonce")
    if nonce_peer is None:
        raise ProofError("unknown or used nonce: ask for a new one")
    if nonce_peer != claim.peer_id:
        raise ProofError("the nonce was issued for another peer id")
    der = _unb64(public_key_b64, MAX_KEY_BYTES, "public_key")
    if peer_id_of(der) != claim.peer_id:
        raise ProofError("the public key is not the peer id's (its hash is another peer id)")
    try:
        key = serialization.load_der_public_key(der)
    except ValueError:
        raise ProofError("public_key is not a DER public key") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise ProofError("public_key is not an RSA key (petals servers' identities are)")
    try:
        key.verify(_unb64(signature_b64, MAX_SIGNATURE_BYTES, "signature"), statement(claim), _PSS, hashes.SHA256())
    except InvalidSignature:
        raise ProofError("the signature is not the key's over this statement") from None
