"""What-if winners as code: the edit of the user's loop that does what the what-if measured.

A what-if thins a call per call site: only every k-th `torch.save` / logging call /
`gc.collect()` runs, counted from the first (whatif.py). At a call the loop makes under
`if step % 5 == 0:`, that is the same as the literal times k (`if step % 20 == 0:`: steps 0,
20, 40 either way); at a call made every iteration of `for step in range(...)` (or of `for i,
batch in enumerate(...)`), the same as moving it under `if step % k == 0:`. Those are the two
edits made here, with LibCST (every comment and space of the user's code kept); any other
shape (an interval held in a variable, a `while` loop with no counter) is no edit, and the
what-if stays a measurement the user acts on. The edits are pure text -> text, like
keyword_edit.py: code_change.py puts them into best.patch.

    new, done, why_not = realize(text, [IntervalEdit("whatif.save_every", 42, 4, SAVE_CALLS)])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WHATIF_SITES = {"whatif.save_every": "save_sites", "whatif.log_every": "log_sites", "whatif.gc_every": "gc_sites"}
"""What-if setting -> the Targets field holding the call sites it thins."""
WHATIF_CALLS: dict[str, tuple[str, ...]] = {
    "whatif.save_every": ("save",),
    "whatif.log_every": ("print", "add_scalar", "add_scalars", "add_histogram", "add_image", "add_images",
                         "add_text", "add_figure", "log"),
    "whatif.gc_every": ("collect", "empty_cache"),
}
"""What-if setting -> the last name part of the calls it thins (torch.save, gc.collect, ...)."""
CODE_PREFIX = "code."
"""`code.save_every=4`: the edit below made in the source the script runs (edited_source.py),
where `whatif.save_every=4` thins the calls at run time: what a what-if winner's
verification runs, so it measures best.patch's edit."""


def whatif_of(code_key: str) -> str:
    """code.save_every -> whatif.save_every."""
    return "whatif." + code_key[len(CODE_PREFIX):]


def code_of(whatif_key: str) -> str:
    """whatif.save_every -> code.save_every."""
    return CODE_PREFIX + whatif_key[len("whatif."):]


def as_code(settings: dict[str, Any], realized: Any = None) -> dict[str, Any]:
    """The settings with each what-if best.patch writes as an edit (WHATIF_SITES; `realized`, a
    predicate on one {key: value}, says which of them it can) turned into its code.* key."""
    return {code_of(key) if key in WHATIF_SITES and (realized is None or realized({key: value})) else key: value
            for key, value in settings.items()}


@dataclass(frozen=True, slots=True)
class IntervalEdit:
    setting: str
    line: int
    """1-based line of the call (a statement of the loop)."""
    factor: int


@dataclass(frozen=True, slots=True)
class Outcome:
    edit: IntervalEdit
    done: str | None
    """What the edit did ("the interval on line 8, 5 -> 20"); None when it could not be made."""
    why_not: str | None = None


def _callee(call: Any) -> str | None:
    import libcst as cst

    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else None


def _interval_literal(test: Any) -> Any:
    """The Integer N of a test `<expr> % N == 0` or `not <expr> % N`, else None."""
    import libcst as cst

    expr = test
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if not (isinstance(target.operator, cst.Equal) and isinstance(target.comparator, cst.Integer)
                and target.comparator.evaluated_value == 0):
            return None
        expr = test.left
    elif isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        expr = test.expression
    else:
        return None
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo) \
            and isinstance(expr.right, cst.Integer) and expr.right.evaluated_value > 0:
        return expr.right
    return None


def _loop_counter(loop: Any) -> str | None:
    """The name that counts a `for` loop's iterations from 0: `step` of `for step in
    range(n)`, `i` of `for i, batch in enumerate(loader)` (or `enumerate(loader, 0)`)."""
    import libcst as cst

    it, target = loop.iter, loop.target
    if not isinstance(it, cst.Call) or not isinstance(it.func, cst.Name):
        return None
    if it.func.value == "range" and len(it.args) == 1 and isinstance(target, cst.Name):
        return target.value
    from_zero = all(isinstance(a.value, cst.Integer) and a.value.evaluated_value == 0 for a in it.args[1:])
    if it.func.value == "enumerate" and 1 <= len(it.args) <= 2 and from_zero and isinstance(target, cst.Tuple) \
            and target.elements and isinstance(target.elements[0].value, cst.Name):
        return target.elements[0].value.value
    return None


