"""Every `(engine: key=value ...)` hint in a doctor finding names a real config setting, so
a user can paste it into `trainspeed train CONFIG key=value`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import trainspeed.doctor.checks as checks
from trainspeed.config import TrainConfig

HINT = re.compile(r"engine: ([^)]*)\)")
KEY = re.compile(r"(?<![\w.])([a-z_]+(?:\.[a-z_]+)?)=")


def _hint_keys() -> list[tuple[str, str]]:
    found = []
    for path in sorted(Path(checks.__file__).parent.glob("*.py")):
        text = path.read_text()
        for hint in HINT.findall(text.replace('"\n', "").replace("\n", " ")):
            found += [(path.name, key) for key in KEY.findall(hint)]
    return found


def _exists(key: str) -> bool:
    obj: object = TrainConfig
    for part in key.split("."):
        fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
        if part not in fields:
            return False
        obj = fields[part].default_factory() if fields[part].default_factory is not dataclasses.MISSING \
            else fields[part].default
    return True


def test_every_engine_hint_names_a_config_setting():
    keys = _hint_keys()
    assert len(keys) >= 15  # the scan found the hints (not vacuous)
    bad = [f"{file}: {key}" for file, key in keys if not _exists(key)]
    assert not bad, f"unknown config keys in doctor hints: {bad}"


def test_the_scan_catches_a_wrong_key():
    assert _exists("logging.every") and _exists("activation_checkpointing")
    assert not _exists("logging.every_steps") and not _exists("optim.fused")
