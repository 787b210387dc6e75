"""The flags of a Hydra app: every key of its composed config, as the override `data.num_workers=2`.

A script under `@hydra.main` takes its settings as `key=value` overrides (no dashes) of the
config Hydra composed; the DataLoader reads `cfg.data.num_workers`. The composed config is the
task function's argument: read from the frames of the traceback that stopped the script (the
doctor's --steps, a signal, a crash), so advice and the tune's knobs set `data.num_workers=2`
and `trainer.log_every=50` as the user would type them.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from trainspeed.doctor.instrument.setting_rows import flatten_settings, setting_rows
from trainspeed.patches.installed import is_installed


def hydra_task_config(tb: TracebackType | None) -> Any | None:
    """The DictConfig passed to the outermost function on the traceback that takes one (Hydra's
    task function), when Hydra runs the script; else None."""
    omegaconf, hydra = sys.modules.get("omegaconf"), sys.modules.get("hydra")
    if omegaconf is None or hydra is None:
        return None
    dict_config = getattr(omegaconf, "DictConfig", None)
    while tb is not None and dict_config is not None:
        frame = tb.tb_frame
        code = frame.f_code
        for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
            value = frame.f_locals.get(name)
            if isinstance(value, dict_config) and not is_installed(code.co_filename):
                return value
        tb = tb.tb_next
    return None


def hydra_flags(config: Any | None) -> list[dict[str, Any]]:
    """One "script_flags" row per simple key of the composed config (`hydra.*` left out: Hydra's
    own settings), written as Hydra takes them: `data.num_workers=0`."""
    omegaconf = sys.modules.get("omegaconf")
    if config is None or omegaconf is None:
        return []
    try:
        tree = omegaconf.OmegaConf.to_container(config, resolve=False, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - a config we cannot read gives no flags
        return []
    if not isinstance(tree, dict):
        return []
    return setting_rows({k: v for k, v in flatten_settings(tree).items() if not k.startswith("hydra.")}, dashes="")


__all__ = ["hydra_flags", "hydra_task_config"]