def realize(text: str, edits: list[IntervalEdit]) -> tuple[str, list[Outcome]]:
    """The text with each edit made (where it can be), and what happened to each."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

    try:
        wrapper = MetadataWrapper(cst.parse_module(text))
    except cst.ParserSyntaxError as exc:
        return text, [Outcome(e, None, f"the file does not parse ({exc.message})") for e in edits]
    pos, parent = wrapper.resolve(PositionProvider), wrapper.resolve(ParentNodeProvider)
    replace: dict[Any, Any] = {}
    outcomes: list[Outcome] = []
    for e in edits:
        calls = WHATIF_CALLS.get(e.setting, ())
        # the line a frame reports may be inside a call written over several lines
        stmt = next((n for n, r in pos.items() if isinstance(n, cst.SimpleStatementLine)
                     and r.start.line <= e.line <= r.end.line
                     and any(isinstance(c, cst.Call) and _callee(c) in calls for c in _walk(n))), None)
        if stmt is None:
            outcomes.append(Outcome(e, None, f"no {'/'.join(calls)} call in a statement at line {e.line}"))
            continue
        node, interval, loop = stmt, None, None
        while node in parent and not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            node = parent[node]
            if isinstance(node, cst.If):
                interval = _interval_literal(node.test) if node.orelse is None else None
                if interval is None:
                    loop = node  # under another condition: thinned by k, it is no literal or wrap
                break
            if isinstance(node, (cst.For, cst.While)):
                loop = node
                break
        if interval is not None:
            if interval not in replace:
                new = interval.evaluated_value * e.factor
                replace[interval] = interval.with_changes(value=str(new))
                line = pos[interval].start.line
                outcomes.append(Outcome(e, f"the interval on line {line}, {interval.value} -> {new}"))
            continue
        if isinstance(loop, cst.If):
            outcomes.append(Outcome(e, None, "the call is under a condition that is not an `if x % N == 0` interval"))
            continue
        counter = _loop_counter(loop) if isinstance(loop, cst.For) else None
        if counter is None:
            outcomes.append(Outcome(e, None, "the call is not under an `if x % N == 0` interval, and its loop "
                                             "has no counter from 0 (`for step in range(n)`, `for i, b in "
                                             "enumerate(loader)`) to put it under one"))
            continue
        head = cst.parse_expression(f"{counter} % {e.factor} == 0")
        replace[stmt] = cst.If(test=head, body=cst.IndentedBlock(body=[stmt.with_changes(leading_lines=())]),
                               leading_lines=stmt.leading_lines)
        outcomes.append(Outcome(e, f"moved under `if {counter} % {e.factor} == 0:`"))
    if not replace:
        return text, outcomes
    return wrapper.module.visit(_Replace(replace)).code, outcomes


def realizable(settings: dict[str, Any], targets: Any) -> bool:
    """Whether every what-if among `settings` has recorded call sites, each of which `realize`
    can edit in its file as it is now (False without LibCST, the `patch` extra)."""
    keys = [k for k in settings if k.startswith("whatif.")]
    if not keys or any(k not in WHATIF_SITES for k in keys):
        return False
    try:
        import libcst  # noqa: F401
    except ImportError:
        return False
    for key in keys:
        sites = getattr(targets, WHATIF_SITES[key], ())
        value = settings[key]
        if not sites or not isinstance(value, int) or isinstance(value, bool):
            return False
        for path, line in sites:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError):
                return False
            if not realize(text.lstrip("\ufeff"), [IntervalEdit(key, line, value)])[1][0].done:
                return False
    return True


def _walk(node: Any):
    yield node
    for child in node.children:
        yield from _walk(child)


class _Replace:
    """A CST transformer that swaps given original nodes for their replacements."""

    def __new__(cls, replace: dict[Any, Any]):
        import libcst as cst

        class Transformer(cst.CSTTransformer):
            def on_leave(self, original: Any, updated: Any) -> Any:
                return replace.get(original, updated)

        return Transformer()


__all__ = ["CODE_PREFIX", "IntervalEdit", "Outcome", "WHATIF_CALLS", "WHATIF_SITES", "as_code", "code_of", "realizable",
           "realize", "whatif_of"]
