"""The code for settings that are not a keyword at a call (autocast, compile, threads, TF32,
cuDNN benchmark, channels_last): a snippet and the line it belongs at, written with the
user's own names and lines (`out = net(x)` -> `net.compile()`, the forward and loss lines
shown inside the autocast block). Reads the file with `ast`; never writes it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

from trainspeed.patches.cache_checks import cache_code


@dataclass(frozen=True)
class Snippet:
    setting: str
    file: str
    """Relative to the root the command ran in, when inside it."""
    line: int
    where: str
    """"before", "after" or "around" the line."""
    code: str
    why: str
    patchable: bool = True
    """False where the code is advice to adapt, not a line to insert as is (the script
    already compiles: change its mode there)."""
    end_line: int | None = None
    """"around": the last line of the statements the block wraps (`line` is the first)."""
    head: str = ""
    """"around": the block's opening line (`with torch.autocast(...):`) best.patch puts above
    the wrapped lines, which it indents one level."""


class Source:
    """One file's text and syntax tree (None when it does not parse)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, encoding="utf-8", newline="") as f:  # as written: CRLF stays CRLF in the diff
            self.text = f.read()
        self.bom = "\ufeff" if self.text.startswith("\ufeff") else ""
        self.code = self.text[len(self.bom):]
        """The text without a byte order mark (the parsers take it without)."""
        self.lines = self.code.splitlines()
        try:
            self.tree: ast.Module | None = ast.parse(self.code)
        except SyntaxError:
            self.tree = None

    def statement(self, line: int) -> ast.stmt | None:
        """The innermost statement spanning `line`."""
        best: ast.stmt | None = None
        for node in ast.walk(self.tree) if self.tree else ():
            if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
                if best is None or (node.end_lineno or 0) - node.lineno <= (best.end_lineno or 0) - best.lineno:
                    best = node
        return best

    def body_of(self, stmt: ast.stmt) -> list[ast.stmt]:
        """The statement list `stmt` is in (its siblings)."""
        for node in ast.walk(self.tree) if self.tree else ():
            for name in ("body", "orelse", "finalbody", "handlers"):
                body = getattr(node, name, None)
                if isinstance(body, list) and any(s is stmt for s in body):
                    return body
        return [stmt]

    def segment(self, stmts: list[ast.stmt]) -> list[str]:
        """The statements' lines as written, with the first one's indentation removed."""
        first, last = stmts[0].lineno, stmts[-1].end_lineno or stmts[-1].lineno
        lines = self.lines[first - 1:last]
        indent = len(lines[0]) - len(lines[0].lstrip())
        return [text[indent:] if text[:indent].strip() == "" else text.lstrip() for text in lines]

    def outermost_loop(self, line: int) -> ast.stmt | None:
        loops = [n for n in ast.walk(self.tree) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
                 and n.lineno <= line <= (n.end_lineno or n.lineno)] if self.tree else []
        return min(loops, key=lambda n: n.lineno) if loops else None

    def assignment_of(self, class_name: str) -> ast.Assign | None:
        """The first `name = ...ClassName(...)`, or `name = ClassName(...).to(device)` (a
        chain of method calls on the new instance, as pytorch/examples' dcgan builds netG)."""
        found = [n for n in ast.walk(self.tree) if isinstance(n, ast.Assign) and _constructs(n.value, class_name)
                 and isinstance(n.targets[0], (ast.Name, ast.Attribute))] if self.tree else []
        return min(found, key=lambda n: n.lineno) if found else None

    def first_statement(self) -> int:
        """Line of the first statement after the module docstring and `from __future__`
        imports (0 when there is none): where code that must run before any import goes."""
        body = self.tree.body if self.tree else []
        for i, node in enumerate(body):
            if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            decorators = getattr(node, "decorator_list", None) or []
            return min([node.lineno, *(d.lineno for d in decorators)])
        return 0

    def after_imports(self) -> tuple[int, bool]:
        """(last line of the leading imports, 0 when none; whether `torch` is imported as such)."""
        last = 0
        for node in self.tree.body if self.tree else []:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                last = node.end_lineno or node.lineno
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and last == 0:
                continue  # the module docstring
            elif isinstance(node, ast.Try) and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body):
                last = node.end_lineno or node.lineno  # try: import x / except ImportError
            else:
                break
        torch = any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None for a in n.names)
                    for n in (ast.walk(self.tree) if self.tree else ()))
        return last, torch


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _constructs(value: ast.expr, class_name: str) -> bool:
    """Whether `value` is `ClassName(...)`, or method calls chained on it (`.to(device)`)."""
    node: Any = value
    while isinstance(node, ast.Call):
        if _last_part(node.func) == class_name:
            return True
        node = node.func.value if isinstance(node.func, ast.Attribute) else None
    return False


