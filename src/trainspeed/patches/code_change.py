"""The code change behind a script tune's winning settings: where each goes in the user's
files, and a unified diff (best.patch) for the ones that are a keyword at a call site.

Keyword changes (DataLoader(...num_workers=4), AdamW(..., fused=True), from_pretrained(...,
attn_implementation="sdpa")) are made with LibCST (keyword_edit), a concrete syntax tree that
keeps every comment, space and line break of the user's code: only the argument in question
changes. Settings that are not a keyword (autocast, compile, threads, ...) become a snippet
with the line it belongs at (snippets); the script's own flags become the flag to pass;
what-ifs and whatever cannot be placed get a note. The user's files are only read.

    change = code_change(settings, targets, root=Path.cwd(), command=[...], device="cpu")
    change.write(out_dir)      # best.patch (when non-empty) and code_change.md
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from trainspeed.optim_kernels import FUSED_OPTIMIZERS
from trainspeed.patches.plan import (FLAG_PREFIX, apply_flags, command_with_flags, flag_style,  # noqa: F401 - command_with_flags re-exported
                                     render_flag)
from trainspeed.patches.framework_precision import VALUES, constructor_site
from trainspeed.patches.insert_lines import insert_snippets, overlapping, patchable, shifted
from trainspeed.patches.installed import is_installed
from trainspeed.patches.several_models import several_models_snippet
from trainspeed.patches.snippets import BEFORE_IMPORTS, RUNTIME_CODE, Snippet, Source, autocast_snippet, model_snippets, \
    runtime_snippet
from trainspeed.patches.targets import Targets
from trainspeed.patches.whatif_code import WHATIF_SITES, IntervalEdit, realize

# setting -> (which call site of Targets, callee last name parts that match, keyword)
KEYWORDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "loader.num_workers": ("loader_site", ("DataLoader",), "num_workers"),
    "loader.pin_memory": ("loader_site", ("DataLoader",), "pin_memory"),
    "loader.persistent_workers": ("loader_site", ("DataLoader",), "persistent_workers"),
    "loader.prefetch_factor": ("loader_site", ("DataLoader",), "prefetch_factor"),
    "hf.attn_implementation": ("from_pretrained_site", ("from_pretrained", "from_config", "_from_config"),
                               "attn_implementation"),
}
OPTIMIZERS = ("AdamW", "Adam", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta")
_WHAT = {"loader_site": "DataLoader", "from_pretrained_site": "from_pretrained/from_config",
         "optimizer_site": "optimizer"}
_WHATIF = {
    "whatif.log_every": "logging only every {v}th call was measured (the script was not changed); to keep the "
                        "gain, log every {v} steps in your loop (`if step % {v} == 0:`)",
    "whatif.save_every": "writing only every {v}th torch.save was measured (the script was not changed); to "
                         "keep the gain, checkpoint {v} times less often",
    "whatif.gc_every": "gc.collect() / torch.cuda.empty_cache() running once every {v} calls was measured (the "
                       "script was not changed); to keep the gain, call them every {v} steps (`if step % {v} == 0:`)",
    "whatif.no_gc": "gc.collect() / torch.cuda.empty_cache() doing nothing was measured (the script was not "
                    "changed); to keep the gain, remove those calls from your loop",
}
_CONFIG_ROOTS = ("args", "opt", "opts", "flags", "FLAGS", "config", "cfg", "conf", "hparams")


@dataclass
class CodeChange:
    patch: str = ""
    """Unified diff, paths relative to the root (`a/train.py`, `b/train.py`); "" when none."""
    snippets: list[Snippet] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    """The script's own flags as typed: `--workers 4`, `--compile=True`, `--compile`."""
    notes: list[str] = field(default_factory=list)
    edits: list[str] = field(default_factory=list)
    """What best.patch does, one line a keyword: `loader.num_workers: train.py:12: num_workers=4 (was 0)`."""
    command: list[str] = field(default_factory=list)
    """The command with the flags set (empty when no flag changed)."""
    inserted: list[Snippet] = field(default_factory=list)
    """Snippets best.patch inserts as lines (the rest are shown for the user to place)."""

    def markdown(self, patch_path: str = "best.patch") -> str:
        out = ["# The code change for the settings that won", ""]
        if self.flags:
            out += ["## Your script's own flags", "", "Pass " + ", ".join(f"`{f}`" for f in self.flags)
                    + " (no code change):", "", "```bash", shlex.join(self.command), "```", ""]
        if self.patch:
            out += ["## best.patch", ""] + [f"- {e}" for e in self.edits] + [
                "", "From the directory you ran the tune in: `git apply --check "
                f"{patch_path}` then `git apply {patch_path}` (or `patch -p1 < {patch_path}`); "
                f"`git apply -R {patch_path}` undoes it.", "", "```diff", self.patch.replace("\r\n", "\n").rstrip("\n"), "```", ""]
        if self.inserted:
            out += ["## Why these lines", ""]
            for s in self.inserted:
                out += [f"- {s.setting} ({s.file}:{s.line}): {s.why}"]
            out += [""]
        to_place = [s for s in self.snippets if s not in self.inserted]
        if to_place:
            out += ["## Code to add", ""]
            for s in to_place:
                out += [f"### {s.setting}: {s.where} {s.file}:{s.line}", "", s.why, "",
                        "```python", s.code, "```", ""]
        if self.notes:
            out += ["## Notes", ""] + [f"- {n}" for n in self.notes] + [""]
        if len(out) == 2:
            out += ["Nothing to change: no setting won over the script as it is.", ""]
        return "\n".join(out)

    def write(self, out_dir: Path, *, write: Callable[..., Path] | None = None) -> list[Path]:
        """best.patch (only when non-empty) and code_change.md in out_dir; nothing else is written.
        Each atomically, or through `write` (a FileSet's: with the tune's other outputs)."""
        from trainspeed.fileio import atomic_write_text

        write = write or atomic_write_text
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        if self.patch:
            # no newline translation: a CRLF file's diff keeps its CRLF lines
            written.append(write(out_dir / "best.patch", self.patch, newline=""))
        written.append(write(out_dir / "code_change.md", self.markdown(str(out_dir / "best.patch"))))
        return [Path(p) for p in written]


