"""Helpers for the patches tests: a tiny user script written into tmp_path and run in-process
with runpy, as `trainspeed run --with` does, under `install_settings`."""

from __future__ import annotations

import runpy
import textwrap
from pathlib import Path
from typing import Any, Callable

import pytest

from trainspeed.patches import install_settings
from trainspeed.patches.targets import Targets


class Script:
    def __init__(self, path: Path) -> None:
        self.path = path

    def line(self, marker: str) -> int:
        """1-based line of the first line containing `marker` (a `# MARK` comment)."""
        for number, text in enumerate(self.path.read_text().splitlines(), start=1):
            if marker in text:
                return number
        raise AssertionError(f"{marker} not in {self.path}")

    def site(self, marker: str) -> tuple[str, int]:
        return str(self.path), self.line(marker)

    def run(self, settings: dict[str, Any] | None = None, targets: Targets | None = None,
            **env: Any) -> tuple[dict[str, Any], list[str]]:
        """Run the script under the settings; return its globals and the patch notes."""
        applied = install_settings(settings or {}, targets, say=lambda text: None)
        try:
            result = runpy.run_path(str(self.path), init_globals=env, run_name="__main__")
        finally:
            applied.uninstall()
        return result, applied.notes


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str], Script]:
    def write(source: str, name: str = "train.py") -> Script:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return Script(path)

    return write
