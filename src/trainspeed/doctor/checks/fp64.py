"""A model trained in float64 (`model.double()`): every matmul runs at the device's float64 rate,
half the float32 one on a CPU's SIMD units and 1/2 to 1/64 of it on a GPU, and autocast leaves
float64 ops as they are, so the usual precision advice (bf16 autocast) does nothing until the
model is float32. pytorch/examples' time_sequence_prediction trains its LSTM in float64, and the
doctor reported it as "fp32" and advised bf16 autocast."""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.doctor.findings import Finding

SIMD_FP64_SHARE = 0.5
"""A CPU's vector units hold twice as many float32 lanes as float64 ones (AVX2, AVX-512, NEON):
float32 matmuls reach at most twice the float64 rate, so at most half their time is at stake."""


def fp64_model(ctx: CheckContext) -> Finding | None:
    models = [m for m in ctx.models() if m.get("param_dtype") == "float64"]
    if not models:
        return None
    names = ", ".join(dict.fromkeys(str(m.get("class") or "the model") for m in models))
    impact, estimated, basis = _stake(ctx)
    return Finding(
        id="fp64_model",
        severity="warning",
        title="The model trains in float64",
        evidence=(f"{names}: parameters float64 on {ctx.device_type}; forward + backward take "
                  f"{pct(ctx.share('forward') + ctx.share('backward'))} of the step; autocast leaves float64 "
                  "ops as they are, so bf16/fp16 autocast would change nothing"),
        recommendation=("unless the numerics need float64, train in float32: `.float()` in place of `.double()` "
                        "on the model, float32 tensors built in its forward (dtype=torch.float32), and float32 "
                        "inputs (`torch.from_numpy(a).float()`); then TF32 on a GPU "
                        "(`torch.set_float32_matmul_precision('high')`), and bf16 autocast can follow"),
        verify_with=f"{ctx.doctor_command()} (after the change: the step time should drop)",
        impact=impact,
        impact_estimated=estimated,
        basis=basis,
    )


def _stake(ctx: CheckContext) -> tuple[float, bool, str]:
    """(share at stake, estimated, basis): forward + backward x (1 - fp64 / tf32 peak), the peaks
    from the datasheet table on a GPU; on a CPU the SIMD lanes' 2:1 (an upper bound)."""
    from trainspeed.telemetry.peaks import lookup_peak

    compute = ctx.share("forward") + ctx.share("backward")
    if ctx.device_type != "cuda":
        return compute * SIMD_FP64_SHARE, True, (
            f"forward + backward, {pct(compute)} of the step, x 1/2: float32 fills twice the SIMD lanes of "
            "float64 (an upper bound: small matmuls gain less)")
    device: dict[str, Any] = ctx.first("device") or {}
    name = str(device.get("name") or "")
    # float32 opens TF32 (one line: set_float32_matmul_precision('high')): on an H100 FP64's
    # tensor cores match plain FP32's 67 TFLOP/s, and the gain is TF32's (pre-Ampere rows: = fp32)
    slow, fast = lookup_peak(name, "fp64"), lookup_peak(name, "tf32")
    if slow is None or fast is None or fast.flops <= 0:
        return 0.0, False, (f"the fp64/tf32 peak ratio of {name or 'this GPU'} is not in the peak table: "
                            "nothing derived; the doctor's step time after the change measures it")
    ratio = slow.flops / fast.flops
    return compute * (1.0 - ratio), True, (
        f"forward + backward, {pct(compute)} of the step, an upper bound on the matmuls' share, x (1 - fp64/"
        f"tf32 peak {ratio:.2f} on {slow.name})")


CHECKS = (fp64_model,)
