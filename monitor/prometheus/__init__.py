"""Prometheus alerting rules for the metrics /metrics exposes (README: Metrics, Alerts).

``rules.yml`` is for operators who run Prometheus and Alertmanager already: load it with
``rule_files`` next to a scrape job on the monitor's /metrics. It covers what the built-in alerts
cover (models broken or degraded, servers failing confirmed checks, bootstrap peers down, a stale
or failing poller, alerts stalled or undelivered) plus what only an outside watcher can see: the
monitor itself gone (``PetalsMonitorDown``: no metrics at all), no poller leading or polling
(``PetalsMonitorNoLeader``, ``PetalsMonitorLeaderNotPolling``), and ``Watchdog``, always firing, for
an Alertmanager route to a dead man's switch. There are no recording rules. ``rules_test.yml`` is its
``promtool test rules`` spec (run by tests/test_alerts.py). Both ship inside the package:
``rules_path()`` finds them in an installed copy.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def rules_path() -> Path:
    return HERE / "rules.yml"


def rules_test_path() -> Path:
    return HERE / "rules_test.yml"
