"""Set keyword arguments of one call on a given line, with LibCST: a concrete syntax tree
keeps the file byte for byte apart from the argument that changes (comments, spacing, a
trailing comma, the user's line breaks). Pure: source text in, source text out.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

Edit = tuple[str, tuple[str, ...], str, str]
"""(setting, callee names that match, keyword, value as code)."""

_LITERALS = (cst.Integer, cst.Float, cst.SimpleString, cst.Name)


def _callee(call: cst.Call) -> str:
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


class _Finder(cst.CSTVisitor):
    """The call each line's edits belong to: the innermost call spanning the line whose
    callee matches (a line's f_lineno is where a multi-line call starts, or inside it)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, wanted: dict[int, list[Edit]]) -> None:
        self.wanted = wanted
        self.found: dict[int, tuple[cst.Call, int]] = {}  # line -> (call, span)

    def visit_Call(self, node: cst.Call) -> None:
        pos = self.get_metadata(PositionProvider, node)
        for line, edits in self.wanted.items():
            if pos.start.line <= line <= pos.end.line and _callee(node) in edits[0][1]:
                span = pos.end.line - pos.start.line
                if line not in self.found or span < self.found[line][1]:
                    self.found[line] = (node, span)


class _Setter(cst.CSTTransformer):
    def __init__(self, targets: dict[cst.Call, list[Edit]], notes: list[str]) -> None:
        self.targets = targets
        self.notes = notes

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        edits = self.targets.get(original)
        if not edits:
            return updated
        args = list(updated.args)
        unset: set[str] = set()
        for setting, _, keyword, code in edits:
            if keyword in ("persistent_workers", "prefetch_factor") and "num_workers" in unset:
                self.notes.append(f"{setting}: needs num_workers > 0, which could not be set here")
                continue
            index = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == keyword), None)
            if index is not None:
                current = args[index].value
                if not isinstance(current, _LITERALS):
                    self.notes.append(f"{setting}: {keyword}={_code(current)} is computed in the call; "
                                      f"set it to {code} where that value comes from")
                    unset.add(keyword)
                    continue
                args[index] = args[index].with_changes(value=cst.parse_expression(code))
                continue
            if any(a.star == "**" for a in args):
                self.notes.append(f"{setting}: the call passes **kwargs; {keyword}={code} may be set there")
            new = cst.Arg(value=cst.parse_expression(code), keyword=cst.Name(keyword),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
            if args and isinstance(args[-1].comma, cst.Comma):
                # A trailing comma (one argument per line): the new argument takes the last
                # one's place at the end, the last one takes its neighbour's comma and line break.
                last = args[-1]
                before = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))
                args[-1] = last.with_changes(comma=before)
                new = new.with_changes(comma=last.comma)
            args.append(new)
        return updated.with_changes(args=args)


def edit_calls(source: str, by_line: dict[int, list[Edit]]) -> tuple[str, list[str]]:
    """The source with each line's call given its keywords, and notes on what could not be done."""
    notes: list[str] = []
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        return source, [f"not parsed by LibCST ({exc.message}); nothing changed"]
    finder = _Finder(by_line)
    wrapper.visit(finder)
    targets: dict[cst.Call, list[Edit]] = {}
    for line, edits in by_line.items():
        if line not in finder.found:
            names = " or ".join(edits[0][1])
            notes.append(f"no {names}(...) call at line {line} (the file changed since the run?); "
                         + ", ".join(f"{s}: set {k}={c}" for s, _, k, c in edits))
            continue
        targets.setdefault(finder.found[line][0], []).extend(edits)
    if not targets:
        return source, notes
    return wrapper.module.visit(_Setter(targets, notes)).code, notes


__all__ = ["edit_calls"]
