"""Misdiagnoses found by benchmarks/doctor_truth.py (issue 25, "a doctor you can trust on a busy
machine"), each pinned by a small run or by numbers."""
from __future__ import annotations

import textwrap

import pytest

from doctor_helpers import ids, script_findings

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path, monkeypatch, body: str, steps: int):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    return run_doctor(DoctorConfig(command=["python", str(script)], steps=steps, out=tmp_path / "run",
                                   system_sampler=False))


MANUAL_SGD = """
    import gc
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    setup_read = x.sum().item()  # setup: not a training-loop sync
    total = 0.0
    for step in range(100):
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.01)
        total += loss.item()  # a read every step
        {extra}
"""


def test_syncs_are_counted_in_a_loop_without_an_optimizer(tmp_path, monkeypatch):
    # word_language_model's loop: no torch.optim, `total_loss += loss.item()` every step. The
    # sync counter waited for the first optimizer step, so such a loop had 0 syncs per step.
    result = _run(tmp_path, monkeypatch, MANUAL_SGD.format(extra=""), steps=20)
    assert (result.stopped, result.steps) == ("steps", 20)
    assert result.summary["syncs_per_step"] == pytest.approx(1.0, abs=0.1)
    finding = script_findings(result.findings)[0]  # a CPU's info, below a busy machine's warning
    assert finding["id"] == "host_syncs", result.findings
    line = next(n for n, text in enumerate(textwrap.dedent(MANUAL_SGD).splitlines(), start=1) if "total +=" in text)
    assert f"train.py:{line}" in finding["evidence"] and finding["severity"] == "info"  # a CPU run


def test_gc_in_a_loop_without_an_optimizer_is_found(tmp_path, monkeypatch):
    # 8 steps: each gc.collect() walks the whole test session's heap (~0.7 s late in a full run);
    # the check counts calls per step, which 8 steps show as well as 20
    result = _run(tmp_path, monkeypatch, MANUAL_SGD.format(extra="gc.collect()"), steps=8)
    assert "cache_gc_in_loop" in ids(result), result.findings
