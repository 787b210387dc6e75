"""'fast' means fast on the device it runs on (issue 29): on CUDA a recipe's fast variant takes
its fast-cuda.yaml (bf16, compile, fused AdamW, pinned memory + prefetch, a larger batch); on a
CPU it stays as measured there. Config loading only: no GPU needed."""
from __future__ import annotations

import pytest

from trainspeed.cli import _target

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("recipe", ["gpt", "convnext", "seqvae", "hf"])
def test_fast_variant_on_cuda_is_bf16_fused_pinned(recipe):
    cfg, _ = _target.load(recipe, ["run.device=cuda"], "fast", quiet=True)
    cpu, _ = _target.load(recipe, ["run.device=cpu"], "fast", quiet=True)
    assert cfg.precision.mode == "bf16-mixed" and cfg.optim.implementation == "fused"
    assert cfg.data.pin_memory is True and cfg.data.device_prefetch is True
    assert cfg.data.batch_size > cpu.data.batch_size
    assert not cfg.batch.auto_microbatch  # it refuses several ranks: the fast config must run under torchrun
    # the CPU config is what fast.yaml says, unchanged
    assert cpu.precision.mode == "fp32" and cpu.compile.mode == "off"


def test_gpt_fast_on_cuda_compiles_and_the_command_line_wins():
    cfg, _ = _target.load("gpt", ["run.device=cuda"], "fast", quiet=True)
    assert cfg.compile.mode == "default"
    mine, _ = _target.load("gpt", ["run.device=cuda", "precision.mode=fp32", "data.batch_size=8"], "fast", quiet=True)
    assert mine.precision.mode == "fp32" and mine.data.batch_size == 8
    naive, _ = _target.load("gpt", ["run.device=cuda"], "naive", quiet=True)
    assert naive.precision.mode == "fp32"  # the "before" baseline stays naive
