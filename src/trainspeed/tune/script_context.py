"""What a script knob looks at: the facts the doctor recorded of the unchanged script, the
device, and the settings already applied (a greedy winner). Its own module: the knob families
(script_knobs.py, script_zero_knobs.py) share it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainspeed.tune.knobs import DeviceInfo
from trainspeed.tune.script_facts import ScriptFacts


@dataclass(kw_only=True)
class ScriptContext:
    facts: ScriptFacts
    device: DeviceInfo
    settings: dict[str, Any] = field(default_factory=dict)
    """Settings already applied (a greedy winner): deferred knobs look at them."""
    baseline_memory: float | None = None
    """Peak memory of the baseline trial (bytes): whether ZeRO-3 is worth a trial."""

    def loader_value(self, key: str, default: Any = None) -> Any:
        """Effective DataLoader setting: a tried setting (patch or flag) over the script's own."""
        if f"loader.{key}" in self.settings:
            return self.settings[f"loader.{key}"]
        if key == "num_workers":
            flag = self.facts.flag_for("num_workers")
            if flag and f"args.{flag['option']}" in self.settings:
                return self.settings[f"args.{flag['option']}"]
        return (self.facts.loader or {}).get(key, default)


__all__ = ["ScriptContext"]
