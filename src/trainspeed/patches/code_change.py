"""The code change behind a script tune's winning settings: where each goes in the user's
files, and a unified diff (best.patch) for the ones that are a keyword at a call site.

Keyword changes (DataLoader(...num_workers=4), AdamW(..., fused=True), from_pretrained(...,
attn_implementation="sdpa")) are made with LibCST, a concrete syntax tree that keeps every
comment, space and line break of the user's code: only the argument in question changes.
Settings that are not a keyword (autocast, compile, threads) become a snippet with the line
it belongs at; the script's own flags become the flag to pass; what-ifs get a note. The user's
files are only read.

    change = code_change(settings, targets, root=Path.cwd(), command=[...], device="cpu")
    change.write(out_dir)      # best.patch (when non-empty) and code_change.md
"""

from __future__ import annotations

import difflib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainspeed.patches.plan import FLAG_PREFIX, apply_flags
from trainspeed.patches.targets import Site, Targets

# setting -> (which call site of Targets, callee names that match, keyword, value as code)
KEYWORDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "loader.num_workers": ("loader_site", ("DataLoader",), "num_workers"),
    "loader.pin_memory": ("loader_site", ("DataLoader",), "pin_memory"),
    "loader.persistent_workers": ("loader_site", ("DataLoader",), "persistent_workers"),
    "loader.prefetch_factor": ("loader_site", ("DataLoader",), "prefetch_factor"),
    "hf.attn_implementation": ("from_pretrained_site", ("from_pretrained", "from_config", "_from_config"),
                               "attn_implementation"),
}
OPTIMIZERS = ("AdamW", "Adam", "SGD", "Adagrad", "Adamax", "NAdam", "RAdam", "RMSprop", "Adadelta")


@dataclass(frozen=True)
class Snippet:
    setting: str
    file: str
    line: int
    where: str
    """"before", "after" or "around" the line."""
    code: str
    why: str


@dataclass
class CodeChange:
    patch: str = ""
    snippets: list[Snippet] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    """The command with the flags set (empty when no flag changed)."""

    def markdown(self) -> str:
        out = ["# The code change for the settings that won", ""]
        if self.flags:
            out += ["## Your script's own flags", "", "Pass these (no code change):", "",
                    "```bash", shlex.join(self.command), "```", ""]
        if self.patch:
            out += ["## Keyword arguments (best.patch)", "",
                    "Apply from the directory you ran the tune in: `git apply best.patch` (or `patch -p1 < best.patch`).",
                    "", "```diff", self.patch.rstrip("\n"), "```", ""]
        if self.snippets:
            out += ["## Code to add", ""]
            for s in self.snippets:
                out += [f"### {s.setting}: {s.where} {s.file}:{s.line}", "", s.why, "", "```python", s.code, "```", ""]
        if self.notes:
            out += ["## Notes", ""] + [f"- {n}" for n in self.notes] + [""]
        if len(out) == 2:
            out.append("Nothing to change: no setting won over the script as it is.")
        return "\n".join(out) + "\n"

    def write(self, out_dir: Path) -> list[Path]:
        from trainspeed.fileio import atomic_write_text

        written = []
        if self.patch:
            atomic_write_text(out_dir / "best.patch", self.patch)
            written.append(out_dir / "best.patch")
        atomic_write_text(out_dir / "code_change.md", self.markdown())
        return written + [out_dir / "code_change.md"]


def _shown(path: str, root: Path) -> str:
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _inside(path: str, root: Path) -> bool:
    return not _shown(path, root).startswith(os.sep) and "site-packages" not in path and os.path.isfile(path)


def _literal(value: Any) -> str:
    return repr(value)  # ints, bools and strings: Python's repr is valid code


