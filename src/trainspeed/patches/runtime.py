"""Process-wide switches: compute threads on a CPU, TF32 and cuDNN autotuning on CUDA. Each
is set at install and restored on uninstall."""

from __future__ import annotations

import torch

from trainspeed.patches.context import InstallContext


def install_threads(value: int, ctx: InstallContext) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(value)
    ctx.patches.call_on_undo(lambda: torch.set_num_threads(before))
    original = torch.set_num_threads

    def set_num_threads(n: int) -> None:
        ctx.note(f"threads: the script set torch.set_num_threads({n}), which overrides threads={value}")
        original(n)

    ctx.patches.setattr(torch, "set_num_threads", set_num_threads)
    ctx.note(f"threads: torch.set_num_threads({value})")


def install_tf32(value: bool, ctx: InstallContext) -> None:
    ctx.patches.setattr(torch.backends.cuda.matmul, "allow_tf32", value)
    ctx.patches.setattr(torch.backends.cudnn, "allow_tf32", value)
    ctx.note(f"tf32: matmul and cuDNN allow_tf32={value}")


def install_cudnn_benchmark(value: bool, ctx: InstallContext) -> None:
    ctx.patches.setattr(torch.backends.cudnn, "benchmark", value)
    ctx.note(f"cudnn_benchmark: torch.backends.cudnn.benchmark={value}")
