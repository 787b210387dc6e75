"""The code change for a script tune's winners: best.patch applies with `git apply` and
`patch -p1`, changes only the keyword in question, and the patched script still runs;
snippets name the user's own lines and variables; what cannot be placed is a note."""

from __future__ import annotations

import ast
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainspeed.patches.code_change import CodeChange, Snippet, code_change, command_with_flags
from trainspeed.patches.targets import Targets

pytestmark = pytest.mark.timeout(60)

PYTHON = sys.executable
HAS_PATCH = shutil.which("patch") is not None
HAS_GIT = shutil.which("git") is not None


def write(folder: Path, name: str, source: str, *, newline_at_end: bool = True) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = textwrap.dedent(source).lstrip("\n")
    path.write_text(text if newline_at_end else text.rstrip("\n"))
    return path


def line_of(path: Path, marker: str) -> int:
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if marker in text:
            return number
    raise AssertionError(f"{marker!r} not in {path}")


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def apply_patch(root: Path, change: CodeChange, tmp_path: Path) -> dict[str, Path]:
    """Write best.patch, apply it to copies of `root` with git apply and with patch -p1;
    {tool: patched copy}. The original folder is checked to be untouched."""
    before = digest(root)
    out = tmp_path / "out"
    written = change.write(out)
    assert out / "best.patch" in written and (out / "best.patch").read_bytes() == change.patch.encode()
    assert change.patch.endswith("\n")
    copies = {}
    tools = (["git"] if HAS_GIT else []) + (["patch"] if HAS_PATCH else [])
    assert tools, "neither git nor patch is installed"
    for tool in tools:
        copy = tmp_path / f"copy-{tool}"
        shutil.copytree(root, copy)
        if tool == "git":
            subprocess.run(["git", "apply", "--check", str(out / "best.patch")], cwd=copy, check=True)
            subprocess.run(["git", "apply", str(out / "best.patch")], cwd=copy, check=True)
        else:
            subprocess.run(["patch", "-p1", "--dry-run", "-i", str(out / "best.patch")], cwd=copy, check=True,
                           capture_output=True)
            subprocess.run(["patch", "-p1", "-i", str(out / "best.patch")], cwd=copy, check=True,
                           capture_output=True)
        copies[tool] = copy
    assert digest(root) == before  # the user's files were only read
    # both tools leave the same files: a test runs the patched script in one copy only (each run
    # is a fresh interpreter importing torch, 2 s of CPU)
    assert len({tuple(sorted(digest(copy).items())) for copy in copies.values()}) == 1
    return copies


def call_span(path: Path, line: int, name: str) -> tuple[int, int, ast.Call]:
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= line <= n.end_lineno
             and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) == name]
    assert calls, f"no {name}( call at {path}:{line}"
    call = min(calls, key=lambda c: c.end_lineno - c.lineno)
    return call.lineno, call.end_lineno, call


def assert_only_call_changed(original: Path, patched: Path, line: int, name: str,
                             added: dict[str, str]) -> None:
    """The patched file parses; the call at `line` has exactly the original keywords plus
    `added` (keyword -> value as code); every line outside the call is unchanged."""
    start, end, old_call = call_span(original, line, name)
    new_start, new_end, new_call = call_span(patched, line, name)
    old_lines, new_lines = original.read_text().split("\n"), patched.read_text().split("\n")
    assert new_start == start
    assert new_lines[:start - 1] == old_lines[:start - 1]
    assert new_lines[new_end:] == old_lines[end:]
    old_kw = {k.arg: ast.unparse(k.value) for k in old_call.keywords}
    new_kw = {k.arg: ast.unparse(k.value) for k in new_call.keywords}
    assert new_kw == {**old_kw, **added}
    assert [ast.unparse(a) for a in new_call.args] == [ast.unparse(a) for a in old_call.args]
    # comments in the call survive, each exactly once
    old_comments = [t.split("#", 1)[1] for t in old_lines[start - 1:end] if "#" in t]
    new_comments = [t.split("#", 1)[1] for t in new_lines[new_start - 1:new_end] if "#" in t]
    assert sorted(new_comments) == sorted(old_comments)


LOADER_SCRIPT = """
    import argparse

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()

    ds = TensorDataset(torch.arange(32.0).unsqueeze(1))
    loader = DataLoader(  # LOADER
        ds,
        batch_size=8,  # per step

        # shuffled every epoch
        shuffle=True,
    )
    batch = next(iter(loader))
    print("workers", loader.num_workers, "persistent", loader.persistent_workers, "batch", tuple(batch[0].shape))
"""


