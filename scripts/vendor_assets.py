"""The browser's third-party files, vendored from their npm packages at chosen versions.

The dashboard needs htmx (every page), plotly.js (the charts: scatter, bar and heatmap traces, so
plotly's *cartesian* bundle, a third of the full one) and Swagger UI (the API page, /api/docs).
They are committed under ``static/vendor/<package>/`` with their licences, so a checkout and the
wheel serve them with no internet access and no Python package that merely repackages them.

``static/vendor/vendor.json`` is the lock: each package's version, the registry's integrity hash of
its tarball, and the files taken from it. This script fetches each tarball with ``npm pack``,
checks it against that hash, and rewrites the files:

    .venv/bin/python scripts/vendor_assets.py                        # re-vendor exactly the lock
    .venv/bin/python scripts/vendor_assets.py --check                # only check the committed files
    .venv/bin/python scripts/vendor_assets.py --upgrade htmx.org@2.0.12   # move one package

An upgrade records the new version's integrity as the registry states it; review the diff (and run
the browser specs: tests/test_browser_assets.py) before committing.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "static" / "vendor"
LOCK = VENDOR / "vendor.json"


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def fetch(spec: str, workdir: Path) -> tuple[bytes, str]:
    """The package's tarball as the registry serves it, and the integrity the registry states."""
    out = subprocess.run(["npm", "pack", "--json", spec], cwd=workdir, check=True, capture_output=True, text=True)
    (packed,) = json.loads(out.stdout)
    return (workdir / packed["filename"]).read_bytes(), packed["integrity"]


def unpack(name: str, entry: dict, data: bytes) -> None:
    target = VENDOR / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "package.tgz"
        path.write_bytes(data)
        with tarfile.open(path) as tar:
            for source, dest in entry["files"].items():
                member = tar.extractfile("package/" + source)
                if member is None:
                    raise SystemExit(f"{name}: {source} is not in the package")
                (target / dest).write_bytes(member.read())


def check(lock: dict) -> list[str]:
    """What differs between the committed files and the lock's list of them."""
    problems = []
    for name, entry in lock.items():
        for dest in entry["files"].values():
            if not (VENDOR / name / dest).is_file():
                problems.append(f"{name}: {dest} is missing")
        for path in (VENDOR / name).glob("*"):
            if path.name not in entry["files"].values():
                problems.append(f"{name}: {path.name} is not in the lock")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the committed files against the lock")
    parser.add_argument("--upgrade", metavar="PACKAGE@VERSION", action="append", default=[],
                        help="move a locked package to another version")
    args = parser.parse_args()
    lock = json.loads(LOCK.read_text())
    if args.check:
        problems = check(lock)
        print("\n".join(problems) or "vendored files match static/vendor/vendor.json")
        return 1 if problems else 0
    upgrades = {}
    for spec in args.upgrade:
        name, _, version = spec.rpartition("@")
        if name not in lock or not version:
            raise SystemExit(f"--upgrade wants PACKAGE@VERSION of a locked package ({', '.join(lock)})")
        upgrades[name] = version
    with tempfile.TemporaryDirectory() as tmp:
        for name, entry in lock.items():
            version = upgrades.get(name, entry["version"])
            data, stated = fetch(f"{name}@{version}", Path(tmp))
            if name in upgrades:
                entry["version"], entry["integrity"] = version, stated
            if integrity(data) != entry["integrity"]:
                raise SystemExit(f"{name}@{version}: the tarball's hash is not the locked one; nothing written")
            unpack(name, entry, data)
            print(f"{name}@{version}: {len(entry['files'])} files")
    LOCK.write_text(json.dumps(lock, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
