"""Snippets that are whole statements (`model.compile()`, `torch.set_num_threads(1)`) go into
best.patch as inserted lines, at the statement the snippet names, with that statement's
indentation and the file's own line endings. A bf16 autocast block wraps its statements: its
`with` line goes above them and they move one level in (nanoGPT's `logits, loss = model(X,
Y)`). Comments, and a wrap that is not the whole change (fp16's GradScaler), stay in
code_change.md for the user to place: a patch may only hold what applies as written.

Pure text: the keyword edits (keyword_edit.py) then run on the new text, their line numbers
moved past the inserted lines by `shifted`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainspeed.patches.keyword_edit import Edit
    from trainspeed.patches.snippets import Snippet, Source


def insert_snippets(source: Source, snippets: list[Snippet]) -> tuple[str, list[tuple[int, int]]]:
    """(the file's text without its BOM with every snippet inserted, the insertions as
    (index of the first original line after them, lines inserted)). A snippet lands before its
    line's statement ("before") or after the statement that ends at its line ("after"),
    indented as that statement."""
    text = source.code
    eol = "\r\n" if "\r\n" in text else "\n"
    lines = text.split("\n")  # a CRLF line keeps its "\r": split on "\n" only, as the diff does
    plan: list[tuple[int, list[str]]] = []
    for s in snippets:
        if s.where == "around":
            head = lines[s.line - 1]
            indent = head[:len(head) - len(head.lstrip())]
            unit = "\t" if indent.startswith("\t") else "    "
            last = s.end_line or s.line
            lines[s.line - 1:last] = [unit + line if line.strip() else line for line in lines[s.line - 1:last]]
            plan.append((s.line - 1, [indent + s.head + ("\r" if eol == "\r\n" else "")]))
            continue
        stmt = source.statement(s.line)
        first = stmt.lineno if stmt is not None else s.line
        head = lines[first - 1] if 0 < first <= len(lines) else ""
        indent = head[:len(head) - len(head.lstrip())]
        at = first - 1 if s.where == "before" else ((stmt.end_lineno or s.line) if stmt is not None else s.line)
        new = [indent + code if code else "" for code in s.code.split("\n")]
        plan.append((at, [line + ("\r" if eol == "\r\n" else "") for line in new]))
    inserts: list[tuple[int, int]] = []
    # Bottom up, so the indices below stay valid; at one index the later snippet goes in first
    # and the earlier one above it, in the order the snippets came.
    for _, (at, new) in sorted(enumerate(plan), key=lambda p: (p[1][0], p[0]), reverse=True):
        lines[at:at] = new
        inserts.append((at, len(new)))
    return "\n".join(lines), sorted(inserts)


def shifted(edits: list[Edit], inserts: list[tuple[int, int]]) -> list[Edit]:
    """The keyword edits with their 1-based lines moved past the lines inserted above them."""
    return [replace(e, line=e.line + sum(n for at, n in inserts if at < e.line)) for e in edits]


def patchable(snippet: Snippet) -> bool:
    """A whole statement placed before or after a line, or a block that wraps lines by
    itself (its head known); not only a comment."""
    if snippet.where == "around":
        return snippet.patchable and bool(snippet.head) and snippet.end_line is not None
    code_lines = [line for line in snippet.code.split("\n") if line.strip()]
    return (snippet.where in ("before", "after") and snippet.patchable and bool(code_lines)
            and not all(line.lstrip().startswith("#") for line in code_lines))


def overlapping(snippets: list[Snippet]) -> list[Snippet]:
    """The wraps among `snippets` another snippet lands inside (kept out of the patch: the
    two would fight over the same lines' indentation)."""
    out = []
    for wrap in (s for s in snippets if s.where == "around"):
        end = wrap.end_line or wrap.line
        if any(o is not wrap and wrap.line <= o.line <= end for o in snippets):
            out.append(wrap)
    return out


__all__ = ["insert_snippets", "overlapping", "patchable", "shifted"]
