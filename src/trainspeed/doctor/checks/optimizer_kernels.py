"""optimizer_not_fused: optimizers that could run a fused kernel, or a multi-tensor (foreach)
step, in place of their per-parameter loop.

On the CPU torch picks foreach by default only for CUDA tensors, so an optimizer left at its
defaults runs the loop there: word_language_model's AdamW (the optimizer 19 % of its CPU step)
got no finding, and the tune measured fused at 1.07-1.18x; the test suite's "healthy" CPU
script ran 1.51x faster with AdamW(fused=True). A loop that steps several optimizers over one
model (SGD for the matrices, AdamW for the rest, as modded-nanogpt and nanochat split them with
Muon) names each: the finding named the first alone, by the list's name (`optimizers`).
"""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, pct
from trainspeed.doctor.findings import Finding
from trainspeed.optim_kernels import FUSED_OPTIMIZERS, kernel_devices

CPU_FUSED_REMOVES = 0.3
CPU_FUSED_BASIS = "~30 % of a per-parameter loop on a CPU, where 0-75 % was measured"
OPTIMIZER_SHARE_NOTICE = 0.05
"""Optimizer step above 5 % of step time makes its implementation worth a look."""


def _kernel(ctx: CheckContext, opt: dict[str, Any]) -> tuple[str, bool, bool] | None:
    """(the implementation to use, runs a loop, a loop forced by foreach=False) of one optimizer,
    or None when it is fused already or takes nothing faster on this device."""
    if opt.get("fused"):
        return None
    takes = opt.get("implementations")
    if takes is None:  # a run recorded before the doctor kept what each constructor takes
        takes = ("fused", "foreach") if opt.get("class") in FUSED_OPTIMIZERS else ()
    on_cpu = ctx.device_type == "cpu"
    forced_loop = opt.get("foreach") is False
    loop = forced_loop or (on_cpu and not opt.get("foreach"))
    # foreach only on CUDA: on the CPU it read 0.92x of the loop (healthy.py's AdamW), fused 1.51x
    impl = ("fused" if "fused" in takes and ctx.device_type in kernel_devices("fused") else
            "foreach" if "foreach" in takes and loop and not on_cpu else None)
    return (impl, loop, forced_loop) if impl else None


def optimizer_not_fused(ctx: CheckContext) -> Finding | None:
    if ctx.device_type not in ("cuda", "cpu"):
        return None
    primary = ctx.primary_optimizer()
    opts = sorted(ctx.obs("optimizer"), key=lambda o: o is not primary)
    slow = [(o, k) for o in opts for k in [_kernel(ctx, o)] if k is not None]
    if not primary or not slow:
        return None
    on_cpu = ctx.device_type == "cpu"
    loop = any(k[1] for _, k in slow)
    forced_loop = any(k[2] for _, k in slow)
    share = ctx.share("optimizer")
    if share < OPTIMIZER_SHARE_NOTICE and not (forced_loop and not on_cpu):
        return None
    # The share a fused kernel removes varies most on the CPU (of the optimizer step: healthy.py's
    # AdamW 73 %, word_language_model's 34-80 %, a small dcgan-style GAN's Adam ~0): a third
    # there, and an info: the tune measures it.
    removes = CPU_FUSED_REMOVES if on_cpu else 0.6 if loop else 0.3
    removed = CPU_FUSED_BASIS if on_cpu else "~60 % of a per-parameter loop" if loop else "~30 % of the foreach path"
    where = " on the CPU (foreach is the default for CUDA only)" if loop and on_cpu and not forced_loop else ""
    impls = sorted({k[0] for _, k in slow})
    what = (ctx.optimizer_label(slow[0][0]) + " runs" if len(slow) == 1 else
            f"{len(slow)} optimizers ({', '.join(ctx.optimizer_label(o) for o, _ in slow)}) run")
    return Finding(
        id="optimizer_not_fused",
        severity="warning" if loop and not on_cpu and share >= OPTIMIZER_SHARE_NOTICE else "info",
        title=f"{what} {'a per-parameter loop' if loop else 'without fused kernels'}",
        evidence=("; ".join(f"{o.get('class')}(fused={o.get('fused')}, foreach={o.get('foreach')}) over "
                            f"{o.get('params')} parameters" for o, _ in slow)
                  + f"{where}; the optimizer step is {pct(share)} of step time"),
        # only what each class takes: RMSprop(fused=True) is a TypeError
        recommendation=(", ".join(f"{o.get('class')}(..., {k[0]}=True)" for o, k in slow)
                        + f" (engine: optim.implementation={impls[0]})"),
        verify_with=ctx.tune_command("fused"),
        advises={"fused_optimizer": "*"},  # a tune that read it as no gain ends the advice (doctor/tuned.py)
        impact=share * removes,
        impact_estimated=True,
        basis=(f"the optimizer step, {pct(share)} of the step measured, x the share a {'/'.join(impls)} step "
               f"removes ({removed}, estimated)"),
    )
