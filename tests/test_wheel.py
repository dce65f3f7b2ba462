"""Spec: the built wheel runs anywhere — installed into a fresh environment and started from a
directory outside the checkout, it migrates its database and serves every page and asset.

The fresh environment has none of the checkout on its path: it sees the project only through the
installed wheel, and the project's dependencies through a path entry to the test venv's
site-packages (whose editable-install hook is not run, since .pth files there are not processed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
import time
import venv
from pathlib import Path

import pytest

from monitor.store import Store
from support import PEERS, TINY, populate, web_settings

ROOT = Path(__file__).resolve().parent.parent

MIGRATE = textwrap.dedent("""
    import sys
    from monitor.store import Store
    store = Store(sys.argv[1])
    store.migrate()
    print(store.current_revision())
""")

SERVE_EVERYTHING = textwrap.dedent("""
    import json, sys
    import monitor, chat
    from monitor.settings import Settings
    from monitor.store import Store
    from monitor.web import create_app

    store = Store(sys.argv[1])
    settings = Settings.model_validate_json(sys.argv[2])
    app = create_app(settings, store)
    client = app.test_client()
    statuses = {page: client.get(page).status_code for page in sys.argv[3:]}
    print(json.dumps({"monitor": monitor.__file__, "chat": chat.__file__, "statuses": statuses,
                      "templates": sorted(app.jinja_env.list_templates()),
                      "heavy": sorted({"petals", "torch", "hivemind"} & set(sys.modules))}))
""")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(out), str(ROOT)], check=True, cwd=out, timeout=300)
    [built] = out.glob("petals_swarm_monitor-*.whl")
    return built


def test_the_wheel_carries_templates_static_files_and_migrations(wheel):
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for shipped in ("templates", "static"):
        for path in (ROOT / shipped).rglob("*"):
            if path.is_file():
                assert f"monitor/web/{path.relative_to(ROOT).as_posix()}" in names, path
    assert "monitor/store/migrations/alembic.ini" in names and "monitor/store/migrations/script.py.mako" in names
    assert {f"monitor/store/migrations/versions/{p.name}" for p in (ROOT / "monitor/store/migrations/versions")
            .glob("0*.py")} <= names
    assert "chat/static/chat.js" in names
    assert not any(name.startswith(("tests/", "scripts/")) for name in names)


def test_the_installed_wheel_serves_every_page_and_asset_from_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "fresh"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    fresh_site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     check=True, capture_output=True, text=True).stdout.strip())
    # dependencies from the test venv (a path entry, so its editable-install hook stays off)
    (fresh_site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                    str(wheel)], check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def run(script, *args):
        done = subprocess.run([python, "-c", script, *map(str, args)], cwd=elsewhere, capture_output=True,
                              text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    url = f"sqlite:///{tmp_path / 'data' / 'monitor.db'}"
    assert run(MIGRATE, url) == sorted(p.name.split("_")[0] for p in
                                       (ROOT / "monitor/store/migrations/versions").glob("0*.py"))[-1]
    settings = web_settings(data_dir=tmp_path / "data")
    store = Store(url)
    populate(store, settings, time.time())  # three polls of a real-looking swarm, written by this process
    store.close()
    pages = ["/", f"/models/{TINY.dht_prefix}", f"/peers/{PEERS['full']}", "/login", "/healthz", "/metrics",
             "/api/v1/state", "/api/v1/models", f"/api/v1/peers/{PEERS['full']}/history", f"/api/v1/routing/{TINY.dht_prefix}",
             "/static/app.css", "/static/charts.js", "/static/vendor/htmx.org/htmx.min.js",
             "/static/vendor/plotly.js-cartesian-dist-min/plotly-cartesian.min.js",
             "/static/vendor/swagger-ui-dist/swagger-ui-bundle.js"]
    result = json.loads(run(SERVE_EVERYTHING, url, settings.model_dump_json(), *pages))
    assert result["monitor"].startswith(str(fresh_site)) and result["chat"].startswith(str(fresh_site))
    assert set(result["statuses"].values()) == {200}, result["statuses"]
    assert {"base.html", "overview.html", "model.html", "peer.html", "chat/page.html"} <= set(result["templates"])
    assert result["heavy"] == []  # a web process never imports petals, torch or hivemind

    cli = subprocess.run([env_dir / "bin" / "swarm-monitor", "--help"], cwd=elsewhere, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and "demo" in cli.stdout
