"""End-to-end CUDA paths, run with `pytest -m gpu` when a GPU is lent (skipped without one):
the Monitor's CUDA-event timeline, the Trainer in bf16 with its device prefetcher, and tune
trials forked from the fork server using CUDA (a CUDA context does not survive a fork, so the
server must never have created one)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TINY_GPT_CUDA = ("recipe: {name: gpt, options: {size: tiny, block_size: 64}}\n"
                 "run: {max_steps: 6, max_epochs: null, device: cuda}\ndata: {batch_size: 4}\n"
                 "precision: {mode: bf16-mixed}\n"
                 "logging: {every: 2, progress: false, warmup_steps: 1}\n"
                 "eval: {at_end: false}\ncheckpoint: {save_final: false}\n")


def test_monitor_times_cuda_phases_with_events_and_reads_losses_back(tmp_path):
    from trainspeed.telemetry import read_run
    from trainspeed.telemetry.monitor import Monitor

    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    batches = [torch.randn(256, 1024, device="cuda") for _ in range(4)]
    with Monitor(tmp_path / "run", device=torch.device("cuda"), log_every=5, warmup_steps=1) as mon:
        for i, x in enumerate(mon.loader(batches * 5)):
            with mon.phase("forward"):
                loss = model(x).square().mean()
            with mon.phase("backward"):
                loss.backward()
            with mon.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            mon.step(samples=x.shape[0], loss=loss)  # a CUDA tensor: no sync here
    run = read_run(tmp_path / "run")
    assert len(run.steps) == 20
    for rec in run.steps[2:]:
        phases = rec["phases"]
        assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0
        # CUDA events bracket the phases: their sum is the step, up to clock granularity
        assert sum(phases.values()) == pytest.approx(rec["t_step"], rel=0.05, abs=1e-4)
        assert math.isfinite(rec["loss"])


def test_trainer_bf16_on_cuda_trains_and_reports_mfu(tmp_path):
    from trainspeed.engine.from_recipe import build_trainer, load_target

    (tmp_path / "c.yaml").write_text(TINY_GPT_CUDA.replace("max_steps: 6", "max_steps: 20"))
    cfg = load_target(str(tmp_path / "c.yaml"), [f"run.out_dir={tmp_path}", "run.name=r",
                                                 "data.device_prefetch=true", "data.pin_memory=true"])
    summary = build_trainer(cfg).fit()
    assert summary["device"].startswith("cuda") and summary["precision"] == "bf16-mixed"
    assert summary["loss"]["last"] < summary["loss"]["first"]
    mfu = summary["mfu"]
    assert mfu["valid"] and 0 < mfu["value"] <= 1, mfu


def test_forked_tune_trials_can_use_cuda(tmp_path):
    from trainspeed.tune import forkserver
    from trainspeed.tune.trials import SubprocessRunner, TrialRequest

    if not forkserver.available():
        pytest.skip("fork servers need Linux")
    base = tmp_path / "base.yaml"
    base.write_text(TINY_GPT_CUDA)
    runner = SubprocessRunner(base_config=base, out_dir=tmp_path / "trials", timeout_s=240)
    try:
        res = runner(TrialRequest(key="b", label="baseline", overrides=(), repeat=0))
        assert runner._server is not None, "the fork server refused to start"
    finally:
        runner.close()
    assert res.ok, res.error
    assert res.memory_peak and res.memory_peak > 0  # CUDA allocated peak, read in the child


def test_the_expandable_segments_setting_reaches_cudas_allocator(tmp_path):
    """The tune's expandable_segments trial sets the allocator at run time (patches/runtime.py):
    in a fresh process, the segments made after the install are expandable, and those after the
    uninstall are not."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from trainspeed.patches.settings import install_settings\n"
        "def expandable():\n"
        "    segs = torch.cuda.memory._snapshot()['segments']\n"
        "    return sorted({bool(s.get('is_expandable')) for s in segs})\n"
        "applied = install_settings({'cuda.expandable_segments': True}, say=lambda _: None)\n"
        "a = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\n"
        "print('on', expandable())\n"
        "applied.uninstall()\n"
        "del a; torch.cuda.empty_cache()\n"
        "b = torch.empty(64 << 20, dtype=torch.uint8, device='cuda')\n"
        "print('off', expandable())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    on, off = (line for line in out.stdout.splitlines() if line.startswith(("on ", "off ")))
    # after the uninstall a new segment is a plain one (an emptied expandable one may still be listed)
    assert on == "on [True]" and "False" in off, out.stdout