def _last_part(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


# Callees at a model-call line that are not the model: tensor methods, torch functions, losses.
_NOT_MODEL_METHODS = {"to", "cuda", "cpu", "float", "half", "bfloat16", "view", "reshape", "contiguous",
                      "permute", "transpose", "unsqueeze", "squeeze", "flatten", "detach", "item", "mean",
                      "sum", "backward", "long", "int", "size", "argmax", "softmax", "log_softmax"}
_NOT_MODEL_ROOTS = {"torch", "F", "nn", "np", "math", "functional"}


def model_call(source: Source, line: int, model_class: str | None = None) -> tuple[str, ast.Call] | None:
    """The variable the model is called through at `line` and that call (`loss = crit(net(x), y)`
    -> ("net", ...)); the variable assigned from `model_class(...)` wins when it is called there."""
    stmt = source.statement(line)
    if stmt is None:
        return None
    calls = sorted((n for n in ast.walk(stmt) if isinstance(n, ast.Call)), key=lambda c: (c.lineno, c.col_offset))
    candidates: list[tuple[str, ast.Call]] = []
    for call in calls:
        name = _dotted(call.func)
        if not name:
            continue
        parts = name.split(".")
        lowered = name.lower()
        if parts[-1] in _NOT_MODEL_METHODS or parts[0] in _NOT_MODEL_ROOTS or "loss" in lowered \
                or "criterion" in lowered or parts[0] in ("print", "len", "range", "float", "int"):
            continue
        candidates.append((name, call))
    if model_class:
        built = source.assignment_of(model_class)
        var = _dotted(built.targets[0]) if built else None
        for name, call in candidates:
            if name == var:
                return name, call
    return candidates[0] if candidates else None


def _placement(source: Source, site: tuple[str, int] | None, call_line: int, model_class: str | None,
               ) -> tuple[int, str, str]:
    """Where model-wide code goes: before the optimizer's construction (same file, before the
    loop), else after the model's construction, else before the loop that calls it."""
    if site and site[0] == source.path and site[1] < call_line:
        stmt = source.statement(site[1])
        return (stmt.lineno if stmt else site[1]), "before", "before the optimizer is built"
    if model_class:
        built = source.assignment_of(model_class)
        if built is not None and built.lineno < call_line:
            return built.end_lineno or built.lineno, "after", f"after the model ({model_class}) is built"
    loop = source.outermost_loop(call_line)
    if loop is not None:
        return loop.lineno, "before", "before the training loop"
    stmt = source.statement(call_line)
    return (stmt.lineno if stmt else call_line), "before", "before the model is first called"


def autocast_snippet(setting: str, value: str, source: Source, line: int, shown: str, device: str,
                     already: str | None) -> Snippet:
    stmt = source.statement(line)
    stmts = [stmt] if stmt is not None else []
    if stmt is not None:
        # The loss computation after the forward belongs inside too, up to the backward: the
        # assignments that lead to the loss, then those that go on building it. fast_neural_style
        # computes a content loss, then a style loss in a loop, then their sum: a block that
        # stopped at the first loss left bf16 features to an fp32 loss outside it.
        body = source.body_of(stmt)
        at = next(i for i, s in enumerate(body) if s is stmt)
        found = _assigns_loss(stmt)
        for follow in body[at + 1:at + 1 + FOLLOWING]:
            if _has_backward(follow) or not (_builds_loss(follow) if found else _is_assignment(follow)):
                break
            stmts.append(follow)
            found = found or _assigns_loss(follow)
    body_lines = source.segment(stmts) if stmts else [source.lines[line - 1].strip()]
    if not any(_assigns_loss(s) for s in stmts):
        body_lines.append("loss = ...  # the loss computation belongs inside too")
    dtype = "torch.bfloat16" if value == "bf16" else "torch.float16"
    head = f'with torch.autocast(device_type="{device}", dtype={dtype}):'
    code = head + "\n" + "\n".join(
        "    " + text if text else "" for text in body_lines)
    first = stmts[0].lineno if stmts else line
    last = (stmts[-1].end_lineno or stmts[-1].lineno) if stmts else line
    span = f"line {first}" if first == last else f"lines {first}-{last}"
    why = (f"Run the forward and the loss ({span}) under autocast; the backward and the optimizer "
           "step stay outside the block.")
    if already:
        why += f" Your script already autocasts to {already} there: change that block's dtype instead."
    if value == "fp16":
        code += (f'\n\n# fp16 also needs a GradScaler (bf16 does not):\nscaler = torch.amp.GradScaler("{device}")'
                 "  # once, before the loop\nscaler.scale(loss).backward()  # instead of loss.backward()\n"
                 "scaler.step(optimizer)  # instead of optimizer.step()\nscaler.update()")
        why += " fp16 scales the loss so that small gradients do not underflow to zero."
    # best.patch wraps the lines itself where that is the whole change: bf16 (fp16 needs a
    # GradScaler too), the loss found, no autocast of the script's own to edit instead, `torch`
    # imported as such, and no string spanning lines (indenting it would change its text).
    wrap = (value == "bf16" and not already and any(_assigns_loss(s) for s in stmts)
            and source.after_imports()[1] and not _multiline_strings(stmts))
    return Snippet(setting, shown, first, "around", code, why, patchable=wrap, end_line=last, head=head)


def _multiline_strings(stmts: list[ast.stmt]) -> bool:
    return any(isinstance(n, (ast.Constant, ast.JoinedStr)) and (n.end_lineno or n.lineno) > n.lineno
               for s in stmts for n in ast.walk(s))


FOLLOWING = 10
"""Statements after the forward that an autocast block may take in (up to the backward)."""


def _is_assignment(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign))


