"""The flags of a minGPT-style config object: `--trainer.num_workers=0` on the command line.

minGPT's projects build a tree of CfgNode objects (`C.trainer = Trainer.get_default_config()`)
and hand sys.argv to `config.merge_from_args`, which sets any key of the tree from
`--a.b=value`. The DataLoader then reads `config.num_workers` deep inside mingpt/trainer.py, so
advice that names that line asks the user to edit the library. The tree is read after the run
from the script's globals (the objects that have `merge_from_args` and `to_dict`): each simple
value is a flag, `--trainer.num_workers` with the value the run used, which the doctor's advice
and the tune's knobs then set as the script's own flag.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from trainspeed.doctor.instrument.setting_rows import flatten_settings, setting_rows

def _is_config_tree(value: Any) -> bool:
    kind = type(value)
    return callable(getattr(kind, "merge_from_args", None)) and callable(getattr(kind, "to_dict", None))


def script_globals(tb: TracebackType | None, script: str) -> dict[str, Any] | None:
    """The module globals of `script` from a traceback that passed through its top level (the
    doctor's stop at --steps, a crash): runpy returns them only when the script ends."""
    target = os.path.abspath(script)
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "<module>" and os.path.abspath(frame.f_code.co_filename) == target:
            return frame.f_globals
        tb = tb.tb_next
    return None


def _subtrees(tree: Any, found: set[int], depth: int = 0) -> None:
    """Add the ids of every config tree below `tree` to `found`."""
    if depth > 8:
        return
    for child in getattr(tree, "__dict__", {}).values():
        if _is_config_tree(child) and id(child) not in found:
            found.add(id(child))
            _subtrees(child, found, depth + 1)


def config_object_flags(namespace: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One "script_flags" row per simple value of the script's config trees (roots only: a
    subtree bound to its own name, `train_config = config.trainer`, is the same keys again)."""
    if not namespace:
        return []
    trees = [value for name, value in list(namespace.items()) if not name.startswith("_") and _is_config_tree(value)]
    nested: set[int] = set()
    for tree in trees:
        _subtrees(tree, nested)
    values: dict[str, Any] = {}
    for tree in trees:
        if id(tree) in nested:
            continue
        try:
            found = flatten_settings(tree.to_dict())
        except Exception:  # noqa: BLE001 - a config we cannot read gives no flags
            continue
        for key, value in found.items():
            values.setdefault(key, value)
    return setting_rows(values)


__all__ = ["config_object_flags", "script_globals"]
