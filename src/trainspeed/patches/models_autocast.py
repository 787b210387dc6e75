"""precision as code for a loop that trains several models (a GAN's generator and
discriminator): what the tune measured, written into the script.

One autocast block around "the forward and the loss" (autocast_snippet) covers one model's
call. Several models pass their outputs to each other (`netD(netG(noise))`) and to losses
computed outside any block: a bf16 generator output reaching an fp32 discriminator raised
"Input type (CPUBFloat16Type) and weight type (torch.FloatTensor) should be the same", and a
bf16 output reaching BCELoss with an fp32 label "Found dtype Float but expected BFloat16". The
setting's trials run each trained model's forward under autocast with its outputs back in fp32
(patches/model.py, as Accelerate's convert_outputs_to_fp32); the code below does the same,
model by model, where the script builds them.
"""

from __future__ import annotations

from trainspeed.patches.snippets import Snippet, Source, _dotted

HELPER = "autocast_forward"


def models_autocast_snippet(setting: str, value: str, source: Source, classes: tuple[str, ...], shown: str,
                            device: str, optimizer_line: int | None) -> Snippet | None:
    """The helper and one `model.forward = autocast_forward(model.forward)` line per trained
    model, before the optimizer is built (the models exist by then), else after the last model
    is built. None when no model's construction is found in this file."""
    built = {cls: source.assignment_of(cls) for cls in classes}
    names = {cls: _dotted(node.targets[0]) for cls, node in built.items() if node is not None}
    if not names:
        return None
    last_built = max((built[cls].end_lineno or built[cls].lineno) for cls in names)  # type: ignore[union-attr]
    if optimizer_line is not None and optimizer_line > last_built:
        stmt = source.statement(optimizer_line)
        line, where = (stmt.lineno if stmt else optimizer_line), "before"
    else:
        line, where = last_built, "after"
    dtype = "torch.bfloat16" if value == "bf16" else "torch.float16"
    code = "\n".join([
        f"def {HELPER}(forward):  # the forward under autocast, its floating outputs back in fp32",
        "    def run(*args, **kwargs):",
        f'        with torch.autocast(device_type="{device}", dtype={dtype}):',
        "            out = forward(*args, **kwargs)",
        "        return out.float() if torch.is_tensor(out) and out.is_floating_point() else out",
        "    return run",
        "",
        *(f"{name}.forward = {HELPER}({name}.forward)  # {cls}" for cls, name in names.items()),
    ])
    missing = [cls for cls in classes if cls not in names]
    why = (f"Your loop trains {len(classes)} models ({', '.join(classes)}); each one's output is another's "
           "input or a loss's, outside any one autocast block. As measured: every trained model's forward "
           "runs under autocast and hands back fp32, so the code around it (losses, the next model) is "
           "unchanged.")
    if missing:
        why += f" Where {', '.join(missing)} is built was not found in {shown}: wrap its forward the same way."
    if value == "fp16":
        code += (f'\n\n# fp16 also needs a GradScaler (bf16 does not), one per optimizer:\nscaler = '
                 f'torch.amp.GradScaler("{device}")  # once, before the loop\n'
                 "scaler.scale(loss).backward()  # instead of loss.backward()\n"
                 "scaler.step(optimizer)  # instead of optimizer.step()\nscaler.update()")
    # best.patch writes it where it is the whole change: bf16, every model found, torch imported.
    patchable = value == "bf16" and not missing and source.after_imports()[1]
    return Snippet(setting, shown, line, where, code, why, patchable=patchable)


__all__ = ["HELPER", "models_autocast_snippet"]
