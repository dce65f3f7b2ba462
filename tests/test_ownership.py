"""Proof of running a server (#50, ``monitor/core/ownership.py``): the peer id computed from a key
is hivemind's own (the reference), a statement signed with a real identity file's key is accepted,
and every forged, foreign, expired or re-bound proof is refused with its reason."""

from __future__ import annotations

import base64

import pytest

from monitor.core import ownership
from monitor.core.ownership import Claim, ProofError
from support import identity_file as identity, owner_signature as sign

ORIGIN = "https://monitor.example"
NOW = 1_800_000_000.0


def test_the_peer_id_of_a_key_is_hiveminds_and_a_proof_with_the_servers_own_key_holds(tmp_path):
    path, peer = identity(tmp_path)
    claim = Claim(ORIGIN, peer, "n0nce", int(NOW) + 300)
    key, signature = sign(path, claim)
    assert ownership.peer_id_of(base64.b64decode(key)) == peer  # hivemind's PeerID.from_identity, to the byte
    ownership.check(claim, key, signature, origin=ORIGIN, now=NOW, nonce_peer=peer)  # accepted: no error


def test_forged_foreign_expired_and_rebound_proofs_are_refused_with_their_reason(tmp_path):
    path, peer = identity(tmp_path)
    other_path, other = identity(tmp_path, "other.key")
    claim = Claim(ORIGIN, peer, "n0nce", int(NOW) + 300)
    key, signature = sign(path, claim)
    cases = [
        (Claim("https://evil.example", peer, "n0nce", claim.expires), key, signature, peer, "not for this monitor"),
        (Claim(ORIGIN, peer, "n0nce", int(NOW) - 1), key, signature, peer, "expired"),
        (claim, key, signature, None, "unknown or used nonce"),  # replayed: the store spent it
        (claim, key, signature, other, "issued for another peer id"),
        (Claim(ORIGIN, other, "n0nce", claim.expires), key, signature, other, "not the peer id's"),  # my key, their id
        (claim, sign(other_path, claim)[0], signature, peer, "not the peer id's"),
        (claim, key, sign(other_path, claim)[1], peer, "signature is not the key's"),  # forged
        (Claim(ORIGIN, peer, "n0nce", claim.expires + 1), key, signature, peer, "signature is not the key's"),  # altered
        (claim, "not base64!", signature, peer, "not base64"),
        (claim, key, base64.b64encode(b"x" * 5000).decode(), peer, "too long"),
    ]
    for bad_claim, bad_key, bad_signature, bound, why in cases:
        with pytest.raises(ProofError, match=why):
            ownership.check(bad_claim, bad_key, bad_signature, origin=ORIGIN, now=NOW, nonce_peer=bound)
    with pytest.raises(ProofError, match="one line"):
        ownership.statement(Claim(ORIGIN, peer, "a\nb", claim.expires))  # a line break would forge a field
