"""Set keyword arguments of one call on a given line, with LibCST: a concrete syntax tree
keeps the file byte for byte apart from the argument that changes (comments, spacing, a
trailing comma, the user's line breaks). Pure: source text in, source text and one outcome
per edit out; the wording of notes is the caller's (code_change).

A recorded site is the caller frame's line while the call ran: for a call spanning lines,
CPython reports the line the call starts on or the line of its callee name, so the call is
the one whose line range contains the site and whose callee's last name part matches
(one starting on that line first, then the innermost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider


@dataclass(frozen=True)
class Edit:
    setting: str
    line: int
    callees: tuple[str, ...]
    """Last name parts of the callee that match (`DataLoader` for `torch.utils.data.DataLoader(`)."""
    keyword: str
    value: Any
    """The Python value (int, bool, str, None): written as a literal."""
    suffix: bool = False
    """Match callees whose last name part ends with one of `callees` (FusedAdamW for AdamW)."""


@dataclass(frozen=True)
class Outcome:
    edit: Edit
    status: str
    """set | replaced | unchanged | missing | computed | kwargs | positional | needs_workers | unparsed"""
    detail: str = ""
    """computed: the expression; kwargs: the `**name`; replaced: the old value; set: the `**name`
    the new keyword sits next to (it must not hold the keyword too); missing/unparsed: why."""
    call_line: int = 0
    """First line of the call that was (or would have been) changed."""
    code: str = ""
    """The keyword as written (`num_workers=4`)."""


# DataLoader's positional parameters that a setting names: num_workers given by position
# (the 6th argument) would get a second value from our keyword.
_POSITIONAL = {"DataLoader": {"num_workers": 5, "pin_memory": 7}}
_LOADER = "DataLoader"
_NEEDS_WORKERS = ("persistent_workers", "prefetch_factor")
# An optimizer's implementations exclude each other (torch refuses fused and foreach both True),
# and a **dict in the call may hold the other on some devices only: nanoGPT passes
# **extra_args, dict(fused=True) on CUDA, so a foreach=True tuned on a CPU crashed it there.
EXCLUSIVE = {"fused": "foreach", "foreach": "fused"}


def _callee(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _matches(call: cst.Call, edit: Edit) -> bool:
    name = _callee(call)
    if not name:
        return False
    return any(name.endswith(c) for c in edit.callees) if edit.suffix else name in edit.callees


def _literal(node: cst.BaseExpression) -> bool:
    """A value written as a constant (replaceable); a name or any computation is not."""
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        return True
    if isinstance(node, cst.Name):
        return node.value in ("True", "False", "None")
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, (cst.Integer, cst.Float))
    return False


def render_value(value: Any, quote: str = '"') -> str:
    if isinstance(value, str):
        if quote not in value and "\\" not in value and "\n" not in value:
            return f"{quote}{value}{quote}"
        return repr(value)
    return repr(value)  # ints, floats, bools, None: Python's repr is valid code


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, edits: list[Edit]) -> None:
        self.edits = edits
        self.found: dict[Edit, tuple[tuple[int, int, int, int], cst.Call, int]] = {}
        self.quotes = {'"': 0, "'": 0}

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        q = node.value.lstrip("rRbBuUfF")[:1]
        if q in self.quotes:
            self.quotes[q] += 1

    def visit_Call(self, node: cst.Call) -> None:
        pos = self.get_metadata(PositionProvider, node)
        func_end = self.get_metadata(PositionProvider, node.func).end.line
        for edit in self.edits:
            if not (pos.start.line <= edit.line <= pos.end.line and _matches(node, edit)):
                continue
            on_line = edit.line in (pos.start.line, func_end)
            # rank: starts (or names its callee) on the line, then the innermost (fewest lines,
            # latest first line), then the first on its line (two calls on one line: one site)
            rank = (0 if on_line else 1, pos.end.line - pos.start.line, -pos.start.line, pos.start.column)
            if edit not in self.found or rank < self.found[edit][0]:
                self.found[edit] = (rank, node, pos.start.line)


def _clean(ws: cst.BaseParenthesizableWhitespace) -> cst.BaseParenthesizableWhitespace:
    """The same line break and indentation without the comment or the comment lines."""
    if isinstance(ws, cst.ParenthesizedWhitespace):
        return ws.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
    return ws


def _separator(call: cst.Call, args: list[cst.Arg], index: int) -> cst.BaseParenthesizableWhitespace:
    """The whitespace after a comma between two arguments, nearest to `index`: the call's own style."""
    between = sorted(range(len(args) - 1), key=lambda i: abs(i - (index - 2)))  # args[i].comma separates
    for i in between:
        comma = args[i].comma
        return _clean(comma.whitespace_after) if isinstance(comma, cst.Comma) else cst.SimpleWhitespace(" ")
    if isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return _clean(call.whitespace_before_args)  # one argument on its own line: the next below it
    return cst.SimpleWhitespace(" ")


