#!/usr/bin/env python
"""Write README.md's configuration reference (between <!-- settings:begin --> and <!-- settings:end -->)
from the settings object (monitor/settings_doc.py). --check: exit 1 if it is out of date instead.

    .venv/bin/python scripts/settings_reference.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from monitor.settings_doc import README, with_reference  # noqa: E402


def main(argv: list[str]) -> int:
    text = README.read_text()
    updated = with_reference(text)
    if "--check" in argv:
        if updated != text:
            print(f"{README} is out of date: run scripts/settings_reference.py", file=sys.stderr)
            return 1
        return 0
    if updated != text:
        README.write_text(updated)
        print(f"updated {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