def test_multi_line_dataloader_gets_keywords_and_the_patched_script_runs(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", LOADER_SCRIPT)
    site = (str(train), line_of(train, "# LOADER"))
    change = code_change({"loader.num_workers": 2, "loader.persistent_workers": True},
                         Targets(script=str(train), loader_site=site), root=root,
                         command=["python", "train.py"])
    assert change.notes == []
    assert change.patch.startswith("--- a/train.py\n+++ b/train.py\n")
    assert change.patch.count("@@ ") == 1  # two settings on one call: one hunk
    for copy in apply_patch(root, change, tmp_path).values():
        assert_only_call_changed(train, copy / "train.py", site[1], "DataLoader",
                                 {"num_workers": "2", "persistent_workers": "True"})
        text = (copy / "train.py").read_text()
        assert "    shuffle=True,\n    num_workers=2,\n    persistent_workers=True,\n)\n" in text
    run = subprocess.run([PYTHON, "train.py"], cwd=copy, capture_output=True, text=True, timeout=50)
    assert run.returncode == 0, run.stderr
    assert "workers 2 persistent True batch (8, 1)" in run.stdout


def test_an_existing_literal_is_replaced_in_place(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        ds = TensorDataset(torch.zeros(4, 1))
        loader = DataLoader(ds, batch_size=2, num_workers=0, pin_memory=False)  # LOADER
    """)
    site = (str(train), line_of(train, "# LOADER"))
    change = code_change({"loader.num_workers": 4, "loader.pin_memory": True},
                         Targets(loader_site=site), root=root, command=[])
    assert "-loader = DataLoader(ds, batch_size=2, num_workers=0, pin_memory=False)  # LOADER" in change.patch
    assert "+loader = DataLoader(ds, batch_size=2, num_workers=4, pin_memory=True)  # LOADER" in change.patch
    assert any("(was num_workers=0)" in e for e in change.edits)
    for copy in apply_patch(root, change, tmp_path).values():
        assert_only_call_changed(train, copy / "train.py", site[1], "DataLoader",
                                 {"num_workers": "4", "pin_memory": "True"})


def test_a_value_from_a_flag_is_not_rewritten_but_stated_as_the_flag(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", """
        import argparse
        from torch.utils.data import DataLoader
        p = argparse.ArgumentParser()
        p.add_argument("--num-workers", type=int, default=0)
        args = p.parse_args()
        loader = DataLoader(range(8), num_workers=args.num_workers)  # LOADER
        other = DataLoader(range(8), num_workers=workers)  # OTHER
    """)
    change = code_change({"loader.num_workers": 4}, Targets(loader_site=(str(train), line_of(train, "# LOADER"))),
                         root=root, command=["python", "train.py"])
    assert change.patch == ""
    assert len(change.notes) == 1
    assert "num_workers comes from args.num_workers" in change.notes[0]
    assert "pass --num-workers 4" in change.notes[0]  # as the script spells the option
    other = code_change({"loader.num_workers": 4}, Targets(loader_site=(str(train), line_of(train, "# OTHER"))),
                        root=root, command=[])
    assert other.patch == "" and "num_workers=workers is computed" in other.notes[0]


def test_optimizer_gets_fused_and_the_patched_script_steps(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", """
        import torch

        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # OPT
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        print("fused", optimizer.defaults["fused"])
    """)
    site = (str(train), line_of(train, "# OPT"))
    change = code_change({"optimizer.impl": "fused"}, Targets(optimizer_site=site, optimizer_class="AdamW"),
                         root=root, command=[])
    assert "+optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # OPT" in change.patch
    for copy in apply_patch(root, change, tmp_path).values():
        assert_only_call_changed(train, copy / "train.py", site[1], "AdamW", {"fused": "True"})
    run = subprocess.run([PYTHON, "train.py"], cwd=copy, capture_output=True, text=True, timeout=50)
    assert run.returncode == 0, run.stderr
    assert "fused True" in run.stdout
    # foreach, no class recorded: any callee named like a torch optimizer
    foreach = code_change({"optimizer.impl": "foreach"}, Targets(optimizer_site=site), root=root, command=[])
    assert "lr=1e-3, foreach=True)" in foreach.patch


def test_two_optimizers_built_on_one_line_each_get_the_kernel_their_class_has(tmp_path):
    """modded-nanogpt's split, written `optimizers = [SGD(matrices), AdamW(others)]`: the trials
    built both fused and measured 1.08x, and best.patch gave fused=True to SGD alone. An RMSprop
    among them has no fused kernel: left as it is, and said."""
    root = tmp_path / "project"
    train = write(root, "train.py", """
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
        a, b = list(model[0].parameters()), list(model[1].parameters())
        optimizers = [torch.optim.SGD(a, lr=0.1, momentum=0.9), torch.optim.AdamW(b, lr=1e-3)]  # OPT
        extra = torch.optim.RMSprop(model.parameters(), lr=0.0)  # RMS
        model(torch.randn(3, 4)).sum().backward()
        for opt in optimizers:
            opt.step()
        print("fused", [o.defaults["fused"] for o in optimizers])
    """)
    line, rms = line_of(train, "# OPT"), line_of(train, "# RMS")
    targets = Targets(optimizer_site=(str(train), line), optimizer_class="SGD",
                      optimizer_build_sites=((str(train), line), (str(train), line), (str(train), rms)),
                      optimizer_build_classes=("SGD", "AdamW", "RMSprop"))
    change = code_change({"optimizer.impl": "fused"}, targets, root=root, command=[])
    assert ("+optimizers = [torch.optim.SGD(a, lr=0.1, momentum=0.9, fused=True), "
            "torch.optim.AdamW(b, lr=1e-3, fused=True)]  # OPT") in change.patch, change.patch
    assert "+extra = torch.optim.RMSprop" not in change.patch
    assert any(f"RMSprop at train.py:{rms} has no fused kernel" in n for n in change.notes), change.notes
    for copy in apply_patch(root, change, tmp_path).values():
        run = subprocess.run([PYTHON, "train.py"], cwd=copy, capture_output=True, text=True, timeout=50)
        assert run.returncode == 0, run.stderr
        assert "fused [True, True]" in run.stdout
    # the targets round-trip through best.yaml
    assert Targets.from_dict(targets.to_dict()) == targets


@pytest.mark.parametrize("impl, other", [("fused", "foreach"), ("foreach", "fused")])
def test_nanogpt_helper_keeps_its_kwargs_and_is_told_where_the_implementation_goes(tmp_path, impl, other):
    """nanoGPT's **extra_args holds fused=True on CUDA only: a keyword added beside it, tuned on
    a CPU, crashed there ('got multiple values' for fused, 'fused and foreach cannot be True
    together' for foreach). The call is left as written and the note says what to add where."""
    root = tmp_path / "project"
    write(root, "train.py", "from model import configure\n")
    model = write(root, "model.py", """
        import torch

        def configure(optim_groups, learning_rate, betas, device_type):
            use_fused = device_type == 'cuda'
            extra_args = dict(fused=True) if use_fused else dict()
            optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas,
                                          **extra_args)  # OPT
            return optimizer
    """)
    site = (str(model), line_of(model, "optim.AdamW"))
    change = code_change({"optimizer.impl": impl}, Targets(optimizer_site=site, optimizer_class="AdamW"),
                         root=root, command=[])
    assert "model.py" not in change.patch
    assert (f"optimizer.impl: the AdamW call at model.py:{site[1]} takes its keywords from **extra_args; add "
            f"{impl}=True to extra_args where it holds no {other}=True (torch refuses both) (not changed in the "
            "patch)") in change.notes, change.notes


def test_from_pretrained_gets_attn_implementation_in_the_files_quotes(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", """
        from transformers import GPT2LMHeadModel
        path = './checkpoints/gpt2'
        model = GPT2LMHeadModel.from_pretrained(path)  # HF
    """)
    site = (str(train), line_of(train, "# HF"))
    change = code_change({"hf.attn_implementation": "sdpa"}, Targets(from_pretrained_site=site), root=root,
                         command=[])
    assert "+model = GPT2LMHeadModel.from_pretrained(path, attn_implementation='sdpa')  # HF" in change.patch
    for copy in apply_patch(root, change, tmp_path).values():
        assert_only_call_changed(train, copy / "train.py", site[1], "from_pretrained",
                                 {"attn_implementation": "'sdpa'"})


def test_several_files_one_patch_and_a_file_without_final_newline(tmp_path):
    root = tmp_path / "project"
    data = write(root, "pkg/data.py", """
        from torch.utils.data import DataLoader
        def make(ds):
            return DataLoader(ds,
                              batch_size=4,
                              shuffle=True)""", newline_at_end=False)
    train = write(root, "train.py", """
        import torch
        from pkg.data import make
        net = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(
            net.parameters(),
            lr=0.1,  # tuned
        )
    """)
    targets = Targets(script=str(train), loader_site=(str(data), 3),  # the line the call starts on
                      optimizer_site=(str(train), line_of(train, "lr=0.1")))  # a line inside the call
    change = code_change({"loader.num_workers": 2, "optimizer.impl": "foreach"}, targets, root=root, command=[])
    assert change.notes == []
    assert change.patch.count("--- a/") == 2 and "--- a/pkg/data.py" in change.patch
    assert "\\ No newline at end of file" in change.patch
    for copy in apply_patch(root, change, tmp_path).values():
        patched = (copy / "pkg/data.py").read_text()
        assert not patched.endswith("\n")
        assert patched.endswith("                      shuffle=True,\n                      num_workers=2)")
        assert_only_call_changed(data, copy / "pkg/data.py", 3, "DataLoader", {"num_workers": "2"})
        assert_only_call_changed(train, copy / "train.py", targets.optimizer_site[1], "SGD",
                                 {"foreach": "True"})
        assert "    lr=0.1,  # tuned\n    foreach=True,\n)" in (copy / "train.py").read_text()


def test_what_cannot_be_placed_is_a_note_never_a_diff(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", """
        from torch.utils.data import DataLoader
        x = 1
        loader = DataLoader(range(4), **loader_kwargs)
        plain = DataLoader(range(4), batch_size=2)
    """)
    outside = write(tmp_path / "site-packages" / "lib", "lib.py", "from torch.utils.data import DataLoader\n"
                                                                   "loader = DataLoader(range(4))\n")
    cases = {
        (str(root / "gone.py"), 1): "does not exist",
        (str(outside), 2): "outside your project",
        (str(train), 2): "the DataLoader call at train.py:2 was not found (file changed since the run?)",
        (str(train), 3): "takes its keywords from **loader_kwargs",
    }
    for site, expected in cases.items():
        change = code_change({"loader.num_workers": 4}, Targets(loader_site=site), root=root, command=[])
        assert change.patch == "", site
        assert len(change.notes) == 1 and expected in change.notes[0], (site, change.notes)
        assert change.notes[0].startswith("loader.num_workers: ")
    # persistent workers without any: DataLoader would raise, so it is a note
    change = code_change({"loader.persistent_workers": True}, Targets(loader_site=(str(train), 4)), root=root,
                         command=[])
    assert change.patch == "" and "needs num_workers > 0" in change.notes[0]
    # no site recorded, unknown keys, what-ifs: notes, never an exception
    change = code_change({"loader.num_workers": 4, "no.such": 1, "whatif.log_every": 10}, Targets(), root=root,
                         command=[])
    assert change.patch == "" and len(change.notes) == 3
    assert any("whatif.log_every=10" in n and "every 10 steps" in n for n in change.notes)
    assert any(n.startswith("no.such=1:") for n in change.notes)


TRAIN_LOOP = """
    '''A training script.'''
    from __future__ import annotations

    import torch
    from torch import (
        nn,
    )

    net = nn.Conv2d(3, 4, 3)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)  # OPT
    for epoch in range(2):
        for images, target in [(torch.randn(2, 3, 8, 8), torch.randn(2, 4, 6, 6))]:
            output = net(images)  # CALL
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


def test_autocast_snippet_wraps_the_users_own_forward_and_loss_lines(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", TRAIN_LOOP)
    call = line_of(train, "# CALL")
    targets = Targets(script=str(train), model_call_site=(str(train), call),
                      optimizer_site=(str(train), line_of(train, "# OPT")))
    change = code_change({"precision": "bf16"}, targets, root=root, command=[], device="cuda:0")
    [snippet] = change.snippets
    assert isinstance(snippet, Snippet)
    assert (snippet.setting, snippet.file, snippet.line, snippet.where) == ("precision", "train.py", call, "around")
    assert snippet.code == ('with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
                            "    output = net(images)  # CALL\n"
                            "    loss = criterion(output, target)")
    fp16 = code_change({"precision": "fp16"}, targets, root=root, command=[]).snippets[0]
    assert 'device_type="cpu", dtype=torch.float16' in fp16.code
    assert 'torch.amp.GradScaler("cpu")' in fp16.code and "scaler.scale(loss).backward()" in fp16.code
    assert "scaler.step(optimizer)" in fp16.code and "scaler.update()" in fp16.code
    md = change.markdown()
    # bf16 is the whole change: best.patch wraps the two lines itself
    assert f"precision: train.py:{call}: lines {call}-{call + 1} wrapped in `with torch.autocast(" in md
    assert ("-        output = net(images)  # CALL\n-        loss = criterion(output, target)\n"
            '+        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
            "+            output = net(images)  # CALL\n+            loss = criterion(output, target)\n"
            "         optimizer.zero_grad()\n") in change.patch
    assert "## Code to add" not in md
    # fp16 needs a GradScaler as well: not a wrap alone, so a snippet to place by hand
    fp16_change = code_change({"precision": "fp16"}, targets, root=root, command=[])
    assert fp16_change.patch == "" and "### precision: around train.py:" in fp16_change.markdown()
    ast.parse(snippet.code)


def test_autocast_wraps_only_what_applies_as_written(tmp_path):
    root = tmp_path / "project"
    # the script already autocasts there: change its dtype instead; no patch
    train = write(root, "train.py", TRAIN_LOOP)
    targets = Targets(script=str(train), model_call_site=(str(train), line_of(train, "# CALL")), autocast="float16")
    assert code_change({"precision": "bf16"}, targets, root=root, command=[]).patch == ""
    # torch imported under another name, or a string spanning lines inside the wrapped lines
    for text in (TRAIN_LOOP.replace("import torch\n", "import torch as T\n", 1).replace("torch.", "T."),
                 TRAIN_LOOP.replace("output = net(images)  # CALL", 'output = net(images); note = """a\n        b"""  # CALL')):
        train = write(root, "train.py", text)
        targets = Targets(script=str(train), model_call_site=(str(train), line_of(train, "# CALL")))
        change = code_change({"precision": "bf16"}, targets, root=root, command=[])
        assert change.patch == "" and "### precision: around" in change.markdown(), text


def test_compile_and_channels_last_use_the_called_variable(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", TRAIN_LOOP)
    call, opt = line_of(train, "# CALL"), line_of(train, "# OPT")
    targets = Targets(script=str(train), model_call_site=(str(train), call), optimizer_site=(str(train), opt))
    change = code_change({"compile": "reduce-overhead", "channels_last": True}, targets, root=root, command=[])
    compile_, model_cl, input_cl = change.snippets
    assert (compile_.code, compile_.line, compile_.where) == ('net.compile(mode="reduce-overhead")', opt, "before")
    assert model_cl.code == "net = net.to(memory_format=torch.channels_last)" and model_cl.line == opt
    assert input_cl.code == "images = images.to(memory_format=torch.channels_last)" and input_cl.line == call
    # the model called inside the loss call; no optimizer recorded: before the training loop
    nested = write(root, "nested.py", """
        import torch
        model_a = torch.nn.Linear(2, 1)
        for step in range(3):
            loss = torch.nn.functional.mse_loss(model_a(torch.randn(4, 2)), torch.zeros(4, 1))  # CALL
    """)
    change = code_change({"compile": "default"}, Targets(model_call_site=(str(nested), line_of(nested, "# CALL"))),
                         root=root, command=[])
    [snippet] = change.snippets
    assert (snippet.code, snippet.where, snippet.line) == ("model_a.compile()", "before", line_of(nested, "for step"))


def test_runtime_snippets_go_after_the_imports(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", TRAIN_LOOP)
    change = code_change({"threads": 4, "cuda.tf32": True, "cuda.cudnn_benchmark": True, "cuda.tf32x": 1},
                         Targets(script=str(train)), root=root, command=[])
    after = line_of(train, "nn,") + 1  # the closing line of the parenthesized import
    assert [(s.setting, s.line, s.where) for s in change.snippets] == [
        ("threads", after, "after"), ("cuda.tf32", after, "after"), ("cuda.cudnn_benchmark", after, "after")]
    assert change.snippets[0].code == "torch.set_num_threads(4)"
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in change.snippets[1].code
    assert change.snippets[2].code == "torch.backends.cudnn.benchmark = True"
    assert len(change.notes) == 1 and "cuda.tf32x" in change.notes[0]


def test_a_stale_model_call_site_is_a_note(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", "import torch\n")
    change = code_change({"precision": "bf16", "compile": "default"},
                         Targets(model_call_site=(str(train), 40)), root=root, command=[])
    assert change.snippets == [] and len(change.notes) == 2
    assert all("train.py:40 was not found (file changed since the run?)" in n for n in change.notes)


def test_script_flags_and_command_with_flags(tmp_path):
    change = code_change({"args.--workers": 4, "args.--eval_interval": 250, "args.--compile=": True},
                         Targets(), root=tmp_path, command=["python", "train.py", "--workers=2", "--compile=False",
                                                            "--lr", "3e-4"])
    assert change.flags == ["--workers=4", "--eval_interval 250", "--compile=True"]
    assert change.command == ["python", "train.py", "--workers=4", "--compile=True", "--lr", "3e-4",
                              "--eval_interval", "250"]
    styled = code_change({"args.--fast": True, "args.--slow": False}, Targets(), root=tmp_path,
                         command=["python", "train.py", "--slow"], flag_styles={"--fast": "bare", "--slow": "bare"})
    assert styled.flags == ["--fast"] and styled.command == ["python", "train.py", "--fast"]
    assert any("leave --slow out" in n for n in styled.notes)
    md = change.markdown()
    assert "python train.py --workers=4 --compile=True --lr 3e-4 --eval_interval 250" in md

    cmd = ["python", "train.py", "--workers", "2", "--lr", "-1e-3", "--bare", "--x=1"]
    assert command_with_flags(cmd, ["--workers 4"]) == ["python", "train.py", "--workers", "4", "--lr", "-1e-3",
                                                        "--bare", "--x=1"]
    assert command_with_flags(cmd, ["--x 5", "--lr=1e-3"]) == ["python", "train.py", "--workers", "2",
                                                               "--lr=1e-3", "--bare", "--x", "5"]
    assert command_with_flags(cmd, ["--bare", "--new 1"]) == cmd + ["--new", "1"]
    assert command_with_flags(["python", "t.py", "--w", "1", "--w=2"], ["--w 3"]) == ["python", "t.py", "--w", "3"]


def test_write_puts_only_the_markdown_when_there_is_no_patch(tmp_path):
    change = code_change({"whatif.no_gc": True}, Targets(), root=tmp_path, command=[])
    written = change.write(tmp_path / "out")
    assert written == [tmp_path / "out" / "code_change.md"]
    text = written[0].read_text()
    assert "gc.collect()" in text and "## Notes" in text
    assert CodeChange().markdown().rstrip().endswith("Nothing to change: no setting won over the script as it is.")


def test_crlf_and_byte_order_mark_files_keep_their_bytes(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_bytes(b"from torch.utils.data import DataLoader\r\nloader = DataLoader(\r\n"
                                    b"    range(4),\r\n    batch_size=2,\r\n)\r\n")
    (root / "opt.py").write_bytes(b"\xef\xbb\xbfimport torch\nopt = torch.optim.SGD(params, lr=0.1)\n")
    targets = Targets(loader_site=(str(root / "train.py"), 2), optimizer_site=(str(root / "opt.py"), 2))
    change = code_change({"loader.num_workers": 2, "optimizer.impl": "fused"}, targets, root=root, command=[])
    assert change.notes == []
    for copy in apply_patch(root, change, tmp_path).values():
        assert (copy / "train.py").read_bytes() == (b"from torch.utils.data import DataLoader\r\nloader = DataLoader("
                                                    b"\r\n    range(4),\r\n    batch_size=2,\r\n    num_workers=2,"
                                                    b"\r\n)\r\n")
        assert (copy / "opt.py").read_bytes() == (b"\xef\xbb\xbfimport torch\n"
                                                  b"opt = torch.optim.SGD(params, lr=0.1, fused=True)\n")


def test_a_lone_generator_argument_gets_its_parentheses(tmp_path):
    from trainspeed.patches.keyword_edit import Edit, edit_calls

    new, [outcome] = edit_calls("x = Adam(p for p in ps)\n", [Edit("optimizer.impl", 1, ("Adam",), "fused", True)])
    assert outcome.status == "set" and new == "x = Adam((p for p in ps), fused=True)\n"


def test_sites_recorded_at_run_time_find_their_multi_line_calls(tmp_path):
    """The doctor records the caller frame's line while DataLoader.__init__ / AdamW.__init__ runs:
    for a multi-line call CPython reports its first line or its callee's line; both are found."""
    import runpy

    import torch
    from torch.utils.data import DataLoader

    root = tmp_path / "project"
    train = write(root, "train.py", """
        import torch
        from torch.utils.data import DataLoader

        a = DataLoader(
            range(4),
            batch_size=2,
        )
        b = torch.utils.data.DataLoader(range(4),
                                        batch_size=2)
        c = (
            torch.utils.data
            .DataLoader(range(4), batch_size=2)
        )
        d = [DataLoader(range(4), batch_size=1), DataLoader(range(5), batch_size=1)]

        def configure(params, betas):
            return torch.optim.AdamW(
                params, lr=1e-3,
                betas=betas)

        opt = configure(torch.nn.Linear(2, 2).parameters(), (0.9, 0.95))
    """)
    recorded: list[tuple[str, int]] = []

    def recording(original):
        def __init__(self, *args, **kwargs):
            frame = sys._getframe(1)
            recorded.append((frame.f_code.co_filename, frame.f_lineno))
            original(self, *args, **kwargs)
        return __init__

    loader_init, adamw_init = DataLoader.__init__, torch.optim.AdamW.__init__
    DataLoader.__init__ = recording(loader_init)
    torch.optim.AdamW.__init__ = recording(adamw_init)
    try:
        runpy.run_path(str(train), run_name="__main__")
    finally:
        DataLoader.__init__, torch.optim.AdamW.__init__ = loader_init, adamw_init
    *loaders, optimizer = recorded
    # two calls on one line are one site: the first is taken (a line number cannot tell them apart)
    assert len(loaders) == 5 and loaders[3] == loaders[4]
    assert all(path == str(train) for path, _ in recorded)
    expected = ["    batch_size=2,\n+    num_workers=3,\n )",
                "batch_size=2,\n+" + " " * 32 + "num_workers=3)",
                ".DataLoader(range(4), batch_size=2, num_workers=3)",
                "+d = [DataLoader(range(4), batch_size=1, num_workers=3), DataLoader(range(5), batch_size=1)]"]
    for site, text in zip(loaders, expected):
        change = code_change({"loader.num_workers": 3}, Targets(loader_site=site), root=root, command=[])
        assert change.notes == [] and text in change.patch, (site, change.patch)
        assert change.patch.count("num_workers=3") == 1
    change = code_change({"optimizer.impl": "fused"}, Targets(optimizer_site=optimizer, optimizer_class="AdamW"),
                         root=root, command=[])
    assert "         params, lr=1e-3,\n-        betas=betas)\n+        betas=betas,\n+        fused=True)\n" in change.patch


def test_whole_statement_snippets_go_into_the_patch_with_the_keyword_edits_below_them(tmp_path):
    """compile and threads are lines to insert (indented as the statement they precede), and a
    bf16 autocast wraps the forward and loss lines, so best.patch carries them next to the
    keyword edit at the optimizer line they push down; the patched script runs."""
    root = tmp_path / "project"
    train = write(root, "train.py", """
        import torch
        from torch import nn


        def main():
            net = nn.Conv2d(3, 4, 3)
            criterion = nn.MSELoss()
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)  # OPT
            for images, target in [(torch.randn(2, 3, 8, 8), torch.randn(2, 4, 6, 6))]:
                output = net(images)  # CALL
                loss = criterion(output, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        main()
    """)
    call, opt = line_of(train, "# CALL"), line_of(train, "# OPT")
    targets = Targets(script=str(train), model_call_site=(str(train), call), optimizer_site=(str(train), opt),
                      optimizer_class="SGD")
    change = code_change({"compile": "default", "threads": 1, "optimizer.impl": "foreach", "precision": "bf16"},
                         targets, root=root, command=[])
    assert [s.setting for s in change.inserted] == ["compile", "threads", "precision"]
    assert "+    net.compile()\n" in change.patch and "+torch.set_num_threads(1)\n" in change.patch
    assert "foreach=True" in change.patch
    md = change.markdown()
    assert "## Code to add" not in md and "### compile" not in md
    assert f"compile: train.py:{opt}: `net.compile()` inserted before line {opt}" in change.edits
    for copy in apply_patch(root, change, tmp_path).values():
        lines = (copy / "train.py").read_text().splitlines()
        at = next(i for i, text in enumerate(lines) if "# OPT" in text)
        assert lines[at - 1] == "    net.compile()"
        assert "foreach=True" in lines[at]
        assert "torch.set_num_threads(1)" in lines
        wrap = lines.index('        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):')
        assert lines[wrap + 1:wrap + 3] == ["            output = net(images)  # CALL",
                                            "            loss = criterion(output, target)"]
        assert lines[wrap + 3] == "        optimizer.zero_grad()"  # the backward stays outside
    # the lines run as placed; compiling itself is torch's business (and 10 s of CI time)
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1"}
    subprocess.run([PYTHON, str(copy / "train.py")], check=True, timeout=120, capture_output=True, env=env)


def test_a_script_that_already_compiles_gets_no_second_compile_line(tmp_path):
    root = tmp_path / "project"
    train = write(root, "train.py", TRAIN_LOOP)
    targets = Targets(script=str(train), model_call_site=(str(train), line_of(train, "# CALL")),
                      optimizer_site=(str(train), line_of(train, "# OPT")), compiled=True)
    change = code_change({"compile": "max-autotune"}, targets, root=root, command=[])
    assert change.patch == "" and change.inserted == [] and "already compiles" in change.snippets[0].why


LIGHTNING_SCRIPT = """
    import torch
    import torch.nn.functional as F

    import lightning as L


    class LanguageModel(L.LightningModule):
        def training_step(self, batch, batch_idx):
            input, target = batch
            output = self.model(input, target)  # CALL
            loss = F.nll_loss(output, target.view(-1))
            return loss


    def main():
        trainer = L.Trainer(gradient_clip_val=0.25, max_epochs=20)  # TRAINER
        trainer.fit(LanguageModel())
"""


def test_a_lightning_or_fabric_script_gets_precision_at_its_constructor(tmp_path):
    # Lightning's own examples/pytorch/basics/transformer.py: the idiomatic change, which also
    # brings fp16's loss scaling, is one keyword at L.Trainer(...), not an autocast block
    root = tmp_path / "project"
    train = write(root, "transformer.py", LIGHTNING_SCRIPT)
    targets = Targets(script=str(train), model_call_site=(str(train), line_of(train, "# CALL")), framework="lightning")
    change = code_change({"precision": "bf16"}, targets, root=root, command=[])
    assert change.snippets == [] and change.edits == [
        f'precision: transformer.py:{line_of(train, "# TRAINER")}: `precision="bf16-mixed"`']
    assert '+    trainer = L.Trainer(gradient_clip_val=0.25, max_epochs=20, precision="bf16-mixed")  # TRAINER' \
        in change.patch
    fabric = write(root, "fabric_train.py", LIGHTNING_SCRIPT.replace("L.Trainer(gradient_clip_val=0.25, max_epochs=20)",
                                                                     "L.Fabric(precision='32-true')"))
    targets = Targets(script=str(fabric), model_call_site=(str(fabric), line_of(fabric, "# CALL")),
                      framework="lightning_fabric")
    change = code_change({"precision": "fp16"}, targets, root=root, command=[])
    assert "+    trainer = L.Fabric(precision='16-mixed')  # TRAINER" in change.patch
    assert any("scale the loss for fp16" in n for n in change.notes)
    for copy in apply_patch(root, change, tmp_path).values():
        ast.parse((copy / "fabric_train.py").read_text())
    # two constructors (which one trains is not known), or a plain loop: the autocast block
    two = write(root, "two.py", LIGHTNING_SCRIPT + "    L.Trainer(max_epochs=1)\n")
    targets = Targets(script=str(two), model_call_site=(str(two), line_of(two, "# CALL")), framework="lightning")
    assert "torch.autocast" in code_change({"precision": "bf16"}, targets, root=root, command=[]).patch
    targets = Targets(script=str(train), model_call_site=(str(train), line_of(train, "# CALL")))
    assert "torch.autocast" in code_change({"precision": "bf16"}, targets, root=root, command=[]).patch


PERCEPTUAL_LOOP = """
import torch
from torch import nn

net, features = nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 4, 3).requires_grad_(False)
mse = nn.MSELoss()
optimizer = torch.optim.Adam(net.parameters())  # OPT
gram_style = [torch.randn(4, 4)]
for x in [torch.randn(2, 3, 8, 8)] * 3:
    optimizer.zero_grad()
    y = net(x)  # CALL
    y = y - y.mean()
    features_y, features_x = features(y), features(x)
    content_loss = mse(features_y, features_x)
    style_loss = 0.
    for ft_y, gm_s in zip([features_y.flatten(2).mean(2)], gram_style):
        style_loss += mse(ft_y.t() @ ft_y, gm_s)
    style_loss *= 0.5
    total_loss = content_loss + style_loss
    accuracy = (features_y > 0).float().mean()
    total_loss.backward()
    optimizer.step()
print("trained", float(total_loss))
"""


@pytest.mark.skipif(not HAS_GIT, reason="git apply checks the patch")
def test_the_autocast_block_takes_the_loss_built_after_the_first_one_up_to_the_backward(tmp_path):
    """pytorch/examples' fast_neural_style: a content loss, then a style loss in a loop, then
    their sum. The block stopped at the first loss and left the style loss to run on bf16
    features outside it; it now takes what goes on building the loss, and stops at the first
    statement that does not (the accuracy here), before the backward."""
    root = tmp_path / "project"
    train = write(root, "train.py", PERCEPTUAL_LOOP)
    call = line_of(train, "# CALL")
    targets = Targets(script=str(train), model_call_site=(str(train), call),
                      optimizer_site=(str(train), line_of(train, "# OPT")))
    change = code_change({"precision": "bf16"}, targets, root=root, command=[])
    [snippet] = change.snippets
    assert (snippet.line, snippet.end_line, snippet.patchable) == (call, line_of(train, "total_loss = "), True)
    change.write(tmp_path / "out")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "apply", str(tmp_path / "out" / "best.patch")], cwd=root, check=True)
    patched = (root / "train.py").read_text()
    assert "        style_loss += mse(ft_y.t() @ ft_y, gm_s)\n" in patched  # the loop, indented into the block
    assert "\n    accuracy = (features_y > 0)" in patched  # outside it
    ran = subprocess.run([PYTHON, "train.py"], cwd=root, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and "trained" in ran.stdout, ran.stderr
