"""Process-wide switches: compute threads on a CPU, TF32, cuDNN autotuning and the caching
allocator's expandable segments on CUDA. Each is set at install and restored on uninstall."""

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


def _allocator_setter():
    """torch's run-time setter of the caching allocator's settings (the same text as
    PYTORCH_CUDA_ALLOC_CONF): torch._C._accelerator_setAllocatorSettings where torch has it
    (torch 2.13 deprecates torch.cuda.memory._set_allocator_settings for it, with a warning),
    else the older one."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    return setter if setter is not None else torch.cuda.memory._set_allocator_settings


def install_expandable_segments(value: bool, ctx: InstallContext) -> None:
    """The CUDA caching allocator's expandable segments: a segment grows by mapping more pages
    instead of a new cudaMalloc of each request's size, so batches whose sizes change step by
    step reuse one segment rather than fragment the cache until the allocator frees it all and
    retries (a device-wide sync). Set at run time, before the script allocates; a trial is a
    fresh process, so no segment made before the setting is left to mix with it."""
    from trainspeed.telemetry.env import alloc_conf, expandable_segments_on

    if not torch.cuda.is_available():
        ctx.note("expandable_segments: no CUDA device, nothing set")
        return
    setter, conf = _allocator_setter(), alloc_conf()
    before = expandable_segments_on(conf)
    setter(f"expandable_segments:{bool(value)}")
    ctx.patches.call_on_undo(lambda: setter(f"expandable_segments:{before}"))
    ctx.note(f"expandable_segments: the CUDA caching allocator's expandable_segments={bool(value)}"
             + (f" (over PYTORCH_CUDA_ALLOC_CONF={conf})" if conf else ""))