def _insert(call: cst.Call, args: list[cst.Arg], new: cst.Arg) -> list[cst.Arg]:
    """`args` with `new` before the first `**mapping`, else last, in the call's layout."""
    index = next((i for i, a in enumerate(args) if a.star == "**"), len(args))
    if len(args) == 1 and isinstance(args[0].value, cst.GeneratorExp) and not args[0].value.lpar:
        # `f(x for x in y)`: a generator beside another argument needs its own parentheses
        args = [args[0].with_changes(value=args[0].value.with_changes(lpar=[cst.LeftParen()],
                                                                      rpar=[cst.RightParen()]))]
    if index < len(args):  # before **kwargs: after the argument ahead of it, with the same separator
        before = args[index - 1].comma
        new = new.with_changes(comma=cst.Comma(whitespace_after=_clean(before.whitespace_after))
                               if isinstance(before, cst.Comma) else cst.MaybeSentinel.DEFAULT)
        return args[:index] + [new] + args[index:]
    sep = _separator(call, args, index)
    if not args:
        return [new]
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: it (and the line break before `)`) moves to new
        tail = last.comma.whitespace_after
        if isinstance(tail, cst.ParenthesizedWhitespace) and isinstance(sep, cst.ParenthesizedWhitespace):
            # the last argument's comment (and comment lines below it) stay on its line
            new = new.with_changes(comma=last.comma.with_changes(whitespace_after=_clean(tail)))
            last = last.with_changes(comma=last.comma.with_changes(
                whitespace_after=sep.with_changes(first_line=tail.first_line, empty_lines=tail.empty_lines)))
        else:
            new = new.with_changes(comma=last.comma)
            last = last.with_changes(comma=cst.Comma(whitespace_after=sep))
        return args[:-1] + [last, new]
    tail = last.whitespace_after_arg
    if isinstance(tail, cst.ParenthesizedWhitespace):  # `x  # comment` then `)` on the next line
        if isinstance(sep, cst.ParenthesizedWhitespace):
            last = last.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""), comma=cst.Comma(
                whitespace_after=sep.with_changes(first_line=tail.first_line, empty_lines=tail.empty_lines)))
            new = new.with_changes(whitespace_after_arg=_clean(tail))
        else:
            last = last.with_changes(whitespace_after_arg=cst.SimpleWhitespace(""),
                                     comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            new = new.with_changes(whitespace_after_arg=tail)
        return args[:-1] + [last, new]
    return args[:-1] + [last.with_changes(comma=cst.Comma(whitespace_after=sep)), new]


class _Setter(cst.CSTTransformer):
    def __init__(self, targets: dict[cst.Call, list[Edit]], quote: str, starts: dict[cst.Call, int]) -> None:
        self.targets = targets
        self.quote = quote
        self.starts = starts
        self.outcomes: list[Outcome] = []

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        edits = self.targets.get(original)
        if not edits:
            return updated
        line = self.starts[original]
        args = list(updated.args)
        keywords = [a for a in args if a.keyword is not None]
        quote = next((a.value.value.lstrip("rRbBuUfF")[:1] for a in args
                      if isinstance(a.value, cst.SimpleString)), self.quote)
        equal = keywords[0].equal if keywords else cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
        spread = next((a for a in args if a.star == "**"), None)
        positional = [a for a in args if a.keyword is None and a.star == ""]
        callee = _LOADER if _callee(original).endswith(_LOADER) else _callee(original)
        # num_workers as the call will have it, when it is a constant (DataLoader's default: 0)
        at = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == "num_workers"), None)
        workers: Any = self._workers(args, at, spread, positional) if callee == _LOADER else "unknown"
        # num_workers first: whether persistent_workers / prefetch_factor may be set depends on it
        for edit in sorted(edits, key=lambda e: e.keyword != "num_workers"):
            code = render_value(edit.value, quote)
            shown = f"{edit.keyword}={code}"
            index = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == edit.keyword), None)

            def done(status: str, detail: str = "", edit: Edit = edit, shown: str = shown) -> None:
                self.outcomes.append(Outcome(edit, status, detail, line, shown))

            if callee == _LOADER and edit.keyword in _NEEDS_WORKERS and workers == 0 \
                    and edit.value not in (None, False):
                done("needs_workers")
                continue
            if index is not None:
                current = args[index].value
                if not _literal(current):
                    done("computed", _code(current))
                    continue
                if _code(current).strip() == code:
                    done("unchanged")
                else:
                    args[index] = args[index].with_changes(value=cst.parse_expression(code))
                    done("replaced", _code(current).strip())
                if edit.keyword == "num_workers":
                    workers = edit.value
                continue
            if spread is not None and (not keywords or edit.keyword in EXCLUSIVE):
                done("kwargs", _code(spread.value))
                continue
            slot = _POSITIONAL.get(callee, {}).get(edit.keyword)
            if slot is not None and len(positional) > slot:
                done("positional", _code(positional[slot].value))
                continue
            new = cst.Arg(value=cst.parse_expression(code), keyword=cst.Name(edit.keyword), equal=equal)
            args = _insert(updated, args, new)
            if edit.keyword == "num_workers":
                workers = edit.value
            done("set", _code(spread.value) if spread is not None else "")
        return updated.with_changes(args=args)

    @staticmethod
    def _workers(args: list[cst.Arg], index: int | None, spread: cst.Arg | None, positional: list[cst.Arg]) -> Any:
        if index is not None:
            value = args[index].value
            return int(value.value) if isinstance(value, cst.Integer) else "unknown"
        if len(positional) > 5:
            value = positional[5].value
            return int(value.value) if isinstance(value, cst.Integer) else "unknown"
        return "unknown" if spread is not None else 0  # DataLoader's default


