"""best.patch's what-if edits run for real: `code.save_every=4` makes, in the source the script
runs, the edit best.patch writes for `whatif.save_every=4` (whatif_code.realize: the interval
literal times 4, or the per-step call moved under `if step % 4 == 0:`), instead of thinning
the calls at run time. The tune's verification of a what-if winner runs this, so the figure
it reports is the patched code's.

The user's files are only read. The edited text is compiled under the file's own path: the
script keeps its `__file__`, its directory first on sys.path (sibling modules import as
before), its working directory (relative data paths) and tracebacks that name its files.
Two places read a script's source: runpy reads the main script through `io.open_code`
(patched for the edited paths only), and imports go through the loaders (a finder in front
of the others hands an edited module's spec a loader that compiles the edited text and
never reads or writes a cached .pyc). An edit that cannot be made, or a result that does not
compile, is a ConfigError before the script starts: the trial fails and says why.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import io
import os
import sys
from typing import Any

from trainspeed.errors import ConfigError
from trainspeed.patches.context import InstallContext
from trainspeed.patches.whatif_code import CODE_PREFIX, WHATIF_SITES, IntervalEdit, code_of, realize, whatif_of

_SHARED = "edited_source"


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def edited_texts(edits: dict[str, int], targets: Any) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """{real path: edited text} for the code.* settings `edits` (key -> factor) at their call
    sites in `targets`, and per edit made (its what-if setting, "train.py:15: the interval on
    line 14, 2 -> 8"). A ConfigError names the first edit that cannot be made or a file that
    no longer compiles."""
    wanted: dict[str, list[IntervalEdit]] = {}
    for key, factor in edits.items():
        whatif = whatif_of(key)
        sites = getattr(targets, WHATIF_SITES[whatif], ())
        if not sites:
            raise ConfigError(f"{key}={factor}: no {whatif} call site was recorded, so there is no edit to make")
        for path, line in sites:
            wanted.setdefault(_real(path), []).append(IntervalEdit(whatif, line, factor))
    texts: dict[str, str] = {}
    done: list[tuple[str, str]] = []
    for path, items in sorted(wanted.items()):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read().lstrip("\ufeff")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{CODE_PREFIX}*: {path} cannot be read for the edit ({exc})") from None
        new, outcomes = realize(text, items)
        for o in outcomes:
            if not o.done:
                raise ConfigError(f"{code_of(o.edit.setting)}={o.edit.factor}: the edit "
                                  f"could not be made at {os.path.basename(path)}:{o.edit.line}: {o.why_not}")
            done.append((o.edit.setting, f"{os.path.basename(path)}:{o.edit.line}: {o.done}"))
        try:
            compile(new, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise ConfigError(f"{CODE_PREFIX}*: {path} does not compile once edited ({exc.msg}, line {exc.lineno})") \
                from None
        texts[path] = new
    return texts, done


class _EditedLoader(importlib.machinery.SourceFileLoader):
    """Compiles the edited text under the file's own path; no .pyc is read or written."""

    def __init__(self, fullname: str, path: str, text: str) -> None:
        super().__init__(fullname, path)
        self._text = text

    def get_code(self, fullname: str) -> Any:
        return compile(self._text, self.path, "exec", dont_inherit=True)

    def get_source(self, fullname: str) -> str:
        return self._text


class EditedSources(importlib.abc.MetaPathFinder):
    """In front of sys.meta_path: a module whose file has an edited text loads that text."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        origin = spec.origin
        if not origin or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        text = self.texts.get(_real(origin))
        if text is None:
            return None
        spec.loader = _EditedLoader(fullname, origin, text)
        return spec

    def open_code(self, original: Any) -> Any:
        """io.open_code as runpy calls it for the main script: the edited text for an edited path."""
        def open_code(path: Any) -> Any:
            text = self.texts.get(_real(os.fsdecode(path)))
            return original(path) if text is None else io.BytesIO(text.encode("utf-8"))

        open_code.__wrapped__ = original  # type: ignore[attr-defined]
        return open_code


def install_code_edit(key: str) -> Any:
    """The installer of setting `key` (code.save_every, ...): every code.* setting of one run
    is made together (two edits in one file), the finder and io.open_code patched once."""
    def install(value: int, ctx: InstallContext) -> None:
        state = ctx.shared.setdefault(_SHARED, {"edits": {}, "finder": None})
        state["edits"][key] = value
        texts, done = edited_texts(state["edits"], ctx.targets)
        if state["finder"] is None:
            finder = state["finder"] = EditedSources()
            ctx.patches.setattr(io, "open_code", finder.open_code(io.open_code))
            sys.meta_path.insert(0, finder)
            ctx.patches.call_on_undo(lambda: sys.meta_path.remove(finder) if finder in sys.meta_path else None)
        state["finder"].texts = texts
        ctx.note(f"code edit: {key}={value}: the script ran with best.patch's edit made in its source, "
                 f"not the what-if: {'; '.join(text for setting, text in done if setting == whatif_of(key))}")
    return install


__all__ = ["EditedSources", "edited_texts", "install_code_edit"]
