"""The flags of a nanoGPT-style configurator: every setting the script can take as `--key=value`.

nanoGPT, llama2.c and the many scripts copied from them set their settings as module-level
globals, then run `exec(open('configurator.py').read())`, which overrides any of those globals
from `--key=value` arguments (and from config files named as plain arguments). Their flags are
therefore every simple global assigned before that line, typed on the command line or not: a
finding about llama2.c's per-step `loss.item()` can say `--log_interval=50` although the user
never typed --log_interval (its default, 1, is in train.py). Read from the source, statically:
the doctor only observes, and the script's globals are gone once it is stopped.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path
from typing import Any

from trainspeed.doctor.instrument.setting_rows import flags_from_argv, setting_rows

_SIMPLE = (bool, int, float, str)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}


def _value(node: ast.AST) -> Any:
    """A literal's value, arithmetic on literals included (nanoGPT's `gradient_accumulation_steps
    = 5 * 8`); raises ValueError for anything else."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)) and not isinstance(left, bool):
            return _OPS[type(node.op)](left, right)
        raise ValueError("not arithmetic on numbers")
    return ast.literal_eval(node)


def _assignments(body: list[ast.stmt], stop: ast.stmt | None = None) -> dict[str, Any]:
    """name -> value of the module-level `name = <simple literal>` statements (before `stop`)."""
    found: dict[str, Any] = {}
    for node in body:
        if node is stop:
            break
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or target.id.startswith("_"):
            continue
        try:
            parsed = _value(value)
        except (ValueError, TypeError, SyntaxError, ZeroDivisionError, OverflowError):
            continue
        if isinstance(parsed, _SIMPLE):
            found[target.id] = parsed
    return found


def _exec_of_file(node: ast.stmt) -> str | None:
    """The path in a module-level `exec(open('<path>').read())`, or None."""
    call = node.value if isinstance(node, ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "exec" and call.args):
        return None
    read = call.args[0]
    if not (isinstance(read, ast.Call) and isinstance(read.func, ast.Attribute) and read.func.attr == "read"):
        return None
    opened = read.func.value
    if (isinstance(opened, ast.Call) and isinstance(opened.func, ast.Name) and opened.func.id == "open"
            and opened.args and isinstance(opened.args[0], ast.Constant) and isinstance(opened.args[0].value, str)):
        return opened.args[0].value
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _overrides_globals(text: str) -> bool:
    """Does this file set globals from `--key=value` arguments (nanoGPT's configurator.py)?"""
    return "sys.argv" in text and "globals()" in text


def configurator_flags(script: Path, args: list[str], cwd: Path) -> list[dict[str, Any]]:
    """One "script_flags" row per global the script's configurator can override, with the value
    the run used (its config files and `--key=value` arguments applied over the script's
    defaults); [] for a script without such a configurator."""
    source = _read(script)
    if source is None:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    for node in tree.body:
        path = _exec_of_file(node)
        if path is None:
            continue
        # opened relative to the working directory, as the script does (its own folder when run there)
        text = _read(cwd / path) or _read(script.parent / path)
        if text and _overrides_globals(text):
            defaults = _assignments(tree.body, stop=node)
            break
    else:
        return []
    values = dict(defaults)
    for arg in args:
        if "=" not in arg and not arg.startswith("-") and arg.endswith(".py"):  # a config file
            config = _read(cwd / arg)
            if config is not None:
                try:
                    values.update((k, v) for k, v in _assignments(ast.parse(config).body).items() if k in values)
                except SyntaxError:
                    pass
        else:  # `--key=value`, in its place among the config files: the last one given wins
            values.update((row["dest"], row["value"]) for row in flags_from_argv([arg]) if row["dest"] in values)
    return setting_rows(values, defaults=defaults)


__all__ = ["configurator_flags"]