def _builds_loss(stmt: ast.stmt) -> bool:
    """An assignment to a loss (`style_loss *= w`, `total_loss = a + b`), or a loop of them
    (`for ft, gm in zip(...): style_loss += mse(gram(ft), gm)`)."""
    if isinstance(stmt, ast.For) and not stmt.orelse:
        return bool(stmt.body) and all(_is_assignment(s) for s in stmt.body) and any(_assigns_loss(s) for s in stmt.body)
    return _is_assignment(stmt) and _assigns_loss(stmt)


def _assigns_loss(stmt: ast.stmt) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    names = [n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)]
    return any("loss" in n.lower() for n in names)


def _has_backward(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Call) and _last_part(n.func) == "backward" for n in ast.walk(stmt))


def model_snippets(setting: str, value: Any, source: Source, call_line: int, shown: str,
                   optimizer_site: tuple[str, int] | None, model_class: str | None, compiled: bool
                   ) -> list[Snippet]:
    """compile and channels_last: once on the model (named as the script calls it)."""
    found = model_call(source, call_line, model_class)
    var = found[0] if found else "model"
    line, where, what = _placement(source, optimizer_site, call_line, model_class)
    if setting == "compile":
        mode = "" if value in ("default", True) else f'mode="{value}"'
        why = (f"Compile the model in place once, {what} (the first steps pay for the compilation); "
               f"`{var}` is what line {call_line} calls.")
        if compiled:
            why += " Your script already compiles it: set this mode where it does instead."
        return [Snippet(setting, shown, line, where, f"{var}.compile({mode})", why, patchable=not compiled)]
    out = [Snippet(setting, shown, line, where, f"{var} = {var}.to(memory_format=torch.channels_last)",
                   f"Convolutions run in NHWC: convert the model once, {what}.")]
    arg = found[1].args[0] if found and found[1].args else None
    name = _dotted(arg) if arg is not None else None
    stmt = source.statement(call_line)
    at = stmt.lineno if stmt else call_line
    if name:
        code = f"{name} = {name}.to(memory_format=torch.channels_last)"
    else:
        code = f"# give {var} its 4-D input as .to(memory_format=torch.channels_last)"
    out.append(Snippet(setting, shown, at, "before", code, "And each batch of images, before the model call."))
    return out


RUNTIME_CODE = {
    "runtime.cache_checks": cache_code,
    "threads": lambda v: f"torch.set_num_threads({v})",
    "cuda.tf32": lambda v: "torch.backends.cuda.matmul.allow_tf32 = True\ntorch.backends.cudnn.allow_tf32 = True",
    "cuda.cudnn_benchmark": lambda v: "torch.backends.cudnn.benchmark = True",
    "cuda.expandable_segments": lambda v: ("import os\n"
                                           f'os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:{bool(v)}")'),
}
BEFORE_IMPORTS = frozenset({"cuda.expandable_segments"})
"""Settings read from the environment when torch starts its allocator: their code goes above the
script's imports, where no library has touched CUDA yet."""
_RUNTIME_WHY = {
    "runtime.cache_checks": "Once, after the imports: the library's package check, asked at every step, "
                            "answers from its first look (no package is installed during the run).",
    "threads": "Once, after the imports: intra-op threads for CPU kernels.",
    "cuda.tf32": "Once, after the imports: float32 matmuls and convolutions on TF32 tensor cores.",
    "cuda.cudnn_benchmark": "Once, after the imports: cuDNN times its algorithms for each input shape "
                            "(fixed shapes gain; shapes that change every step pay each time).",
    "cuda.expandable_segments": "Before the imports, as CUDA's allocator reads it at its start: segments grow in "
                                "place, so batches whose sizes change stop fragmenting the cache (no more "
                                "free-everything-and-retry). If your environment already sets "
                                "PYTORCH_CUDA_ALLOC_CONF, add expandable_segments:True there instead.",
}


def runtime_snippet(setting: str, value: Any, source: Source, shown: str) -> Snippet:
    code = RUNTIME_CODE[setting](value)
    if setting in BEFORE_IMPORTS:
        first = source.first_statement()
        if first:
            return Snippet(setting, shown, first, "before", code, _RUNTIME_WHY[setting])
        return Snippet(setting, shown, max(1, len(source.lines)), "after", code, _RUNTIME_WHY[setting])
    last, has_torch = source.after_imports()
    if not has_torch and "torch." in code:
        code = "import torch\n" + code
    if last:
        return Snippet(setting, shown, last, "after", code, _RUNTIME_WHY[setting])
    return Snippet(setting, shown, 1, "before", code, _RUNTIME_WHY[setting])


__all__ = ["RUNTIME_CODE", "Snippet", "Source", "autocast_snippet", "model_call", "model_snippets",
           "runtime_snippet"]
