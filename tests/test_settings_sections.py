"""Settings in sections: the TOML file's [poller], [web], [chat] ... (the object stays flat), the old
flat form still read with one warning, one duration syntax for every time setting, lists in the
environment comma-separated, `chat_slots` (once `max_chat_sessions`), the demo's overrides printed,
and README's configuration reference generated from the settings (so that it cannot drift).

Pure: no swarm, no database, no petals."""

from __future__ import annotations

import logging

import pytest

from monitor.alert_settings import AlertSettings
from monitor.durations import DAY, parse_duration, unit_of
from monitor.demo_settings import DEMO_SETTINGS, demo_overrides, describe_overrides
from monitor.settings import SECTIONS, Settings, SettingsError, fields_in, load_settings, section_of
from monitor.settings_doc import BEGIN, END, README, block, render, with_reference

NO_ENV: dict[str, str] = {}


def load(tmp_path, text: str, environ=NO_ENV) -> Settings:
    config = tmp_path / "monitor.toml"
    config.write_text(text)
    return load_settings(config, environ=environ)


# -- sections ---------------------------------------------------------------------------------------

def test_every_setting_is_in_exactly_one_known_section_and_described():
    for name, field in Settings.model_fields.items():
        assert field.json_schema_extra["section"] in SECTIONS, name
        assert field.description, f"{name} has no description"
    assert sorted(n for s in SECTIONS for n in fields_in(s)) == sorted(Settings.model_fields)
    assert all(fields_in(section) for section in SECTIONS)


