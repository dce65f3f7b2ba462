"""Spec: ``swarm-monitor-client`` is a package of its own — its own folder and pyproject, depending
on petals (unpinned) and on nothing of ours — that installs alone into a fresh environment beside
petals and imports there; the chat's routing policy is the one it carries.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "client"
OURS = ("monitor", "chat", "flask", "sqlalchemy", "sqlmodel", "alembic", "apscheduler", "gunicorn", "psycopg")
PETALS_SIDE = ("petals", "hivemind", "numpy", "torch")  # what petals brings; only routing.py may use it


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_client_depends_on_petals_alone_and_imports_nothing_of_ours():
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "swarm-monitor-client" and project["dependencies"] == ["petals"]
    modules = sorted((CLIENT / "swarm_monitor_client").glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "policy.py", "view.py", "routing.py"}
    stdlib = set(sys.stdlib_module_names) | {"__future__", "swarm_monitor_client"}
    for module in modules:
        found = imports(module)
        assert not found & set(OURS), (module.name, found & set(OURS))
        allowed = stdlib | (set(PETALS_SIDE) if module.name == "routing.py" else set()) | (
            {"hivemind", "cryptography"} if module.name == "prove.py" else set())  # (what petals brings)
        assert found <= allowed, (module.name, found - allowed)  # policy and view: the standard library only


def test_the_chat_routes_by_the_clients_policy():
    import chat.policy
    import chat.sequence
    import swarm_monitor_client.policy as shared
    from swarm_monitor_client.routing import MonitorRouting

    for name in ("penalty", "relative_penalties", "peers_to_leave_out", "Explorer", "PeerWeight", "RoutingSettings"):
        assert getattr(chat.policy, name) is getattr(shared, name), name
    assert issubclass(chat.sequence.HealthAwareSequenceManager, MonitorRouting)
    for name in ("_build_inference_graph", "_make_sequence_with_max_throughput", "_left_out", "peer_weights"):
        assert name not in vars(chat.sequence.HealthAwareSequenceManager), name  # written once, in the client
    from monitor.core.probes import PETALS_DEFAULT_SECONDS_PER_BLOCK
    assert shared.PETALS_DEFAULT_SECONDS_PER_BLOCK == PETALS_DEFAULT_SECONDS_PER_BLOCK  # petals' one constant


IMPORT_ALONE = textwrap.dedent("""
    import importlib.metadata, json, sys
    import swarm_monitor_client
    from swarm_monitor_client import route_with
    from swarm_monitor_client.view import MonitorView, parse_view
    import importlib.util
    petals = importlib.util.find_spec("petals")  # beside it (imported by route_with, when routing is asked for)
    print(json.dumps({"file": swarm_monitor_client.__file__, "requires": importlib.metadata.requires("swarm-monitor-client"),
                      "ours": sorted(m for m in sys.modules if m.split(".")[0] in ("monitor", "chat", "flask")),
                      "petals": petals.origin if petals else None}))
""")


def test_the_client_installs_alone_into_a_fresh_environment_beside_petals(tmp_path):
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(out), str(CLIENT)], check=True, cwd=tmp_path, timeout=300)
    [built] = out.glob("swarm_monitor_client-*.whl")
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    fresh_site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                    str(built)], check=True, timeout=300)
    # petals beside it: the test venv's packages on a path entry (its editable-install hooks, and so
    # our monitor, chat and this checkout's client, stay off)
    (fresh_site / "petals-beside.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([python, "-c", IMPORT_ALONE], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(fresh_site)), found  # the installed wheel, not this checkout
    assert found["requires"] == ["petals"] and found["ours"] == [], found
    assert found["petals"] and "site-packages" in found["petals"], found


def test_only_the_chat_imports_the_client_so_the_monitor_runs_without_it():
    """The dashboard, the poller and the store never need the client package (the built wheel's
    web serves without it: tests/test_wheel.py); only the chat routes by it."""
    wrong = [str(path.relative_to(ROOT)) for path in (ROOT / "monitor").rglob("*.py")
             if "swarm_monitor_client" in imports(path)]
    assert not wrong, wrong
    assert any("swarm_monitor_client" in imports(path) for path in (ROOT / "chat").rglob("*.py"))
