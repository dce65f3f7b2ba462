"""Build a model directory once, atomically: concurrent builders and crashes never leave a
half-written checkpoint where a server or a client would load it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def build_once(target: Path, build: Callable[[Path], str]) -> Path:
    """Return ``target``, building it first with ``build(scratch_dir)`` unless it is READY.

    ``build`` fills a scratch directory next to the target and returns a note for the READY
    marker; it raises to refuse the result (nothing is cached then)."""
    target = Path(target)
    if (target / "READY").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        note = build(scratch)
        (scratch / "READY").write_text(f"ok\n{note}\n")
        os.chmod(scratch, 0o755)  # mkdtemp makes it private; servers may run as other users
        try:
            os.rename(scratch, target)
        except OSError:  # another process finished first
            if not (target / "READY").exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
