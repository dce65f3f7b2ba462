"""The house's layering, read from the source: who may import whom, and no import cycle.

Data flows one way (README: Development): ``core`` is pure; ``swarm`` (the DHT edge) and ``store``
(the SQL edge) build on it; ``app`` wires them; ``web`` only reads the store; ``chat`` sits beside
the web. Every ``import`` statement counts, also those inside functions (a lazy import is still a
dependency). ``settings``/``alert_settings``/``compat`` and the other modules at the top of the
package sit above the layers, readable by every one; the harness (swarms, workers, reference runs
for the demo, specs and benchmarks) never reaches into the app, the web or the store; the client
package people install (``client/swarm_monitor_client``) never imports the service. Every module
has a layer.

The source is parsed in a fresh interpreter of its own (``findings``, once per session): CPython
3.11 keeps the AST constructor's recursion depth in per-interpreter state, and a process that ran
a swarm's threads (hivemind, petals) could fail an ``ast.parse`` with "AST constructor recursion
depth mismatch" whatever the source; a child that runs nothing else cannot.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (where a package's source lies, the package): the service's, and the client package people
# install beside petals (``client/``)
PACKAGES = ((ROOT, "monitor"), (ROOT, "chat"), (ROOT / "client", "swarm_monitor_client"))
# modules at the top of ``monitor``: read by every layer, so they read none of the layers but the core
TOP_LEVEL = ("monitor.settings", "monitor.alert_settings", "monitor.demo_settings", "monitor.settings_doc",
             "monitor.durations", "monitor.http_errors", "monitor.api_doc", "monitor.prometheus", "monitor.logs",
             "monitor.compat")

# layer -> layers it must never import
FORBIDDEN = {
    "monitor.core": ("monitor.swarm", "monitor.store", "monitor.app", "monitor.web", "monitor.harness", "chat"),
    "monitor.swarm": ("monitor.store", "monitor.app", "monitor.web", "monitor.harness", "chat"),
    "monitor.store": ("monitor.swarm", "monitor.app", "monitor.web", "monitor.harness", "chat"),
    "monitor.web": ("monitor.app", "monitor.swarm", "monitor.harness", "chat", "monitor.compat"),
    "monitor.settings": ("monitor.app", "monitor.web", "monitor.store", "monitor.swarm", "chat"),
    "chat": ("monitor.app", "monitor.web", "monitor.harness"),
    # the model families: what reads a checkpoint, below everything that does
    "monitor.families": ("monitor.swarm", "monitor.store", "monitor.app", "monitor.web", "monitor.harness", "chat"),
    # what starts swarms, workers and reference runs for the demo, the specs and the benchmarks:
    # processes and checkpoints, never the service's wiring or its store
    "monitor.harness": ("monitor.app", "monitor.web", "monitor.store", "chat"),
    # the wiring: every layer's top (the demo's CLI starts the harness)
    "monitor.app": (),
    **{top: ("monitor.swarm", "monitor.store", "monitor.app", "monitor.web", "monitor.harness", "chat")
       for top in TOP_LEVEL if top != "monitor.settings"},
    # the package people install beside petals: it reads the monitor over HTTP, never its code
    "swarm_monitor_client": ("monitor", "chat"),
}
ROOT_PACKAGES = ("monitor",)  # a package's ``__init__`` above every layer (it imports nothing of ours)


def module_name(path: Path, base: Path = ROOT) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; ``from a import b`` counts as ``a.b`` when
    ``a.b`` is a module of ours, else as ``a``)."""
    me = module_name(path, next(base for base, package in PACKAGES if path.is_relative_to(base / package)))
    return parse_imports(path.read_text(), me, package=me if path.name == "__init__.py" else me.rpartition(".")[0])


def parse_imports(source: str, me: str, *, package: str) -> set[str]:
    tree = ast.parse(source, me)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def our_modules() -> dict[str, Path]:
    modules = {}
    for base, package in PACKAGES:
        for path in (base / package).rglob("*.py"):
            if "migrations" not in path.parts:
                modules[module_name(path, base)] = path
    return modules


def graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@functools.lru_cache(maxsize=None)
def findings() -> dict:
    """What the checks below read from the source, computed in a fresh interpreter (``_findings``):
    the import graph, the core's third-party imports, and the petals importers' order of imports."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_layers; "
            "print(json.dumps(test_layers._findings()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _findings() -> dict:
    """(in the child) every result that needs the source parsed, as JSON."""
    return {
        "graph": {name: sorted(deps) for name, deps in graph().items()},
        "core_third_party": core_third_party_imports(),
        "petals_importers": sorted(petals_importers()),
        "compat_not_first": compat_not_first(),
    }


def test_no_layer_imports_one_it_must_not():
    wrong = []
    for module, deps in findings()["graph"].items():
        for layer, banned in FORBIDDEN.items():
            if within(module, layer):
                wrong += [f"{module} imports {dep}" for dep in deps for b in banned if within(dep, b)]
    assert not wrong, "\n".join(sorted(wrong))


# the poll side's job modules (``monitor/app/job_table.py``): plain functions over the job context
JOB_MODULES = ("monitor.app.polling", "monitor.app.probing", "monitor.app.compute_checking",
               "monitor.app.generation_check", "monitor.app.alerter")


def test_no_job_module_imports_the_runner_the_table_or_another_job():
    """A job neither schedules nor calls another: its module imports neither the runner, the
    poller, the table nor another job's module (what it needs comes in its context)."""
    graph = findings()["graph"]
    banned = ("monitor.app.runner", "monitor.app.jobs", "monitor.app.job_table", *JOB_MODULES)
    wrong = [f"{module} imports {dep}" for module in JOB_MODULES for dep in graph[module]
             if dep in banned and dep != module]
    assert not wrong, "\n".join(sorted(wrong))


def test_every_module_has_a_layer_with_its_rule():
    """No module escapes the rules: each of ours (the client package's too) falls within a layer
    above, or is a root package's ``__init__`` that imports nothing of ours."""
    graph = findings()["graph"]
    assert any(within(m, "swarm_monitor_client") for m in graph), "the client package is not read"
    loose = [m for m in graph if not any(within(m, layer) for layer in FORBIDDEN)
             and not (m in ROOT_PACKAGES and not graph[m])]
    assert not loose, "modules with no layer: " + ", ".join(sorted(loose))


def test_the_import_graph_has_no_cycle():
    edges = {module: set(deps) for module, deps in findings()["graph"].items()}
    # a package's __init__ re-exporting its own modules is not a cycle of logic: drop edges from a
    # package to its own children
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in edges.items()}
    cycles, state, stack = [], {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_lazy_imports_inside_functions_count():
    """The rules above read imports made inside functions too (the ones that hid petals)."""
    source = "def f():\n    from monitor.app import cli\n    from . import store\n"
    assert parse_imports(source, "monitor.web.pages", package="monitor.web") >= {"monitor.app.cli", "monitor.web.store"}


# third-party packages the pure core must never import: petals' routing, block selection and wire
# protocol are used from the swarm edge (``monitor.swarm``) and ``chat/sequence.py`` only
CORE_FORBIDS = ("petals", "hivemind", "dijkstar", "torch", "transformers")
MAX_MODULE_LINES = 600


def core_third_party_imports() -> list[str]:
    return [f"{name} imports {dep}" for name, path in our_modules().items() if within(name, "monitor.core")
            for dep in sorted(imports_of(path)) for banned in CORE_FORBIDS if within(dep, banned)]


def test_the_core_imports_neither_petals_nor_hivemind():
    wrong = findings()["core_third_party"]
    assert not wrong, "\n".join(wrong)


def petals_importers() -> dict[str, Path]:
    """The service's modules that import petals (the client package is installed beside petals
    with petals' own hivemind, where ``monitor.compat`` has nothing to restore and does not exist)."""
    return {name: path for name, path in our_modules().items()
            if name != "monitor.compat" and not within(name, "swarm_monitor_client")
            and any(within(dep, "petals") for dep in imports_of(path))}


def test_every_module_that_imports_petals_imports_compat_first():
    """petals 2.2 imports names hivemind 1.1.12 no longer exports: ``monitor.compat`` restores them,
    so it is imported before petals — at module level, or (a process that must import petals late,
    as the harness's fork server does) first in the very function that imports petals."""
    assert findings()["petals_importers"], "no module imports petals: the rule reads nothing"
    wrong = findings()["compat_not_first"]
    assert not wrong, "import monitor.compat before petals: " + ", ".join(wrong)


def compat_not_first() -> list[str]:
    """The petals importers (module, or function) that import petals before ``monitor.compat``."""
    wrong = []
    for name, path in petals_importers().items():
        tree = ast.parse(path.read_text(), name)
        module_compat = _first(tree.body, "monitor.compat")
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            petals_at = _first(scope.body, "petals")
            if petals_at is None:
                continue
            local = _first(scope.body, "monitor.compat") if scope is not tree else None
            if not ((module_compat is not None and (scope is not tree or module_compat < petals_at))
                    or (local is not None and local < petals_at)):
                wrong.append(f"{name}:{getattr(scope, 'name', '<module>')}")
    return sorted(wrong)


def _first(body, package: str):
    """The line of the first import of ``package`` among the statements of ``body`` (nested ones too)."""
    lines = [node.lineno for statement in body for node in ast.walk(statement)
             if isinstance(node, (ast.Import, ast.ImportFrom)) and any(within(n, package) for n in _names(node))]
    return min(lines) if lines else None


def _names(node) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = node.module or ""
    return {base} | {f"{base}.{alias.name}" for alias in node.names}


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in our_modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, long