def test_settings_are_read_from_their_sections_into_a_flat_object(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        settings = load(tmp_path, """
[swarm]
initial_peers = ["public"]
discover_models = false
[poller]
scrape_period = 30
[web]
port = 5001
[chat]
chat_slots = 8
pinned_peers = ["peer-a"]
[store]
raw_retention_days = 3
[probes]
speed_probe_max_share = 0.1
[security]
proxy_hops = 1
[[models]]
dht_prefix = "my-model-hf"
num_blocks = 80
[alerts]
check_period = "1m"
""")
    assert (settings.initial_peers, settings.discover_models, settings.scrape_period, settings.port) == \
        (["public"], False, 30, 5001)
    assert (settings.chat_slots, settings.pinned_peers, settings.raw_retention_days) == (8, ["peer-a"], 3)
    assert (settings.speed_probe_max_share, settings.proxy_hops) == (0.1, 1)
    assert settings.models[0].dht_prefix == "my-model-hf" and settings.alerts.check_period == 60
    assert caplog.text == ""  # the new form warns of nothing


def test_a_setting_in_another_section_or_unknown_in_one_is_an_error_naming_it(tmp_path):
    with pytest.raises(SettingsError, match=r"'scrape_period' belongs in \[poller\], not \[web\]"):
        load(tmp_path, "[web]\nscrape_period = 30\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'scrape_perod' in \[poller\]"):
        load(tmp_path, "[poller]\nscrape_perod = 30\n")
    with pytest.raises(SettingsError, match="given twice"):
        load(tmp_path, "scrape_period = 30\n[poller]\nscrape_period = 20\n")


def test_the_old_flat_form_is_still_read_with_one_warning_naming_the_keys_and_their_sections(tmp_path, caplog):
    text = ('initial_peers = ["public"]\nscrape_period = 30\nport = 5001\nmax_chat_sessions = 2\n'
            '[[models]]\ndht_prefix = "m"\n[alerts]\nenabled = false\n')
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        settings = load(tmp_path, text)
    assert (settings.initial_peers, settings.scrape_period, settings.port, settings.chat_slots) == (["public"], 30, 5001, 2)
    assert settings.models[0].dht_prefix == "m" and settings.alerts.enabled is False
    flat = [r.getMessage() for r in caplog.records if "top level" in r.getMessage()]
    assert len(flat) == 1, caplog.text
    for moved in ("initial_peers -> [swarm]", "scrape_period -> [poller]", "port -> [web]",
                  "max_chat_sessions -> [chat] chat_slots"):
        assert moved in flat[0]
    assert "models" not in flat[0] and "alerts" not in flat[0]  # [[models]] and [alerts] are their own sections


def test_an_unknown_top_level_key_still_fails_naming_it(tmp_path):
    with pytest.raises(SettingsError, match="scrape_perod"):
        load(tmp_path, "scrape_perod = 30\n")


# -- durations --------------------------------------------------------------------------------------

def test_the_time_settings_are_those_named_like_one():
    timed = {name for name in Settings.model_fields if unit_of(name)}
    assert {"scrape_period", "reachability_timeout", "leader_lease_seconds", "refresh_seconds", "ws_idle_timeout",
            "ws_max_lifetime", "chat_queue_timeout", "raw_retention_days", "chat_conversation_retention_days",
            "compute_check_period", "generation_check_period"} <= timed
    assert not timed & {"speed_probe_max_share", "min_tokens_per_s", "chat_rate_limit", "max_slots_share"}


@pytest.mark.parametrize("given, seconds", [(90, 90), ("90", 90), ("90s", 90), ("1.5m", 90), ("2h", 7200),
                                            ("1d", DAY), ("500ms", 0.5), (" 5 m ", 300)])
def test_every_time_setting_takes_every_duration_syntax(tmp_path, given, seconds):
    assert Settings(scrape_period=given).scrape_period == seconds
    assert load_settings(environ={"SWARM_MONITOR_WS_MAX_LIFETIME": str(given)}).ws_max_lifetime == seconds
    assert AlertSettings(check_period=given).check_period == seconds


@pytest.mark.parametrize("given, days", [(2, 2), ("2", 2), ("36h", 1.5), ("30d", 30), ("720m", 0.5)])
def test_day_settings_read_plain_numbers_as_days(tmp_path, given, days):
    assert Settings(raw_retention_days=given).raw_retention_days == days
    assert AlertSettings(history_days=given).history_days == days
    value = f'"{given}"' if isinstance(given, str) else given
    assert load(tmp_path, f"[store]\nrollup_retention_days = {value}\n").rollup_retention_days == days


def test_durations_in_the_file_and_integer_time_settings(tmp_path):
    settings = load(tmp_path, '[web]\nrefresh_seconds = "1m"\nws_max_lifetime = "2h"\n[poller]\nleader_lease_seconds = "30s"\n')
    assert (settings.refresh_seconds, settings.ws_max_lifetime, settings.resolved_leader_lease_seconds) == (60, 7200, 30)


@pytest.mark.parametrize("env, name", [({"SWARM_MONITOR_SCRAPE_PERIOD": "5 minutes"}, "scrape_period"),
                                       ({"SWARM_MONITOR_RAW_RETENTION_DAYS": "2w"}, "raw_retention_days"),
                                       ({"SWARM_MONITOR_WS_IDLE_TIMEOUT": "-5s"}, "ws_idle_timeout")])
def test_a_bad_duration_is_an_error_naming_the_setting(env, name):
    with pytest.raises(SettingsError, match=f"invalid setting '{name}': .*is not a duration.*\"5m\""):
        load_settings(environ=env)


def test_one_duration_parser():
    import monitor.alert_settings as alert_settings

    assert alert_settings.parse_duration is parse_duration
    assert parse_duration("2h", DAY) == pytest.approx(1 / 12) and parse_duration(3, DAY) == 3
    with pytest.raises(SettingsError, match=r"invalid setting 'alerts\.check_period'"):
        load_settings(environ={"SWARM_MONITOR_ALERTS": '{"check_period": "soon"}'})


# -- the environment --------------------------------------------------------------------------------

def test_lists_in_the_environment_are_comma_separated_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        settings = load_settings(environ={"SWARM_MONITOR_TRUSTED_HOSTS": "a.example, b.example",
                                          "SWARM_MONITOR_PINNED_PEERS": "peer-a"})
    assert settings.trusted_hosts == ["a.example", "b.example"] and settings.pinned_peers == ["peer-a"]
    assert caplog.text == ""


@pytest.mark.parametrize("raw", ['["a.example", "b.example"]', "a.example  b.example"])
def test_lists_as_json_or_whitespace_separated_still_read_with_a_warning(caplog, raw):
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        settings = load_settings(environ={"SWARM_MONITOR_TRUSTED_HOSTS": raw})
    assert settings.trusted_hosts == ["a.example", "b.example"]
    assert "SWARM_MONITOR_TRUSTED_HOSTS" in caplog.text and "comma-separated: a.example,b.example" in caplog.text


def test_every_setting_has_its_variable_whatever_its_section():
    settings = load_settings(environ={"SWARM_MONITOR_PORT": "5002", "SWARM_MONITOR_CHAT_SLOTS": "3",
                                      "SWARM_MONITOR_SPEED_PROBE_PERIOD": "2m", "SWARM_MONITOR_DISCOVER_MODELS": "false"})
    assert (settings.port, settings.chat_slots, settings.speed_probe_period, settings.discover_models) == (5002, 3, 120, False)


# -- chat_slots, once max_chat_sessions --------------------------------------------------------------

def test_chat_slots_is_the_setting_and_max_chat_sessions_still_loads_with_a_warning(tmp_path, caplog):
    assert Settings().chat_slots == 4 and "max_chat_sessions" not in Settings.model_fields
    assert section_of("chat_slots") == section_of("max_chat_sessions") == "chat"
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        from_env = load_settings(environ={"SWARM_MONITOR_MAX_CHAT_SESSIONS": "6"})
        in_section = load(tmp_path, "[chat]\nmax_chat_sessions = 7\n")
    assert (from_env.chat_slots, in_section.chat_slots) == (6, 7)
    assert caplog.text.count("'max_chat_sessions' is now called 'chat_slots'") == 2
    assert not hasattr(from_env, "max_chat_sessions")  # one name in the code


# -- the demo's overrides ---------------------------------------------------------------------------

def test_the_demo_lists_each_setting_it_overrides_with_yours_and_its_own():
    rows = demo_overrides(Settings())
    assert {row.name for row in rows} == {name for name, _, _ in DEMO_SETTINGS}
    scrape = next(row for row in rows if row.name == "scrape_period")
    assert (scrape.yours, scrape.demos) == (60, 10)
    share = next(row for row in rows if row.name == "speed_probe_max_share")
    assert (share.yours, share.demos) == (0.02, 0.4)
    lines = describe_overrides(rows)
    assert lines[0].startswith("The demo overrides these settings")
    assert any("scrape_period" in line and "60 s -> 10 s" in line for line in lines)
    assert any("speed_probe_max_share" in line and "0.02 -> 0.4" in line for line in lines)


def test_the_demo_keeps_settings_already_past_its_own_and_says_nothing_of_them():
    settings = Settings(scrape_period=5, reachability_period=5, score_period=5, speed_probe_period=10,
                        speed_probe_max_share=0.5, generation_check_period=10, compute_check_period=2)
    assert demo_overrides(settings) == [] and describe_overrides([]) == []
    rows = demo_overrides(Settings(scrape_period=5))
    assert "scrape_period" not in {row.name for row in rows}


def test_swarm_monitor_demo_prints_the_overrides_before_it_starts_anything(tmp_path, monkeypatch):
    """Through the CLI, with the model's preparation faked and stopped where the swarm would start."""
    import click
    from click.testing import CliRunner

    from monitor.app import cli
    from monitor.harness import demo_swarm

    def stop():
        raise click.ClickException("stopped before the swarm")

    monkeypatch.setattr(demo_swarm, "prepare_model", lambda *args, **kwargs: (tmp_path, "demo-hf", 4, "Demo"))
    monkeypatch.setattr(cli, "_sigterm_as_interrupt", stop)
    config = tmp_path / "monitor.toml"
    config.write_text('[poller]\nscrape_period = "5s"\nscore_period = "2m"\n')
    env = {"SWARM_MONITOR_DATA_DIR": str(tmp_path), "SWARM_MONITOR_CONFIG": None, "SWARM_MONITOR_INITIAL_PEERS": None}
    done = CliRunner().invoke(cli.main, ["--config", str(config), "demo", "--tiny"], env=env)
    assert "stopped before the swarm" in done.output, done.output
    printed = done.output[:done.output.index("stopped before the swarm")]
    assert "The demo overrides these settings" in printed
    assert "score_period" in printed and "120 s -> 10 s" in printed
    assert "scrape_period" not in printed  # yours (5 s) is already more frequent: kept, not mentioned


# -- the README's reference -------------------------------------------------------------------------

def test_the_readme_configuration_reference_is_the_generated_one():
    text = README.read_text()
    assert text.count(BEGIN) == text.count(END) == 1
    configuration = text[text.index("## Configuration"):]
    configuration = configuration[:configuration.index("\n## ", 1)]
    assert BEGIN in configuration and END in configuration  # in the Configuration section
    assert block(text) == render(), "README.md's settings reference is stale: run scripts/settings_reference.py"
    assert with_reference(text) == text


def test_the_reference_names_every_setting_its_variable_and_section():
    reference = render()
    for section in SECTIONS:
        assert f"[{section}]" in reference
    for name in Settings.model_fields:
        if section_of(name) not in ("models", "alerts"):
            assert f"| `{name}` |" in reference and f"`SWARM_MONITOR_{name.upper()}`" in reference
    assert "~/.cache/petals-swarm-monitor" in reference  # not this machine's home
    assert "| `scrape_period` | 60 s (demo: 10 s) |" in reference


def test_the_readme_example_file_loads_as_it_says_without_a_warning(tmp_path, caplog):
    text = README.read_text()
    configuration = text[text.index("## Configuration"):text.index(BEGIN)]
    example = configuration[configuration.index("```toml\n") + 8:]
    example = example[:example.index("```")]
    with caplog.at_level(logging.WARNING, logger="monitor.settings"):
        settings = load(tmp_path, example)
    assert caplog.text == ""
    assert (settings.scrape_period, settings.raw_retention_days, settings.chat_slots) == (30, 1.5, 8)
    assert settings.models[0].num_blocks == 80
