"""The user's Lightning `self.log(..., prog_bar=True)` calls: what a per-step host read inside
Lightning comes from.

Lightning turns every value logged with prog_bar=True into a Python number each step, for the
progress bar (fabric/utilities/apply_func.py `to_item`: `value.item()`). Lightning's own
examples/pytorch/basics/transformer.py logs its training loss so: 2 reads a step under the
doctor, 1 with TQDMProgressBar(refresh_rate=50), none with prog_bar=False. The call sits in
the LightningModule, the file whose training_step calls the model (the model observation's
call site), so that file is read for the calls to name.
"""

from __future__ import annotations

import ast
from pathlib import Path

from trainspeed.doctor.checks.context import CheckContext


def prog_bar_logs(ctx: CheckContext) -> list[str]:
    """`file:line` of each `.log(...)` / `.log_dict(...)` with prog_bar=True in the files that
    call the model (in their training_step when they have one); [] when none is found or the
    files cannot be read."""
    paths = sorted({str(m["call_site_path"][0]) for m in ctx.models()
                    if isinstance(m.get("call_site_path"), list) and m["call_site_path"]})
    found = []
    for path in paths:
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        # the training step's own calls (validation_step/test_step log too, outside the steps)
        steps = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and f.name == "training_step"]
        for node in (n for scope in (steps or [tree]) for n in ast.walk(scope)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("log", "log_dict")
                    and any(k.arg == "prog_bar" and isinstance(k.value, ast.Constant) and k.value.value is True
                            for k in node.keywords)):
                found.append(f"{Path(path).name}:{node.lineno}")
    return found


__all__ = ["prog_bar_logs"]
