"""Model settings as code for a loop that trains several models (a GAN's generator and
discriminator): what the tune measured, written into the script, one line per trained model
where the script builds them.

precision: one autocast block around "the forward and the loss" (autocast_snippet) covers one
model's call. Several models pass their outputs to each other (`netD(netG(noise))`) and to losses
computed outside any block: a bf16 generator output reaching an fp32 discriminator raised
"Input type (CPUBFloat16Type) and weight type (torch.FloatTensor) should be the same", and a
bf16 output reaching BCELoss with an fp32 label "Found dtype Float but expected BFloat16". The
setting's trials run each trained model's forward under autocast with its outputs back in fp32
(patches/model.py, as Accelerate's convert_outputs_to_fp32); the code below does the same.

compile and channels_last: the trials act on every trained model (patches/model.py); a patch
that compiled one of dcgan's two would hand back half of what was measured.
"""

from __future__ import annotations

from trainspeed.patches.snippets import Snippet, Source, _dotted

HELPER = "autocast_forward"
INPUTS_HELPER = "channels_last_inputs"


def several_models_snippet(setting: str, value: str, source: Source, classes: tuple[str, ...], shown: str,
                           device: str, optimizer_line: int | None) -> Snippet | None:
    """The setting's lines for each trained model, before the optimizer is built (the models
    exist by then), else after the last model is built. None when no model's construction is
    found in this file."""
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
    missing = [cls for cls in classes if cls not in names]
    trains = f"Your loop trains {len(classes)} models ({', '.join(classes)})"
    has_torch = source.after_imports()[1]
    if setting == "precision":
        code, why, patchable = _autocast(value, names, device, trains)
        # best.patch writes it where it is the whole change: bf16, torch imported.
        patchable = patchable and has_torch
    elif setting == "compile":
        mode = "" if value in ("default", True) else f'mode="{value}"'
        code = "\n".join(f"{name}.compile({mode})  # {cls}" for cls, name in names.items())
        why = (f"{trains}: as measured, each is compiled in place once, before the optimizers are built "
               "(the first steps pay for the compilation).")
        patchable = True
    else:
        code, why = _channels_last(names, trains)
        patchable = has_torch
    if missing:
        why += f" Where {', '.join(missing)} is built was not found in {shown}: give it the same line."
    return Snippet(setting, shown, line, where, code, why, patchable=patchable and not missing)


def _autocast(value: str, names: dict[str, str], device: str, trains: str) -> tuple[str, str, bool]:
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
    why = (f"{trains}; each one's output is another's input or a loss's, outside any one autocast block. "
           "As measured: every trained model's forward runs under autocast and hands back fp32, so the code "
           "around it (losses, the next model) is unchanged.")
    if value == "fp16":
        code += (f'\n\n# fp16 also needs a GradScaler (bf16 does not), one per optimizer:\nscaler = '
                 f'torch.amp.GradScaler("{device}")  # once, before the loop\n'
                 "scaler.scale(loss).backward()  # instead of loss.backward()\n"
                 "scaler.step(optimizer)  # instead of optimizer.step()\nscaler.update()")
    return code, why, value == "bf16"


def _channels_last(names: dict[str, str], trains: str) -> tuple[str, str]:
    """Each model's weights in NHWC, and its 4-D inputs converted as it is called (a forward
    pre-hook, as the trials ran it): one model's output is the next one's input, so no single
    line before the model calls converts every batch."""
    code = "\n".join([
        f"def {INPUTS_HELPER}(module, args):  # the model's 4-D inputs in channels_last",
        "    return tuple(a.contiguous(memory_format=torch.channels_last) if torch.is_tensor(a) and a.dim() == 4"
        " else a for a in args)",
        "",
        *(line for cls, name in names.items() for line in (
            f"{name} = {name}.to(memory_format=torch.channels_last)  # {cls}",
            f"{name}.register_forward_pre_hook({INPUTS_HELPER})")),
    ])
    why = (f"{trains}: as measured, each one's convolutions run in NHWC, its weights converted once and its "
           "4-D inputs (another model's output among them) as it is called.")
    return code, why


__all__ = ["HELPER", "INPUTS_HELPER", "several_models_snippet"]
