"""Proven owners over the API (#50, ``web/owners.py``, ``store/owners.py``): a server's owner proves
with a real identity file's key and gets an owner token; the nonce is spent once; another origin, a
nonce of another server, a key that is not the server's are refused; the bounds hold; no proofs
without ``public_url``. (The proof itself: tests/test_ownership.py.)"""

from __future__ import annotations

import re
import time

from monitor.core.ownership import Claim
from monitor.store import owners
from monitor.web import create_app
from support import identity_file, owner_signature, sqlite_store, web_settings

ORIGIN = "https://monitor.example.org"


def prove(client, path, peer, *, origin=ORIGIN, token=None, nonce=None):
    issued = client.post("/api/v1/owners/nonce", json={"peer_id": peer}).get_json()
    claim = Claim(origin, peer, nonce or issued["nonce"], issued["expires"])
    key, signature = owner_signature(path, claim)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post("/api/v1/owners/proof", headers=headers, json={
        "peer_id": peer, "nonce": claim.nonce, "expires": claim.expires, "public_key": key, "signature": signature})


def test_an_owner_proves_two_servers_with_their_keys_and_nothing_forged_or_replayed_passes(tmp_path):
    store = sqlite_store(tmp_path)
    try:
        client = create_app(web_settings(public_url=ORIGIN), store).test_client()
        path, peer = identity_file(tmp_path)
        other_path, other = identity_file(tmp_path, "other.key")
        issued = client.post("/api/v1/owners/nonce", json={"peer_id": peer}).get_json()
        assert issued["origin"] == ORIGIN and issued["peer_id"] == peer and len(issued["nonce"]) >= 24
        first = prove(client, path, peer)
        assert first.status_code == 200, first.get_json()
        token = first.get_json()["owner_token"]
        assert token and [p["peer_id"] for p in first.get_json()["peers"]] == [peer]
        # the same owner links a second server (a new identity after a restart) with its token
        second = prove(client, other_path, other, token=token)
        assert second.status_code == 200 and second.get_json()["owner_token"] is None
        assert client.get(f"/api/v1/contributors/{peer}").get_json()["owner_proven_at"] is not None
        assert client.get(f"/api/v1/contributors/{peer[:-1] + ('a' if peer[-1] != 'a' else 'b')}").get_json()[
            "owner_proven_at"] is None
        mine = client.get("/api/v1/owners/me", headers={"Authorization": f"Bearer {token}"}).get_json()
        assert {p["peer_id"] for p in mine["peers"]} == {peer, other}
        assert client.get("/api/v1/owners/me", headers={"Authorization": "Bearer nope"}).status_code == 401
        # replayed: the body of a proof that passed, sent again
        body = {"peer_id": peer, "nonce": issued["nonce"], "expires": issued["expires"]}
        key, signature = owner_signature(path, Claim(ORIGIN, peer, issued["nonce"], issued["expires"]))
        assert client.post("/api/v1/owners/proof", json={**body, "public_key": key, "signature": signature}).status_code == 200
        again = client.post("/api/v1/owners/proof", json={**body, "public_key": key, "signature": signature})
        assert again.status_code == 403 and "used nonce" in again.get_json()["error"]
        for answer, why in ((prove(client, path, peer, origin="https://evil.example"), "signature"),
                            (prove(client, other_path, peer), "not the peer id's"),  # another server's key
                            ):
            assert answer.status_code == 403 and why in answer.get_json()["error"], answer.get_json()
        foreign = client.post("/api/v1/owners/nonce", json={"peer_id": other}).get_json()["nonce"]
        bound = prove(client, path, peer, nonce=foreign)  # a nonce issued for another server
        assert bound.status_code == 403 and "another peer id" in bound.get_json()["error"]
        for bad in ({}, {"peer_id": "not-a-peer"}, {"peer_id": 5}):
            assert client.post("/api/v1/owners/nonce", json=bad).status_code == 400
        assert client.post("/api/v1/owners/proof", json={"peer_id": peer}).status_code == 400
        # bounds: unused nonces of one server at once
        for _ in range(owners.NONCES_PER_PEER):
            client.post("/api/v1/owners/nonce", json={"peer_id": other})
        full = client.post("/api/v1/owners/nonce", json={"peer_id": other})
        assert full.status_code == 429 and "unused nonces" in full.get_json()["error"]
        # a monitor without public_url takes no proofs
        plain = create_app(web_settings(), store).test_client()
        assert plain.post("/api/v1/owners/nonce", json={"peer_id": peer}).status_code == 503
    finally:
        store.close()