def code_change(settings: dict[str, Any], targets: Targets, *, root: Path, command: list[str],
                device: str = "cpu", flag_styles: dict[str, str] | None = None) -> CodeChange:
    change = CodeChange()
    edits: dict[str, dict[int, list[tuple[str, tuple[str, ...], str, str]]]] = {}  # file -> line -> edits

    def want(setting: str, site: Site | None, callees: tuple[str, ...], keyword: str, code: str) -> None:
        if site is None:
            change.notes.append(f"{setting}: the call it belongs to was not recorded; set {keyword}={code} "
                                "where your training loop builds it")
            return
        if not _inside(site[0], root):
            change.notes.append(f"{setting}: the call is at {site[0]}:{site[1]}, outside your project "
                                f"({root}); set {keyword}={code} where your code reaches it")
            return
        edits.setdefault(site[0], {}).setdefault(site[1], []).append((setting, callees, keyword, code))

    flags: dict[str, Any] = {}
    for key, value in settings.items():
        if key.startswith(FLAG_PREFIX):
            flags[key[len(FLAG_PREFIX):]] = value
        elif key in KEYWORDS:
            attr, callees, keyword = KEYWORDS[key]
            want(key, getattr(targets, attr), callees, keyword, _literal(value))
        elif key == "optimizer.impl":
            callees = (targets.optimizer_class,) if targets.optimizer_class else OPTIMIZERS
            want(key, targets.optimizer_site, callees, str(value), "True")
        elif key.startswith("whatif."):
            change.notes.append(f"{key}={value} was a what-if (it thins or removes calls behind the script's back): "
                                "it measured what that finding costs; to keep the gain, change the interval in "
                                "your loop")
        else:
            snippet = _snippet(key, value, targets, root, device)
            if snippet is None:
                change.notes.append(f"{key}={value}: no place for it was recorded; see docs/tune.md")
            else:
                change.snippets.append(snippet)
    if flags:
        change.command = apply_flags(command, flags, flag_styles)
        change.flags = [shlex.join(apply_flags([], {k: v}, flag_styles)) for k, v in flags.items()]
    if edits:
        from trainspeed.patches.keyword_edit import edit_calls

        parts = []
        for path, by_line in sorted(edits.items()):
            source = Path(path).read_text(encoding="utf-8")
            new, notes = edit_calls(source, by_line)
            change.notes += [f"{_shown(path, root)}: {n}" for n in notes]
            if new != source:
                parts.append(_unified(source, new, _shown(path, root)))
        change.patch = "".join(parts)
    return change


def _unified(old: str, new: str, name: str) -> str:
    """A diff `git apply` and `patch -p1` take, a missing final newline marked as git does."""
    lines = []
    for line in difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     fromfile=f"a/{name}", tofile=f"b/{name}"):
        lines.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(lines)


def _line(path: str, number: int) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()[number - 1]
    except (OSError, IndexError):
        return ""


def _callee_variable(line: str) -> str:
    """`out = model(x)` -> "model"; `loss = net(x).loss` -> "net" (default "model")."""
    import re

    m = re.search(r"([A-Za-z_][\w.]*)\s*\(", line.split("=", 1)[-1])
    return m.group(1) if m else "model"


def _after_imports(path: str) -> int:
    """The first line after the file's leading imports (1-based)."""
    last = 0
    for i, text in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if text.startswith(("import ", "from ")):
            last = i
        elif last and text.strip() and not text.startswith((" ", "\t", "#")):
            break
    return last + 1


def _snippet(key: str, value: Any, t: Targets, root: Path, device: str) -> Snippet | None:
    dev = "cuda" if device == "cuda" else "cpu"
    if key == "precision" and t.model_call_site and _inside(t.model_call_site[0], root):
        path, line = t.model_call_site
        code_line = _line(path, line).strip() or "out = model(x)"
        dtype = "torch.bfloat16" if value == "bf16" else "torch.float16"
        code = (f"with torch.autocast(device_type={dev!r}, dtype={dtype}):\n    {code_line}\n"
                "    loss = ...  # the loss computation belongs inside too")
        why = "Run the forward (and the loss) under autocast; backward and the optimizer stay outside."
        if value == "fp16":
            code += ("\n\n# fp16 needs a GradScaler (bf16 does not):\nscaler = torch.amp.GradScaler("
                     f"{dev!r})  # once, before the loop\nscaler.scale(loss).backward()\n"
                     "scaler.step(optimizer)\nscaler.update()")
            why += " fp16 also scales the loss so small gradients do not underflow."
        return Snippet(key, _shown(path, root), line, "around", code, why)
    if key == "compile" and (t.optimizer_site or t.model_call_site):
        site = t.optimizer_site or t.model_call_site
        assert site is not None
        var = _callee_variable(_line(*t.model_call_site)) if t.model_call_site else "model"
        mode = "" if value == "default" else f"mode={value!r}"
        where = "before" if t.optimizer_site else "before the loop that contains"
        return Snippet(key, _shown(site[0], root), site[1], where, f"{var}.compile({mode})",
                       "Compile the model in place once, before training (the first steps pay the compilation).")
    script = t.script or (t.model_call_site or t.optimizer_site or (None, 0))[0]
    if script is None or not _inside(script, root):
        return None
    line = _after_imports(script)
    code = {"threads": f"torch.set_num_threads({value})",
            "cuda.tf32": "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True",
            "cuda.cudnn_benchmark": "torch.backends.cudnn.benchmark = True",
            "channels_last": "model = model.to(memory_format=torch.channels_last)\n"
                             "# and each batch: x = x.to(memory_format=torch.channels_last)"}.get(key)
    if code is None:
        return None
    return Snippet(key, _shown(script, root), line, "at", code, "Once, after the imports (before the model is built).")


__all__ = ["CodeChange", "Snippet", "code_change"]
