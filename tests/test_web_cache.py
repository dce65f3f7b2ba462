"""Spec: what a web app keeps between requests belongs to that app (``create_app`` makes one
``WebCache``), so two apps in one process — over two stores whose change marks are alike, as two
fresh stores' are — never serve each other's pages, state, live checks or rate-limit budgets.

The two stores below hold the same peer at the same times with different announcements: every
cache keyed by change marks alone (not by its app) would hand one app's page to the other.
"""

from __future__ import annotations

import hashlib
import time

import base58
import pytest

from monitor.app.jobs import Poller
from monitor.core.snapshot import ONLINE, ModelInfo, ReachabilityBatch, ReachabilityResult, ServerRow, Snapshot
from monitor.settings import Settings
from monitor.store import Store
from monitor.store.schema import AssessmentRow
from monitor.web import create_app

MODEL = ModelInfo("cache-llama", 8, name="Cache Llama")
PEER = base58.b58encode(b"\x12\x20" + hashlib.sha256(b"one peer, two stores").digest()).decode()
BOOT = base58.b58encode(b"\x12\x20" + hashlib.sha256(b"bootstrap").digest()).decode()
# what each store's poll says of the same peer: its name, version, span and speed
SIDES = {
    "alpha": dict(public_name="alpha-server-name", version="9.9.1", end=4, throughput=11.0),
    "beta": dict(public_name="beta-server-name", version="9.9.2", end=8, throughput=22.0),
}


def _settings(tmp_path, side: str, **overrides) -> Settings:
    return Settings(data_dir=tmp_path / side, initial_peers=[f"/ip4/127.0.0.1/tcp/31337/p2p/{BOOT}"],
                    models=[{"dht_prefix": MODEL.dht_prefix, "num_blocks": MODEL.num_blocks}], **overrides)


def _store(tmp_path, side: str, settings: Settings, at: float) -> Store:
    """One poll of PEER at ``at`` (and its reachability check), written as the poller writes it."""
    store = Store(f"sqlite:///{tmp_path / side}.db")
    store.migrate()
    announced = SIDES[side]
    store.record_reachability(ReachabilityBatch(taken_at=at - 5, duration=0.1, results=(
        ReachabilityResult(PEER, "server", True, rtt=0.004),)))
    row = ServerRow(PEER, MODEL.dht_prefix, 0, announced["end"], ONLINE, throughput=announced["throughput"],
                    inference_rps=30.0, version=announced["version"], public_name=announced["public_name"])
    snapshot = Snapshot(taken_at=at, duration=1.0, models=(MODEL,), servers=(row,))
    store.record_poll(snapshot, Poller(settings, store, dht=None).assess(snapshot, store.latest_reachability()))
    with store.engine.begin() as conn:  # a diagnosis is stamped when written: both "written" at ``at``
        conn.execute(AssessmentRow.__table__.update().values(at=at))
    return store


@pytest.fixture
def two_apps(tmp_path):
    """{side: (app, store)}: two apps in this process, each over its own store, alike in change marks."""
    at = time.time() - 30
    apps, stores = {}, []
    for side in SIDES:
        settings = _settings(tmp_path, side, reachability_rate_limit="3 per minute")
        store = _store(tmp_path, side, settings, at)
        stores.append(store)
        message = f"{side} says no"
        apps[side] = (create_app(settings, store, reachability_check=lambda peer_id, message=message:
                                 ReachabilityResult(peer_id, "server", False, error=message)), store)
    yield apps
    for store in stores:
        store.close()


def _mine_not_theirs(body: str, side: str, what: str) -> None:
    other = next(s for s in SIDES if s != side)
    assert SIDES[side][what] in body, f"{side}'s answer lacks its own {what}"
    assert SIDES[other][what] not in body, f"{side}'s app served {other}'s {what}"


def test_the_premise_two_fresh_stores_have_the_same_change_marks(two_apps):
    (_, alpha), (_, beta) = two_apps["alpha"], two_apps["beta"]
    assert alpha.change_marks() == beta.change_marks()


def test_two_apps_over_two_stores_never_serve_each_others_pages_or_state(two_apps):
    clients = {side: app.test_client() for side, (app, _) in two_apps.items()}
    # twice each, in both orders: the second round is answered from what each app kept
    for side in ("alpha", "beta", "beta", "alpha"):
        client = clients[side]
        page = client.get(f"/peers/{PEER}").get_data(as_text=True)
        _mine_not_theirs(page, side, "public_name")
        live = client.get(f"/peers/{PEER}", headers={"HX-Request": "true", "HX-Target": "peer-live"})
        _mine_not_theirs(live.get_data(as_text=True), side, "version")
        report = client.get(f"/api/v1/peers/{PEER}/report").get_json()
        assert f"blocks 0:{SIDES[side]['end']} " in str(report["checks"]), report
        history = client.get(f"/api/v1/peers/{PEER}/history").get_json()
        assert [o["throughput"] for o in history["observations"]] == [SIDES[side]["throughput"]]
        state = client.get("/api/v1/state").get_json()
        assert [r["span"]["server_info"]["public_name"] for r in state["model_reports"][0]["server_rows"]] == \
            [SIDES[side]["public_name"]]
        _mine_not_theirs(client.get("/metrics").get_data(as_text=True), side, "version")
        overview = client.get("/", headers={"HX-Request": "true", "HX-Target": "overview-live"})
        assert overview.status_code == 200


def test_live_checks_and_their_budgets_are_each_apps_own(two_apps):
    clients = {side: app.test_client() for side, (app, _) in two_apps.items()}
    for side in ("alpha", "beta"):  # each app dials through its own check, and keeps its own answer
        for _ in range(2):
            answer = clients[side].get(f"/api/v1/is_reachable/{PEER}").get_json()
            assert answer["success"] is False and answer["message"] == f"{side} says no"
    # alpha spends the last of its 3 checks a minute; beta's budget is untouched by alpha's
    assert clients["alpha"].get(f"/api/v1/is_reachable/{PEER}").status_code == 200
    assert clients["alpha"].get(f"/api/v1/is_reachable/{PEER}").status_code == 429
    assert clients["beta"].get(f"/api/v1/is_reachable/{PEER}").status_code == 200


# what a module of monitor/web may build when it is imported: definitions and constants, nothing
# that fills up or locks while the app serves (that belongs in the app's WebCache)
IMPORT_TIME_CALLS = {"Blueprint", "logging.getLogger", "TypeVar", "Path", "re.compile", "assets_dir",
                     "'; '.join", "make_app", "_Kind"}  # (_Kind: mutes.py's frozen descriptions of its two kinds)


def test_no_module_of_the_web_keeps_state_of_its_own():
    import ast
    from pathlib import Path

    web = Path(__file__).resolve().parent.parent / "monitor" / "web"
    found = []
    for path in sorted(web.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and ast.unparse(value.func) not in IMPORT_TIME_CALLS:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:80]}")
            if isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (value.keys if isinstance(value, ast.Dict)
                                                                          else value.elts):
                found.append(f"{path.name}:{node.lineno} an empty container {ast.unparse(node)[:80]}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{path.name}:{node.lineno} global {', '.join(node.names)}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    name = ast.unparse(decorator.func if isinstance(decorator, ast.Call) else decorator)
                    if name.rpartition(".")[2] in ("cache", "lru_cache", "cached_property"):
                        found.append(f"{path.name}:{node.lineno} @{name} on {node.name}")
    assert not found, "module-level state in monitor/web (keep it in the app's WebCache):\n" + "\n".join(found)
