"""The CUDA allocator's expandable segments, end to end on the CPU: the doctor's memory_near_oom
names the tune that measures them (unless the run already has them), the script knob offers them
only on CUDA where memory was near the limit, the trial sets them through torch's run-time setter
and undoes it, and best.patch puts the environment variable above the script's imports, where
CUDA's allocator has not started yet (on an H100, memory_limit.py's retries were 25 % of its
mean step: p50 5.2 ms against a 6.5 ms mean)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
import torch

from trainspeed.doctor.checks import hardware
from trainspeed.patches import runtime
from trainspeed.patches.code_change import code_change
from trainspeed.patches.settings import install_settings
from trainspeed.patches.targets import Targets
from trainspeed.telemetry.env import alloc_conf, expandable_segments_on
from trainspeed.tune.knobs import Candidate, DeviceInfo, Skip
from trainspeed.tune.script_facts import ScriptFacts
from trainspeed.tune.script_knobs import SCRIPT_KNOBS, ScriptContext

from tests.doctor.test_checks import CUDA_DEVICE, ctx_of, make_run

pytestmark = pytest.mark.timeout(60)


def test_the_allocator_settings_are_read_as_torch_reads_them():
    assert expandable_segments_on("expandable_segments:True")
    assert expandable_segments_on("max_split_size_mb:128, expandable_segments:true")
    assert not expandable_segments_on("expandable_segments:False")
    assert not expandable_segments_on("max_split_size_mb:128") and not expandable_segments_on(None)
    # PYTORCH_ALLOC_CONF first, as torch reads it; the CUDA name where it is unset
    both = {"PYTORCH_ALLOC_CONF": "expandable_segments:False", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert alloc_conf(both) == "expandable_segments:False"
    assert alloc_conf({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == "expandable_segments:True"
    assert alloc_conf({}) is None


def _near_oom(alloc_conf_value=None, command=("python", "train.py", "--batch-size", "64")):
    run = make_run(device="cuda", obs=[CUDA_DEVICE])
    run.env = {"alloc_conf": alloc_conf_value}
    run.config = {"command": list(command)}
    ctx = ctx_of(run)
    ctx.summary["memory"] = {"cuda_alloc_peak": 39.5 * 2**30, "cuda_reserved_peak": 39.8 * 2**30,
                             "cuda_alloc_retries": 12}
    return hardware.memory_pressure(ctx)


def test_memory_near_oom_names_the_tune_of_expandable_segments():
    finding = _near_oom()
    assert finding.id == "memory_near_oom"
    assert finding.verify_with == "trainspeed tune --knobs expandable_segments -- python train.py --batch-size 64"
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in finding.recommendation
    # already on: nothing to measure, and the advice says so instead of repeating the setting
    on = _near_oom("expandable_segments:True")
    assert on.verify_with is None and "already on" in on.recommendation


def _knob(device="cuda", findings=(), on=False):
    facts = ScriptFacts(targets=Targets(model_class="Net"), findings=list(findings), expandable_segments=on)
    info = DeviceInfo(type=device, cores=16, has_compiler=True, cuda_capability=(9, 0) if device == "cuda" else None)
    return SCRIPT_KNOBS["expandable_segments"](ScriptContext(facts=facts, device=info))


def test_the_knob_is_tried_on_cuda_where_memory_was_near_the_limit():
    near = [{"id": "memory_near_oom", "severity": "warning"}]
    [candidate] = _knob(findings=near)
    assert isinstance(candidate, Candidate) and candidate.settings == {"cuda.expandable_segments": True}
    for skip, reason in ((_knob(device="cpu", findings=near), "CUDA only"),
                         (_knob(findings=[{"id": "not_compiled"}]), "no allocator retries"),
                         (_knob(findings=near, on=True), "already has expandable_segments:True")):
        assert isinstance(skip[0], Skip) and reason in skip[0].reason


def test_the_trial_sets_the_allocator_at_run_time_and_undoes_it(monkeypatch):
    calls = []
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "_allocator_setter", lambda: calls.append)
    applied = install_settings({"cuda.expandable_segments": True}, say=lambda _: None)
    assert calls == ["expandable_segments:True"]
    assert any("expandable_segments=True" in n for n in applied.notes)
    applied.uninstall()
    assert calls == ["expandable_segments:True", "expandable_segments:False"]


def test_without_cuda_the_trial_sets_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "_allocator_setter", lambda: pytest.fail("no setter without CUDA"))
    applied = install_settings({"cuda.expandable_segments": True}, say=lambda _: None)
    assert any("no CUDA device" in n for n in applied.notes)
    applied.uninstall()


def test_torchs_setter_is_found():
    # the name this torch has (torch._C's, or the older torch.cuda.memory one): a rename fails here
    setter = runtime._allocator_setter()
    assert callable(setter) and setter in (getattr(torch._C, "_accelerator_setAllocatorSettings", None),
                                           torch.cuda.memory._set_allocator_settings)


SCRIPT = '''\
#!/usr/bin/env python
"""Train."""
from __future__ import annotations

import argparse

import torch

print(torch.__version__)
'''


def test_best_patch_sets_the_variable_above_the_imports(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    train = root / "train.py"
    train.write_text(SCRIPT)
    change = code_change({"cuda.expandable_segments": True}, Targets(script=str(train)), root=root, command=[])
    [snippet] = change.snippets
    assert (snippet.line, snippet.where) == (5, "before")  # `import argparse`, after docstring and __future__
    change.write(tmp_path / "out")
    import subprocess

    subprocess.run(["git", "apply", str(tmp_path / "out" / "best.patch")], cwd=root, check=True)
    text = train.read_text()
    tree = ast.parse(text)
    first = [type(n).__name__ for n in tree.body[:5]]
    assert first == ["Expr", "ImportFrom", "Import", "Expr", "Import"], first
    assert ast.unparse(tree.body[3]) == "os.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')"
    assert text.index("PYTORCH_CUDA_ALLOC_CONF") < text.index("import torch")
    # a script with only statements: the code still goes first
    bare = root / "bare.py"
    bare.write_text(textwrap.dedent("x = 1\n"))
    [only] = code_change({"cuda.expandable_segments": True}, Targets(script=str(bare)), root=root,
                         command=[]).snippets
    assert (only.line, only.where) == (1, "before")
    assert Path(bare).read_text() == "x = 1\n"  # the user's file was only read
