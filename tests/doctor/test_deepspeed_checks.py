"""DeepSpeed findings on hand-built observations (no DeepSpeed needed)."""

from __future__ import annotations

import pytest

from trainspeed.doctor.runner import engine_precision_of, matmul_dtype

pytestmark = pytest.mark.timeout(60)

ENGINE = {"kind": "deepspeed", "zero_stage": 2, "bf16": True, "fp16": False, "torch_autocast": False}


def test_the_engine_precision_sets_the_peak_dtype():
    # DeepSpeed's torch_autocast section: fp32 parameters, autocast only inside the engine
    autocast = {"kind": "deepspeed", "bf16": False, "fp16": False, "torch_autocast": True,
                "torch_autocast_dtype": "bfloat16"}
    model = {"kind": "model", "param_dtype": "float32", "autocast": None}
    assert engine_precision_of([model, autocast]) == "bf16-mixed"
    assert matmul_dtype([model, autocast], "cpu") == "bf16"
    assert matmul_dtype([model, dict(autocast, torch_autocast_dtype="float16")], "cpu") == "fp16"
    assert engine_precision_of([ENGINE]) == "bf16" and matmul_dtype([ENGINE], "cpu") == "bf16"
    fp32 = dict(autocast, torch_autocast=False)
    assert engine_precision_of([fp32]) is None and matmul_dtype([model, fp32], "cpu") == "fp32"
    assert engine_precision_of([model]) is None
