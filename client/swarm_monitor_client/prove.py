"""Prove to a swarm monitor that you run a petals server, with the server's own key::

    swarm-monitor-client prove --identity ~/.petals/identity.key --monitor https://monitor.example.org
    swarm-monitor-client prove --identity server2.key --monitor https://monitor.example.org --token OWNER_TOKEN

The key (the file petals' ``--identity_path`` names) never leaves this machine. It also signs the
server's libp2p handshakes, so this tool never signs bytes it was handed: it asks the monitor for a
nonce, builds the statement itself — the purpose, the monitor's origin *as you typed it*, the peer
id, the nonce and the expiry, one per line — and sends the signature with the public key. The
first proof returns an owner token (shown once: keep it); ``--token`` links more servers to it.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

PURPOSE = "petals-swarm-monitor/ownership-proof/v1"  # the monitor's monitor/core/ownership.py says the same


def statement(origin: str, peer_id: str, nonce: str, expires: int) -> bytes:
    """The bytes signed (the monitor rebuilds them from its own origin)."""
    fields = (origin, peer_id, nonce)
    if any(not f or any(ch in f for ch in "\r\n\0") for f in fields):
        raise ValueError("a field of the statement is empty or spans lines")
    return "\n".join((PURPOSE, *fields, str(int(expires)))).encode()


def origin_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--monitor must be an http(s) URL, got {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def _post(url: str, body: dict, token: Optional[str], timeout: float) -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        try:
            reason = json.loads(e.read()).get("error")
        except ValueError:
            reason = None
        raise RuntimeError(f"{url}: {e.code} {reason or e.reason}") from None


def prove(identity: Path, monitor: str, *, token: Optional[str] = None, timeout: float = 30.0) -> dict:
    """Prove to ``monitor`` that you run the server of ``identity``; the monitor's answer."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding
    from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID
    from hivemind.proto import crypto_pb2

    data = Path(identity).read_bytes()
    peer_id = PeerID.from_identity(data).to_base58()
    private = serialization.load_der_private_key(crypto_pb2.PrivateKey.FromString(data).data, password=None)
    origin = origin_of(monitor)
    issued = _post(f"{origin}/api/v1/owners/nonce", {"peer_id": peer_id}, None, timeout)
    nonce, expires = str(issued["nonce"]), int(issued["expires"])
    signed = private.sign(statement(origin, peer_id, nonce, expires),
                          padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH),
                          hashes.SHA256())
    public = private.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    return _post(f"{origin}/api/v1/owners/proof", {
        "peer_id": peer_id, "nonce": nonce, "expires": expires, "public_key": base64.b64encode(public).decode(),
        "signature": base64.b64encode(signed).decode()}, token, timeout)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="swarm-monitor-client", description="Tools for a swarm monitor's users.")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prove", help="prove to a monitor that you run a petals server (its --identity_path key)")
    p.add_argument("--identity", type=Path, required=True, help="the server's identity file (petals' --identity_path)")
    p.add_argument("--monitor", required=True, help="the monitor's address, e.g. https://monitor.example.org")
    p.add_argument("--token", help="your owner token, to link this server to the servers you proved before")
    args = parser.parse_args(argv)
    try:
        answer = prove(args.identity, args.monitor, token=args.token)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"not proven: {e}", file=sys.stderr)
        return 1
    peers = ", ".join(p["peer_id"] for p in answer.get("peers", ()))
    print(f"proven: you run {peers}")
    if answer.get("owner_token"):
        print(f"your owner token (shown once, keep it): {answer['owner_token']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
