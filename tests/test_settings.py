"""Settings: readable by every layer without petals, renamed settings still load."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from monitor.settings import PUBLIC_INITIAL_PEERS, Settings, SettingsError, load_settings


def test_public_means_petals_own_bootstrap_peers():
    from monitor import compat  # noqa: F401  (petals imports on hivemind 1.1.12 through it)
    from petals.constants import PUBLIC_INITIAL_PEERS as petals_peers

    assert Settings(initial_peers=["public"]).resolved_initial_peers == list(petals_peers) == list(PUBLIC_INITIAL_PEERS)


def test_resolving_public_peers_imports_neither_petals_nor_torch():
    code = ("import sys; from monitor.settings import Settings; "
            "assert Settings(initial_peers=['public']).resolved_initial_peers; "
            "print(sorted(m for m in ('petals', 'torch', 'hivemind') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_old_names_of_the_reachability_settings_still_load_with_a_warning(caplog, tmp_path):
    config = tmp_path / "monitor.toml"
    config.write_text("probe_period = 7\nprobe_timeout = 2.5\n")
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        settings = load_settings(config, environ={"SWARM_MONITOR_PROBE_CONCURRENCY": "3"})
    assert (settings.reachability_period, settings.reachability_timeout, settings.reachability_concurrency) == (7, 2.5, 3)
    assert "'probe_period' is now called 'reachability_period'" in caplog.text


def test_an_invalid_setting_names_itself():
    with pytest.raises(SettingsError, match="reachability_timeout"):
        load_settings(environ={"SWARM_MONITOR_REACHABILITY_TIMEOUT": "-1"})
