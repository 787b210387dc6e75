"""Precision where a framework owns it: `L.Trainer(precision="bf16-mixed")`, `L.Fabric(...)`.

The tune measures bf16/fp16 as autocast around the trained module's forward (a runtime patch
that works in any loop). In a Lightning or Fabric script the change to keep is the framework's
own switch, one keyword at its constructor: the framework then autocasts the training step
itself and, for "16-mixed", scales the loss (a GradScaler the user would otherwise write by
hand). Lightning's own examples/pytorch/basics/transformer.py builds `L.Trainer(...)` in main().
"""

from __future__ import annotations

import ast

from trainspeed.patches.snippets import Source, _last_part
from trainspeed.patches.targets import Targets

CONSTRUCTORS = {"lightning": ("Trainer",), "lightning_fabric": ("Fabric",)}
"""Framework (frameworks.py's name) -> the class whose `precision=` keyword sets it."""
VALUES = {"bf16": "bf16-mixed", "fp16": "16-mixed"}
"""The tune's precision setting -> the framework's spelling of it."""


def constructor_site(targets: Targets, source_of) -> tuple[str, int, tuple[str, ...]] | None:
    """(file, line, callee names) of the one framework constructor call in the user's files
    (the script, the file that calls the model), or None: no framework that owns precision,
    no such call, or several (which one trains is not known)."""
    callees = CONSTRUCTORS.get(targets.framework or "")
    if not callees:
        return None
    files = [f for f in dict.fromkeys([targets.script, targets.model_call_site[0] if targets.model_call_site
                                       else None]) if f]
    found = []
    for path in files:
        src: Source | None = source_of(path)
        for node in ast.walk(src.tree) if src is not None and src.tree is not None else ():
            if isinstance(node, ast.Call) and _last_part(node.func) in callees:
                found.append((path, node.lineno, callees))
    return found[0] if len(found) == 1 else None


__all__ = ["CONSTRUCTORS", "VALUES", "constructor_site"]
