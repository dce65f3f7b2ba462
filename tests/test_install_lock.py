"""Installs that repeat: ``requirements/lock.txt`` (scripts/lock, pip-tools) pins every package the
product and its specs install, scripts/setup installs under it, and it stays true to pyproject.toml.
Whether the lock resolves on a fresh machine is what CI's own `make setup` shows on every run."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OURS = {"petals-swarm-monitor", "swarm-monitor-client"}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            name, _, version = text.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_lock_pins_every_package_the_project_needs_and_the_venv_is_installed_from_it():
    lock = _pins(ROOT / "requirements" / "lock.txt")
    # every requirement of the project and its test extra, and theirs, all the way down
    seen, todo = set(), [Requirement(r) for r in _project()["dependencies"] + _project()["optional-dependencies"]["test"]]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        if name in OURS:
            continue
        assert name in lock, f"{name} is installed by the project but not in requirements/lock.txt"
        installed = metadata.version(name)
        assert Version(installed) == Version(lock[name]), f"{name}: {installed} installed, {lock[name]} locked"
        assert req.specifier.contains(lock[name], prereleases=True), f"{name}: the lock's {lock[name]} is not {req}"
        for extra in req.extras or {""}:
            for dep in metadata.requires(name) or []:
                dep = Requirement(dep)
                if not dep.marker or dep.marker.evaluate({"extra": extra}):
                    todo.append(Requirement(str(dep).split(";")[0]))
    assert len(seen) > 100


def test_no_pin_names_a_machine_and_every_exact_pin_says_why():
    for path in (ROOT / "requirements").glob("*.txt"):
        text = path.read_text()
        assert not re.search(r"(^|\s)(-e|--find-links|--index-url|--extra-index-url|-f)\b|file://|/opt/|/tmp/|/home/|/work/",
                             text, re.M), f"{path.name} names a path of this machine"
    exact = [line for line in (ROOT / "pyproject.toml").read_text().splitlines() if re.match(r'\s*"[^"]+==', line)]
    assert len(exact) >= 8
    for line in exact:
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, f"an exact pin without its reason: {line.strip()}"
    for name in ("no-deps.txt", "reference.txt"):
        for line in (ROOT / "requirements" / name).read_text().splitlines():
            if line and not line.startswith("#"):
                assert "==" in line and "  # " in line, f"{name}: {line}"
    # every dependency can move only within its major version (or a narrower, stated range)
    for req in map(Requirement, _project()["dependencies"]):
        assert any(s.operator in ("==", "<", "<=") for s in req.specifier) or canonicalize_name(req.name) in OURS \
            or req.name == "packaging", f"{req} has no upper bound"


def test_setup_installs_under_the_lock_and_the_installed_petals_and_reference_are_the_pinned_ones():
    setup = (ROOT / "scripts" / "setup").read_text()
    assert '--constraint "$LOCK"' in setup and "LOCK=requirements/lock.txt" in setup
    for name, version in _pins(ROOT / "requirements" / "no-deps.txt").items():
        assert metadata.version(name) == version
    reference = ROOT / ".reference"
    for name, version in _pins(ROOT / "requirements" / "reference.txt").items():
        found = [d for d in metadata.distributions(path=[str(reference)]) if canonicalize_name(d.metadata["Name"]) == name]
        assert [d.version for d in found] == [version], name
    assert metadata.version("pip") == _pins(ROOT / "requirements" / "pip.txt")["pip"]