def test_the_client_proves_a_server_over_http_with_its_identity_file_and_the_key_stays_home(tmp_path, capsys):
    """``swarm-monitor-client prove`` against the monitor served on loopback (real HTTP): it signs
    the statement it built for the origin typed, so a monitor that calls itself anything else
    refuses it; the one it was made for takes it and returns the owner token."""
    from swarm_monitor_client import prove as client

    from support import serve

    store = sqlite_store(tmp_path)
    apps: dict = {}
    try:
        path, peer = identity_file(tmp_path)
        with serve(lambda environ, start: apps["now"](environ, start)) as base:
            apps["now"] = create_app(web_settings(), store)  # no public_url: no proofs
            assert client.main(["prove", "--identity", str(path), "--monitor", base]) == 1
            assert "takes no proofs" in capsys.readouterr().err
            apps["now"] = create_app(web_settings(public_url="https://elsewhere.example"), store)
            assert client.main(["prove", "--identity", str(path), "--monitor", base]) == 1
            assert "signature is not the key's" in capsys.readouterr().err
            apps["now"] = create_app(web_settings(public_url=base), store)
            assert client.main(["prove", "--identity", str(path), "--monitor", base + "/some/page"]) == 0
            said = capsys.readouterr().out
            assert f"proven: you run {peer}" in said and "your owner token" in said
    finally:
        store.close()


def test_an_owners_webhook_never_reaches_a_private_address_and_ends_with_its_secret(tmp_path):
    from monitor.app import owner_hooks
    from monitor.app.webhooks import DeliveryError
    from monitor.harness.webhook_receiver import WebhookReceiver

    for address, public in (("127.0.0.1", False), ("10.1.2.3", False), ("192.168.0.9", False), ("169.254.169.254", False),
                            ("100.64.0.1", False), ("0.0.0.0", False), ("::1", False), ("::ffff:127.0.0.1", False),
                            ("fd00::1", False), ("8.8.8.8", True), ("2001:4860:4860::8888", True)):
        assert owner_hooks.public(address) is public, address
    with WebhookReceiver() as receiver:
        for url in (receiver.url, receiver.url.replace("127.0.0.1", "localhost")):  # by name too: the socket is checked
            try:
                owner_hooks.send(url, b"{}", timeout=5)
                raise AssertionError("a loopback webhook was called")
            except DeliveryError as e:
                assert "is not public" in str(e)
        assert receiver.received == []
        owner_hooks.send(receiver.url, b'{"event": "firing"}', timeout=5, allow_private=True)  # the operator allows it
        assert receiver.wait_for(1, 5) == [{"event": "firing"}]
    store = sqlite_store(tmp_path)
    try:
        client = create_app(web_settings(public_url=ORIGIN), store).test_client()
        path, peer = identity_file(tmp_path)
        token = prove(client, path, peer).get_json()["owner_token"]
        auth = {"Authorization": f"Bearer {token}"}
        hook = {"webhook": "https://hooks.example.org/petals"}
        assert client.post("/api/v1/owners/subscriptions", json=hook).status_code == 401
        assert client.post("/api/v1/owners/subscriptions", headers=auth, json={"webhook": "ftp://x"}).status_code == 400
        made = client.post("/api/v1/owners/subscriptions", headers=auth, json=hook).get_json()
        assert made["id"] and made["secret"]
        assert [s["url"] for s in client.get("/api/v1/owners/me", headers=auth).get_json()["subscriptions"]] == \
            [hook["webhook"]]
        assert client.delete(f"/api/v1/owners/subscriptions/{made['id']}?secret=wrong").status_code == 404
        assert client.delete(f"/api/v1/owners/subscriptions/{made['id']}?secret={made['secret']}").status_code == 200
        for _ in range(owners.SUBSCRIPTIONS_PER_OWNER):
            assert client.post("/api/v1/owners/subscriptions", headers=auth, json=hook).status_code == 200
        assert client.post("/api/v1/owners/subscriptions", headers=auth, json=hook).status_code == 429
    finally:
        store.close()