def edit_calls(source: str, edits: list[Edit]) -> tuple[str, list[Outcome]]:
    """The source with each edit's call given its keyword, and one outcome per edit."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        return source, [Outcome(e, "unparsed", f"LibCST could not parse the file: {exc.message}") for e in edits]
    finder = _Finder(edits)
    wrapper.visit(finder)
    outcomes: list[Outcome] = []
    targets: dict[cst.Call, list[Edit]] = {}
    starts: dict[cst.Call, int] = {}
    for edit in edits:
        if edit not in finder.found:
            outcomes.append(Outcome(edit, "missing", "", edit.line))
            continue
        _, call, start = finder.found[edit]
        targets.setdefault(call, []).append(edit)
        starts[call] = start
    if not targets:
        return source, outcomes
    quote = "'" if finder.quotes["'"] > finder.quotes['"'] else '"'
    setter = _Setter(targets, quote, starts)
    new = wrapper.module.visit(setter).code
    try:
        cst.parse_module(new)
    except cst.ParserSyntaxError as exc:  # never hand back code that does not parse
        return source, outcomes + [Outcome(o.edit, "unparsed", f"the edited code did not parse: {exc.message}")
                                   for o in setter.outcomes]
    return new, outcomes + setter.outcomes


__all__ = ["Edit", "Outcome", "edit_calls", "render_value"]
