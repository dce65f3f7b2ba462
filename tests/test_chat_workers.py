"""Spec: several chat workers behind a proxy (README: Several chat workers) — each answer says which
worker it came from and sets the cookie a proxy routes the browser's later requests by; a kept
session's handle begins with the worker's tag and may come as ``X-Petals-Session`` too, where a
proxy can read it (pure: the chat's blueprint in a plain Flask app, no swarm)."""

from __future__ import annotations

from chat.engine import ChatEngine
from chat.http import WORKER_COOKIE, create_blueprint
from chat.http.openai_request import session_handle
from chat.http.params import Params
from chat.kept import new_handle
from monitor.web import create_app
from support import sqlite_store, web_settings


def app_of(worker, tmp_path):
    """The monitor's app with the chat's blueprint, as ``serve`` makes it (no swarm, no model)."""
    engine = ChatEngine(None, [], worker=worker)
    store = sqlite_store(tmp_path / (worker or "alone"))
    app = create_app(web_settings(data_dir=tmp_path / (worker or "alone")), store,
                     chat_blueprints=[create_blueprint(engine)])
    return app, engine, store


def test_a_worker_s_answers_name_it_and_set_the_cookie_the_proxy_routes_by_once(tmp_path):
    app, engine, store = app_of("w2", tmp_path)
    try:
        client = app.test_client()
        first = client.get("/chat")
        assert first.status_code == 200 and first.headers["X-Chat-Worker"] == "w2"
        assert f"{WORKER_COOKIE}=w2" in first.headers["Set-Cookie"] and "HttpOnly" in first.headers["Set-Cookie"]
        again = client.get("/v1/models")  # the cookie is sent back now: not set again
        assert again.headers["X-Chat-Worker"] == "w2" and "Set-Cookie" not in again.headers
        from prometheus_client import CollectorRegistry, generate_latest

        from chat.metrics import ChatCollector

        registry = CollectorRegistry()
        registry.register(ChatCollector(engine))
        assert 'swarm_monitor_chat_worker_info{worker="w2"} 1.0' in generate_latest(registry).decode()
        client.set_cookie(WORKER_COOKIE, "w1")  # a browser routed here though another worker set its cookie
        assert f"{WORKER_COOKIE}=w2" in client.get("/v1/models").headers["Set-Cookie"]  # it is this one's now
    finally:
        engine.close()
        store.close()
    alone, engine, store = app_of(None, tmp_path)  # one worker (no chat_worker): nothing of the kind
    try:
        answer = alone.test_client().get("/chat")
        assert "X-Chat-Worker" not in answer.headers and WORKER_COOKIE not in answer.headers.get("Set-Cookie", "")
    finally:
        engine.close()
        store.close()


def test_a_kept_session_s_handle_begins_with_its_worker_and_may_come_as_a_header():
    handle = new_handle("w3")
    assert handle.startswith("w3.") and len(handle) <= 100 and new_handle("w3") != handle
    assert "." not in new_handle()  # one worker: the handle as before
    assert session_handle(Params({"petals": {"session": handle}})) == handle
    assert session_handle(Params({}, session_header=handle)) == handle  # X-Petals-Session
    assert session_handle(Params({"petals": {"session": handle}}, session_header="w1.other")) == handle  # body first
    assert session_handle(Params({})) is None


def test_a_draining_worker_refuses_new_answers_with_retry_after_and_lets_its_open_sessions_go(tmp_path):
    """SIGTERM (gunicorn's graceful stop; ``service.drain_on``): the engine drains before gunicorn's
    own handler runs; then a POST or a WebSocket is 503 with ``Retry-After`` in its API's shape (the
    proxy may hand it to another worker), reads go on, and open sessions are told they expired — the
    idle ones at once, the others when their turn ends."""
    import os
    import signal

    from chat.capacity import GENERATING, IDLE, Capacity, OpenSessions
    from monitor.app.service import drain_on

    app, engine, store = app_of("w4", tmp_path)
    before = signal.getsignal(signal.SIGUSR1)
    called = []
    try:
        signal.signal(signal.SIGUSR1, lambda sig, frame: called.append(sig))  # (gunicorn's handler, here)
        drain_on(signal.SIGUSR1, engine)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert engine.draining and called == [signal.SIGUSR1]  # drained, then the previous handler ran
        client = app.test_client()
        refused = client.post("/v1/completions", json={"model": "any", "prompt": "hi"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert "stopping" in refused.get_json()["error"]["message"]
        assert client.post("/api/v1/generate", data={"model": "any"}).status_code == 503
        assert client.get("/v1/models").status_code == 200
    finally:
        signal.signal(signal.SIGUSR1, before)
        engine.close()
        store.close()

    class Member:
        label, max_length = "s", 1

        def __init__(self):
            self.told = None

        def expire(self, detail):
            self.told = detail

    sessions = OpenSessions(Capacity())
    idle, busy = Member(), Member()
    sessions.admit(idle, "10.7.0.1")
    sessions.admit(busy, "10.7.0.2")
    sessions.set_state(busy, GENERATING)
    assert sessions.stop("stopping") == 1 and idle.told == "stopping" and busy.told is None
    sessions.set_state(busy, IDLE)  # its turn ended: it goes now
    assert busy.told == "stopping" and sessions.load().states == {IDLE: 0, "waiting": 0, GENERATING: 0}


def test_each_chat_worker_reports_itself_and_the_overview_shows_it_alive_then_stopped(tmp_path):
    """``WorkerBeat`` (``serve`` and the chat's gunicorn worker start it): its report on the store,
    read by the overview's chat workers panel — alive with its slots, then stopped when it closes;
    a worker silent past 30 s is gone."""
    import time

    from chat.feedback import WorkerBeat
    from monitor.store import chat_workers

    app, engine, store = app_of("w5", tmp_path)
    try:
        beat = WorkerBeat(store, engine, period=3600).start()
        with store.db.write("a worker long silent") as conn:
            chat_workers.record(conn, chat_workers.ChatWorker(worker="old-1", host="h", pid=7, started_at=1.0,
                                                              beat_at=time.time() - 120, tag="w9"))
        page = app.test_client().get("/").get_data(as_text=True)
        assert 'data-chat-workers="1"' in page  # one alive
        assert 'data-chat-worker="w5" data-alive="yes"' in page and "0 of 4 slots busy" in page
        assert 'data-chat-worker="w9" data-alive="no"' in page and "silent since" in page
        beat.close()
        with store.db.read("the reports") as conn:
            assert {w.tag: w.stopped for w in chat_workers.recent(conn, 0)} == {"w5": True, "w9": False}
        fresh = create_app(web_settings(data_dir=tmp_path / "w5"), store)  # (the overview's live cache: 10 s)
        page = fresh.test_client().get("/").get_data(as_text=True)
        assert 'data-chat-worker="w5" data-alive="no"' in page and "stopped since" in page
    finally:
        engine.close()
        store.close()