# --- paths -------------------------------------------------------------------------------


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.abspath(path))


def _shown(path: str, root: Path) -> str:
    """Relative to root when inside it, else as given."""
    real, base = _real(path), _real(root)
    if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(real, base)
    return path


def _where_not(setting: str, path: str, place: str, root: Path) -> str | None:
    """Why `path` cannot be changed (`place` says what is there: "the DataLoader call at
    train.py:42"), or None when it can."""
    if not os.path.isfile(path):
        return f"{setting}: {place} was not found: the file does not exist any more"
    if os.path.isabs(_shown(path, root)) or is_installed(_real(path)):
        return f"{setting}: {place} is outside your project ({root}); not changed"
    return None


# --- flags -------------------------------------------------------------------------------


def _flag_options(sources: list[str]) -> set[str]:
    """`--option` strings written in the user's files (argparse add_argument calls)."""
    found: set[str] = set()
    for path in sources:
        try:
            found |= set(re.findall(r"""["'](--[A-Za-z0-9][\w-]*)["']""", Path(path).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return found


def _from_flag(expression: str, sources: list[str], command: list[str]) -> tuple[str, str | None]:
    """`args.workers` -> ("args", "--workers") when a flag sets it (the option as the script
    spells it: `--num-workers` or `--num_workers`), else (root, None)."""
    m = re.fullmatch(r"(\w+)\.(\w+)", expression.strip())
    if not m or m.group(1) not in _CONFIG_ROOTS:
        return "", None
    name = m.group(2)
    options = _flag_options(sources) | {a.split("=", 1)[0] for a in command if a.startswith("--")}
    for option in (f"--{name}", f"--{name.replace('_', '-')}"):
        if option in options:
            return m.group(1), option
    return m.group(1), (f"--{name}" if m.group(1) in ("args", "opt", "opts", "flags", "FLAGS") else None)


# --- the change --------------------------------------------------------------------------


def code_change(settings: dict[str, Any], targets: Targets, *, root: Path, command: list[str],
                device: str = "cpu", flag_styles: dict[str, str] | None = None) -> CodeChange:
    """Where each setting goes in the user's files (see the module docstring). Never raises for
    a setting it cannot place, never writes a file."""
    from trainspeed.patches.keyword_edit import Edit, edit_calls

    root = Path(root)
    change = CodeChange()
    device_type = str(device).split(":")[0] or "cpu"
    styles = dict(flag_styles or {})
    edits: dict[str, list[Edit]] = {}  # real path -> edits
    intervals: dict[str, list[IntervalEdit]] = {}  # real path -> what-if edits (whatif_code.py)
    sources: dict[str, Source] = {}
    user_files = [p for p in {targets.script, *(s[0] for s in (targets.loader_site, targets.optimizer_site,
                                                              targets.model_call_site, targets.from_pretrained_site,
                                                              *targets.optimizer_sites)
                                                if s)} if p and os.path.isfile(p)]

    def source(path: str) -> Source | None:
        real = _real(path)
        if real not in sources:
            try:
                sources[real] = Source(real)
            except (OSError, UnicodeDecodeError) as exc:
                change.notes.append(f"{_shown(path, root)} could not be read ({exc}); nothing placed there")
                return None
        return sources[real]

    def want(setting: str, attr: str, callees: tuple[str, ...], keyword: str, value: Any, suffix: bool,
             site: tuple[str, int] | None = None) -> None:
        site = site or getattr(targets, attr)
        what = _WHAT[attr]
        if site is None:
            change.notes.append(f"{setting}: the {what} call was not recorded; set {keyword}={value!r} "
                                "where your training loop builds it")
            return
        why = _where_not(setting, site[0], f"the {what} call at {_shown(site[0], root)}:{site[1]}", root)
        if why:
            change.notes.append(why + f" (set {keyword}={value!r} there yourself)")
            return
        edits.setdefault(_real(site[0]), []).append(Edit(setting, site[1], callees, keyword, value, suffix))

    flags: dict[str, Any] = {}
    for key, value in settings.items():
        key = str(key)
        if key.startswith(FLAG_PREFIX):
            option = key[len(FLAG_PREFIX):]
            if option.endswith("="):  # stored in its `--x=1` form
                option = option[:-1]
                styles.setdefault(option, "equals")
            flags[option] = value
        elif key in KEYWORDS:
            attr, callees, keyword = KEYWORDS[key]
            want(key, attr, callees, keyword, value, False)
        elif key == "optimizer.impl":
            if value not in ("fused", "foreach"):
                change.notes.append(f"optimizer.impl={value!r}: not 'fused' or 'foreach'; nothing to change")
                continue
            if targets.optimizer_build_sites:  # each optimizer's own call, with the kernel its class has
                for site, cls in zip(targets.optimizer_build_sites, targets.optimizer_build_classes):
                    if value == "fused" and cls not in FUSED_OPTIMIZERS:
                        change.notes.append(f"{key}=fused: {cls} at {_shown(site[0], root)}:{site[1]} has no fused "
                                            "kernel; left as it is")
                    else:
                        want(key, "optimizer_site", (cls,), str(value), True, False, site=site)
                continue
            named = (targets.optimizer_class,) if targets.optimizer_class else OPTIMIZERS
            want(key, "optimizer_site", named, str(value), True, not targets.optimizer_class)
            for other in targets.optimizer_sites:  # the loop's other optimizers, as the trials set them
                if other != targets.optimizer_site:
                    want(key, "optimizer_site", OPTIMIZERS, str(value), True, True, site=other)
        elif key == "precision" and value in VALUES and (site := constructor_site(targets, source)):
            path, line, callees = site
            why = _where_not(key, path, f"the {callees[0]} call at {_shown(path, root)}:{line}", root)
            if why:
                change.notes.append(why + f" (set precision={VALUES[value]!r} there yourself)")
                continue
            edits.setdefault(_real(path), []).append(Edit(key, line, callees, "precision", VALUES[value], False))
            change.notes.append(f"precision={value}: {callees[0]}(precision={VALUES[value]!r}) makes the framework "
                                "autocast the training step itself (the tune measured autocast around the model's "
                                "forward)" + (" and scale the loss for fp16" if value == "fp16" else ""))
        elif key in WHATIF_SITES and _want_intervals(key, value, targets, root, intervals, change):
            pass  # made in the loop below, the call sites' code as the file has it
        elif key in _WHATIF:
            change.notes.append(f"{key}={value}: a what-if: " + _WHATIF[key].format(v=value))
        elif key.startswith("whatif."):
            change.notes.append(f"{key}={value}: a what-if measurement (the script was not changed); "
                                "nothing to apply")
        else:
            _place_snippet(key, value, targets, root, device_type, change, source)

    _flags(flags, styles, command, change)
    parts = []
    inserts_by_file: dict[str, list[Snippet]] = {}
    for real in list(sources):
        here = [s for s in change.snippets if s.file == _shown(real, root) and patchable(s)]
        here = [s for s in here if s not in overlapping(here)]
        if here:
            inserts_by_file[real] = here
    for path in sorted(set(edits) | set(inserts_by_file) | set(intervals)):
        src = source(path)
        if src is None:
            continue
        text, inserts = insert_snippets(src, inserts_by_file.get(path, []))
        moved = shifted(edits.get(path, []), inserts)
        new, outcomes = edit_calls(text, moved)
        new = src.bom + _realize(new, intervals.get(path, []), inserts, _shown(path, root), change)
        # the notes name the lines of the file as the user has it, not of the patched text
        below = sum(n for _, n in inserts)
        original = {id(m): e for m, e in zip(moved, edits.get(path, []))}
        outcomes = [replace(o, edit=original.get(id(o.edit), o.edit),
                            call_line=_unshift(o.call_line, inserts) if below else o.call_line) for o in outcomes]
        for s in inserts_by_file.get(path, []):
            change.inserted.append(s)
            if s.where == "around":
                span = f"line {s.line}" if s.end_line == s.line else f"lines {s.line}-{s.end_line}"
                change.edits.append(f"{s.setting}: {s.file}:{s.line}: {span} wrapped in `{s.head}`")
            else:
                change.edits.append(f"{s.setting}: {s.file}:{s.line}: `{s.code.splitlines()[-1]}` inserted "
                                    f"{s.where} line {s.line}")
        shown = _shown(path, root)
        for o in outcomes:
            text = _outcome(o, shown, user_files, command, styles, change)
            if text:
                change.notes.append(text)
        if new != src.text:
            parts.append(unified_diff(src.text, new, shown))
    change.patch = "".join(parts)
    return change


def _want_intervals(key: str, value: Any, targets: Targets, root: Path, intervals: dict[str, list[IntervalEdit]],
                    change: CodeChange) -> bool:
    """Queue the edits that realize what-if `key` at every call site it thinned; False (the
    what-if stays a note) when a site lies outside the project or none was recorded."""
    sites = getattr(targets, WHATIF_SITES[key])
    if not sites or not isinstance(value, int) or isinstance(value, bool):
        return False
    if any(_where_not(key, path, f"the call at {_shown(path, root)}:{line}", root) for path, line in sites):
        return False
    for path, line in sites:
        intervals.setdefault(_real(path), []).append(IntervalEdit(key, line, value))
    return True


def _realize(text: str, wanted: list[IntervalEdit], inserts: list[tuple[int, int]], shown: str,
             change: CodeChange) -> str:
    """The what-if edits made in `text` (lines moved past inserted snippets), each said in
    change.edits, or in change.notes why not."""
    if not wanted:
        return text
    new, outcomes = realize(text, shifted(wanted, inserts))
    for o, e in zip(outcomes, wanted):
        if o.done:
            change.edits.append(f"{e.setting}: {shown}:{e.line}: {o.done} (what the tune measured as the what-if)")
        else:
            change.notes.append(f"{e.setting}={e.factor}: {shown}:{e.line}: not changed: {o.why_not}; "
                                + _WHATIF[e.setting].format(v=e.factor))
    return new


def _unshift(line: int, inserts: list[tuple[int, int]]) -> int:
    """A 1-based line of the text with `inserts` ((original index, lines) pairs, see
    insert_lines.shifted) back to the line of the text without them."""
    shift = 0
    for at, n in sorted(inserts):
        if line <= at + shift:  # above this block (and every later one)
            break
        shift += n
    return line - shift


def _flags(flags: dict[str, Any], styles: dict[str, str], command: list[str], change: CodeChange) -> None:
    if not flags:
        return
    rendered = []
    for option, value in flags.items():
        parts = render_flag(option, value, flag_style(option, styles, command))
        if parts:
            rendered.append(shlex.join(parts) if len(parts) > 1 else parts[0])
        else:
            change.notes.append(f"args.{option}={value}: leave {option} out of the command")
    change.flags = rendered
    change.command = apply_flags(command, flags, styles)  # the command `trainspeed run --with` runs


def _outcome(o: Any, shown: str, user_files: list[str], command: list[str], styles: dict[str, str],
             change: CodeChange) -> str | None:
    e = o.edit
    at = f"{shown}:{o.call_line or e.line}"
    name = "/".join(e.callees) if len(e.callees) <= 3 else "optimizer"
    if o.status in ("set", "replaced"):
        was = f" (was {e.keyword}={o.detail})" if o.status == "replaced" else ""
        change.edits.append(f"{e.setting}: {at}: `{o.code}`{was}")
        if o.status == "set" and o.detail:
            return (f"{e.setting}: {o.code} was added at {at} next to **{o.detail}; if {o.detail} can hold "
                    f"{e.keyword} too, Python raises 'got multiple values': drop it there")
        return None
    if o.status == "unchanged":
        return f"{e.setting}: {at} already has {o.code}; nothing to change"
    if o.status == "missing":
        return (f"{e.setting}: the {name} call at {shown}:{e.line} was not found (file changed since the run?); "
                f"set {o.code or e.keyword + '=' + repr(e.value)} there yourself")
    if o.status == "computed":
        base, option = _from_flag(o.detail, user_files, command)
        if option:
            flag = shlex.join(render_flag(option, e.value, styles.get(option, "space")) or [option])
            return f"{e.setting}: {e.keyword} comes from {o.detail} ({at}): pass {flag}"
        where = f"where {base} is defined" if base else "where that value comes from"
        return (f"{e.setting}: {e.keyword}={o.detail} is computed at {at}; set it to {e.value!r} {where} "
                "(not changed in the patch)")
    if o.status == "kwargs":
        from trainspeed.patches.keyword_edit import EXCLUSIVE  # LibCST made this outcome: it is there

        other = EXCLUSIVE.get(e.keyword)
        where = (f"{o.detail} where it holds no {other}=True (torch refuses both)" if other and e.value is True
                 else o.detail)
        return (f"{e.setting}: the {name} call at {at} takes its keywords from **{o.detail}; "
                f"add {e.keyword}={e.value!r} to {where} (not changed in the patch)")
    if o.status == "positional":
        return (f"{e.setting}: {at} passes {e.keyword} by position ({o.detail}); set it to {e.value!r} there "
                "(not changed in the patch)")
    if o.status == "needs_workers":
        return f"{e.setting}: {o.code} needs num_workers > 0, and the DataLoader at {at} has none; not set"
    return f"{e.setting}: {shown}: {o.detail}; not changed"


def _place_snippet(key: str, value: Any, t: Targets, root: Path, device: str, change: CodeChange,
                   source: Any) -> None:
    if key in ("precision", "compile", "channels_last"):
        site = t.model_call_site
        if key == "channels_last" and value is False:
            change.notes.append("channels_last=False: the script's own format; nothing to change")
            return
        if site is None:
            change.notes.append(f"{key}={value}: where the model is called was not recorded; see docs/tune.md")
            return
        why = _where_not(key, site[0], f"the model call at {_shown(site[0], root)}:{site[1]}", root)
        src = None if why else source(site[0])
        if src is None:
            if why:
                change.notes.append(why)
            return
        shown = _shown(site[0], root)
        if src.tree is None:
            change.notes.append(f"{key}={value}: {shown} does not parse; nothing placed")
        elif src.statement(site[1]) is None or site[1] > len(src.lines):
            change.notes.append(f"{key}={value}: the model call at {shown}:{site[1]} was not found "
                                "(file changed since the run?)")
        elif (several := _several_models_snippet(key, value, t, src, shown, device)) is not None:
            change.snippets.append(several)
        elif key == "precision":
            change.snippets.append(autocast_snippet("precision", str(value), src, site[1], shown, device, t.autocast))
        else:
            opt = (_real(t.optimizer_site[0]), t.optimizer_site[1]) if t.optimizer_site else None
            change.snippets += model_snippets(key, value, src, site[1], shown, opt, t.model_class, t.compiled)
        return
    if key in RUNTIME_CODE:
        if value is False:
            change.notes.append(f"{key}=False: the default; nothing to change")
            return
        script = t.script or next((s[0] for s in (t.model_call_site, t.optimizer_site, t.loader_site) if s), None)
        if script is None:
            where = "above your imports" if key in BEFORE_IMPORTS else "after your imports"
            change.notes.append(f"{key}={value}: the script was not recorded; add `{RUNTIME_CODE[key](value)}` "
                                + where)
            return
        why = _where_not(key, script, f"the script {_shown(script, root)}", root)
        src = None if why else source(script)
        if src is None:
            if why:
                change.notes.append(why)
            return
        change.snippets.append(runtime_snippet(key, value, src, _shown(script, root)))
        return
    change.notes.append(f"{key}={value!r}: not a setting this version knows how to write as code; "
                        "nothing placed")


def _several_models_snippet(key: str, value: Any, t: Targets, src: Any, shown: str, device: str) -> Snippet | None:
    """A loop that trains several models gets the setting on each, as the trials ran it
    (several_models.py): precision unless the script autocasts already, compile unless it
    compiles already. None for one model, or when no model's construction is in this file."""
    if len(t.trained_classes) < 2 or (key == "precision" and t.autocast) or (key == "compile" and t.compiled):
        return None
    opt_line = t.optimizer_site[1] if t.optimizer_site and _real(t.optimizer_site[0]) == _real(src.path) else None
    return several_models_snippet(key, str(value) if key == "precision" else value, src, t.trained_classes,
                                  shown, device, opt_line)


def unified_diff(old: str, new: str, name: str) -> str:
    """A diff `git apply` and `patch -p1` take; a missing final newline marked as git does."""
    lines = []
    for line in difflib.unified_diff(_lines(old), _lines(new),
                                     fromfile=f"a/{name}", tofile=f"b/{name}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines)


def _lines(text: str) -> list[str]:
    """Lines ending at "\n" only (str.splitlines also splits at form feeds, which diffs keep)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


__all__ = ["CodeChange", "Snippet", "code_change", "command_with_flags", "unified_diff"]