def test_an_owner_subscribes_by_email_confirms_the_link_and_hears_of_their_failing_server(tmp_path):
    """By e-mail to a real SMTP server on 127.0.0.1 (aiosmtpd): the alert job sends the link, the
    owner follows it, and the notice naming their server arrives at their address only."""
    from dataclasses import replace

    from monitor.app.alerter import Alerter
    from monitor.core.assess import lost_servers
    from monitor.core.assessment import CAUSE_FAILING, CAUSE_SERVING, Assessment, ServerAssessment
    from monitor.core.snapshot import ModelInfo, ServerRow, Snapshot
    from support import Smtp

    smtp = Smtp()
    smtp.start()
    store = sqlite_store(tmp_path)
    try:
        mail = f"mailto://127.0.0.1:{smtp.port}?from=monitor@example.org&mode=insecure"
        settings = web_settings(public_url=ORIGIN, alerts={
            "owner_email": mail, "retry_backoff": 1, "rules": [{"name": "model-health", "kind": "model_degraded",
                                                                 "for": 0}]})
        client = create_app(settings, store).test_client()
        path, peer = identity_file(tmp_path)
        token = prove(client, path, peer).get_json()["owner_token"]
        auth = {"Authorization": f"Bearer {token}"}
        assert client.post("/api/v1/owners/subscriptions", headers=auth, json={"email": "not an address"}).status_code == 400
        made = client.post("/api/v1/owners/subscriptions", headers=auth, json={"email": "owner@example.org"})
        assert made.status_code == 200 and "link" in made.get_json()["confirm"]
        alerter = Alerter(settings, store, watching_since=time.time() - 100)
        alerter.deliver()
        [(to, letter)] = smtp.inbox.messages
        assert to == ["owner@example.org"] and letter["Subject"] == "Confirm your petals server notices"
        link = re.search(r"(/api/v1/owners/subscriptions/\S+)", letter.get_content()).group(1)
        assert client.get(link.replace("code=", "code=x")).status_code == 404  # a wrong code confirms nothing
        assert client.get(link).status_code == 200 and client.get(link).status_code == 404  # once
        # the owner's server fails (confirmed): the model's notice names it, and reaches the owner
        model, other = ModelInfo("llama", 4, name="Llama 2"), "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
        rows = (ServerRow(peer, "llama", 0, 4, "ONLINE"), ServerRow(other, "llama", 0, 4, "ONLINE"))
        now = time.time()
        fine = replace(Assessment.not_diagnosed("llama", 4, "unused"), state="healthy", reasons=(), servers={
            peer: ServerAssessment(peer, CAUSE_SERVING), other: ServerAssessment(other, CAUSE_SERVING)})
        store.record_poll(Snapshot(taken_at=now - 60, duration=1.0, models=(model,), servers=rows), [fine])
        alerter.evaluate(now - 59)
        broken = replace(fine, state="degraded", reasons=(f"{peer} (0:4) is ONLINE but failing: CUDA error",),
                         excluded_peers={peer: "failing: CUDA error"}, excluded_causes={peer: CAUSE_FAILING}, servers={
            peer: ServerAssessment(peer, CAUSE_FAILING, failing="CUDA error", confirmed=True),
            other: ServerAssessment(other, CAUSE_SERVING)})
        broken = broken.with_lost(lost_servers(rows, {}, broken.excluded_peers))  # as the assess step draws it
        store.record_poll(Snapshot(taken_at=now, duration=1.0, models=(model,), servers=rows), [broken])
        assert [n.event for n in alerter.evaluate(now + 1).notices] == ["firing"]
        alerter.deliver(now + 2)
        [_, (to, notice)] = smtp.inbox.messages
        assert to == ["owner@example.org"] and "failing" in notice.get_content()
    finally:
        store.close()
        smtp.stop()
