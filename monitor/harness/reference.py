"""The reference implementation of the model families: a current transformers (with its tokenizers),
installed by set-up into ``.reference/`` beside the project and never on the product's path.

Specs and the tiny checkpoints of the newer families (Llama 3.x, Mixtral) use it in a child
process of their own: it saves checkpoints as the published ones are saved today (pair-format
merges, ``rope_type: llama3``, ``model_type: mixtral``), and it computes the continuations and
tokenizations ours must equal. Our processes never import it: the product runs on petals 2.2's
transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DIR = Path(os.environ.get("SWARM_MONITOR_REFERENCE_DIR", ROOT / ".reference"))
SCRIPTS = Path(__file__).with_name("reference_scripts")
TIMEOUT = 600.0


class ReferenceUnavailable(RuntimeError):
    """The reference folder is missing (``make setup`` installs it)."""


def available() -> bool:
    return (REFERENCE_DIR / "transformers" / "__init__.py").is_file()


def version() -> str:
    for info in REFERENCE_DIR.glob("transformers-*.dist-info"):
        return info.name.split("-")[1].removesuffix(".dist-info")
    raise ReferenceUnavailable(f"no reference transformers in {REFERENCE_DIR}; run `make setup`")


def run(script: str, payload: dict, *, timeout: float = TIMEOUT) -> dict:
    """Run ``reference_scripts/<script>.py`` with the reference first on the path: it reads one
    JSON object on stdin and writes one on stdout. Errors carry the child's last lines."""
    if not available():
        raise ReferenceUnavailable(f"no reference transformers in {REFERENCE_DIR}; run `make setup`")
    env = {**os.environ, "PYTHONPATH": str(REFERENCE_DIR), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-u", str(SCRIPTS / f"{script}.py")],
                          input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=str(SCRIPTS))
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"reference script {script} failed ({done.returncode}):\n{tail}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else {}
