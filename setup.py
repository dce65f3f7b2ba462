"""Ships the repository's top-level ``templates/`` and ``static/`` inside the wheel.

They stay top-level in the repository (designers and the chat find them there), but a wheel must
carry them: the build copies them into ``monitor/web/`` of the built package, where
``monitor.web.assets_dir`` looks first. Everything else is declared in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED_DIRS = ("templates", "static")


class BuildWithWebAssets(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout
            return
        root = Path(__file__).resolve().parent
        for name in SHIPPED_DIRS:
            target = Path(self.build_lib) / "monitor" / "web" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(root / name, target)


setup(cmdclass={"build_py": BuildWithWebAssets})
