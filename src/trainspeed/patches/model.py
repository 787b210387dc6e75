"""Settings on the trained module: autocast (precision), torch.compile, channels_last.

The trained module is found at run time, once: the first outermost module call with grad
enabled, in train mode, with parameters that require grad (and of the class the doctor saw,
when it is known). A global forward pre-hook looks for it and removes itself, so later steps
pay nothing. compile and channels_last then act on that instance only: the loss module, a
frozen teacher or an evaluation model are left alone; in a loop the doctor saw train several
models (a GAN's two), on each trained one, as best.patch writes them (several_models.py).
Mixed precision covers what autocast around "the forward and the loss" would: every trained
module of the first step and the frozen networks its gradients flow through (a perceptual
loss's VGG), each forward handing back fp32.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optim_mod

from trainspeed.patches.context import InstallContext


def _is_trained(module: nn.Module, class_names: tuple[str, ...]) -> bool:
    if not torch.is_grad_enabled() or not module.training:
        return False
    if class_names and type(module).__name__ not in class_names and type(module).__name__ != "OptimizedModule":
        return False
    return any(p.requires_grad for p in module.parameters())


def _is_loss_network(module: nn.Module) -> bool:
    """A module with parameters, all frozen, that the step's gradients flow through: a
    perceptual loss's VGG (pytorch/examples' fast_neural_style). Autocast around "the forward
    and the loss" covers it; a frozen teacher called under no_grad is not one."""
    if not torch.is_grad_enabled():
        return False
    params = list(module.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


def on_trained_module(ctx: InstallContext, action: Callable[[nn.Module], None], setting: str = "",
                      *, every: bool = False) -> None:
    """Call `action(module)` once the trained module is first called (see module docstring).
    With `every`, on each trained module instead: every outermost module with trainable
    parameters (of the classes the doctor saw trained, when known) called before the first
    optimizer step has ended, as a GAN calls its discriminator and its generator, and every
    frozen one the gradients flow through (a loss network). An action
    that raises is a failed note, not a crash of the user's first step."""
    key = "models" if every else "model"
    finder = ctx.shared.get(key)
    if finder is None:
        t = ctx.targets
        one = (t.model_class,) if t.model_class else ()
        classes = (t.trained_classes or one) if every else one
        finder = ctx.shared[key] = {"actions": [], "found": [], "classes": classes}
        search = {"on": True, "steps": 0}
        inside: set[int] = set()  # ids of the found modules and their submodules

        def done() -> bool:
            """Whether the search is over: the first module found (one), or (every) the first
            optimizer step ended with each class found, or a second one ended regardless (a
            class the doctor saw that this run does not train must not keep the hook on)."""
            found = finder["found"]
            if not every:
                return bool(found)
            seen = {type(m).__name__ for m in found}
            return bool(found) and (search["steps"] >= 2 or (search["steps"] >= 1 and seen.issuperset(classes)))

        def stop() -> None:
            # The forward hook goes now (nn.Module iterates a copy of the hooks); the step hook
            # stays, idle, until the settings are undone: torch iterates the optimizer hooks'
            # dict itself ("OrderedDict mutated during iteration").
            search["on"] = False
            forward_hook.remove()

        def pre_hook(module: nn.Module, args: Any) -> None:
            if torch.compiler.is_compiling() or not search["on"] or id(module) in inside:
                return None  # a module found already, or one inside it (its forward is under way)
            if not _is_trained(module, classes) and not (every and _is_loss_network(module)):
                return None
            finder["found"].append(module)
            inside.update(id(m) for m in module.modules())
            for name, act in finder["actions"]:
                try:
                    act(module)
                except Exception as exc:  # noqa: BLE001 - the run goes on without this setting
                    ctx.note(f"failed: {name or 'setting'} on {type(module).__name__}: {type(exc).__name__}: {exc}")
            if done():
                stop()
            return None

        def step_ended(*_: Any) -> None:
            if search["on"]:
                search["steps"] += 1
                if done():
                    stop()

        if "model_settings" not in ctx.shared:
            ctx.shared["model_settings"] = []
            ctx.patches.call_on_undo(lambda: _report_unfound(ctx))
        forward_hook = module_mod.register_module_forward_pre_hook(pre_hook)
        ctx.patches.handle(forward_hook)
        if every:
            ctx.patches.handle(optim_mod.register_optimizer_step_post_hook(step_ended))
    finder["actions"].append((setting, action))
    ctx.shared["model_settings"].append((setting, finder))


def on_trained_models(ctx: InstallContext, action: Callable[[nn.Module], None], setting: str) -> None:
    """`action` on the trained model, or on each one when the doctor saw the loop train several
    (a GAN's generator and discriminator): never on a frozen loss network, which `every` also
    finds for autocast."""
    if len(ctx.targets.trained_classes) < 2:
        on_trained_module(ctx, action, setting)
        return

    def on_trained(module: nn.Module) -> None:
        if not _is_loss_network(module):
            action(module)

    on_trained_module(ctx, on_trained, setting, every=True)


def _report_unfound(ctx: InstallContext) -> None:
    """At uninstall: the settings that never found their module say so, in one note."""
    unfound = [(setting, finder) for setting, finder in ctx.shared["model_settings"] if not finder["found"]]
    if not unfound:
        return
    names = ", ".join(setting for setting, _ in unfound if setting) or "model settings"
    classes = tuple(dict.fromkeys(c for _, finder in unfound for c in finder["classes"]))
    of = f", of class {' or '.join(classes)}" if classes else ""
    ctx.note(f"failed: {names}: no trained module was called (train mode, grad enabled, trainable "
             f"parameters{of}); not applied")


# ---------------------------------------------------------------- precision

def _autocast_forward(module: nn.Module, dtype: torch.dtype, ctx: InstallContext) -> None:
    device = next((p.device.type for p in module.parameters()), "cpu")
    if torch.is_autocast_enabled(device) or ctx.targets.autocast:
        own = ctx.targets.autocast or str(torch.get_autocast_dtype(device)).replace("torch.", "")
        ctx.note(f"precision: the script already autocasts {type(module).__name__}'s forward ({own}); "
                 "not wrapped again" + ("; no GradScaler added" if dtype == torch.float16 else ""))
        return
    # fp16's loss scaling follows the autocast it belongs to: a script with its own mixed
    # precision (and its own GradScaler) must not have its losses scaled a second time.
    ctx.shared["scale_losses"] = dtype == torch.float16
    original = module.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device, dtype=dtype):
            out = original(*args, **kwargs)
        return fp32_outputs(out)

    # An instance attribute: the class (and every other instance) keeps its forward. Written
    # into __dict__ (what nn.Module's setattr does for a function) past a wrapper's own
    # __setattr__: Lightning Fabric's _FabricModule also sets it on the module it wraps, whose
    # forward then called the wrapper's, which called it back (RecursionError in every bf16
    # trial of Lightning's examples/fabric/language_model/train.py).
    own_forward = module.__dict__.get("forward")
    module.__dict__["forward"] = forward
    _saved_without_our_forward(module, own_forward, ctx)
    ctx.patches.call_on_undo(lambda: module.__dict__.pop("forward", None) if own_forward is None
                             else module.__dict__.__setitem__("forward", own_forward))
    _cover_the_call_under_way(module, device, dtype)
    ctx.note(f"precision: {type(module).__name__}.forward runs under torch.autocast({device!r}, {dtype})")


_HALF = (torch.bfloat16, torch.float16)


def fp32_outputs(value: Any, depth: int = 4) -> Any:
    """The module's bf16/fp16 outputs as fp32, in the containers they came in, as Accelerate's
    convert_outputs_to_fp32 does: what the script computes from them outside the forward (its
    loss, another model's input) then runs as it did in fp32. dcgan's BCELoss of a bf16 output
    and an fp32 label raised "Found dtype Float but expected BFloat16"."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _HALF else value
    if depth <= 0:
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(fp32_outputs(v, depth - 1) for v in value))
    if isinstance(value, (list, tuple)):
        items = [fp32_outputs(v, depth - 1) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if isinstance(value, dict):
        items = {k: fp32_outputs(v, depth - 1) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value
        try:
            return type(value)(items)  # transformers' ModelOutput takes its fields as a dict
        except Exception:  # noqa: BLE001 - a mapping that cannot be rebuilt: changed in place
            value.update(items)
            return value
    return value


def _cover_the_call_under_way(module: nn.Module, device: str, dtype: torch.dtype) -> None:
    """The call that found the module looked up its forward before the hooks ran, so the new
    forward starts with the next call: enter autocast now, leave it when this call returns or
    raises (an always_call forward hook, which nn.Module reads after forward), its outputs in
    fp32 as the new forward's are."""
    context = torch.autocast(device_type=device, dtype=dtype)
    context.__enter__()

    def leave(_module: nn.Module, _args: Any, output: Any = None) -> Any:
        handle.remove()
        context.__exit__(None, None, None)
        return None if output is None else fp32_outputs(output)

    handle = module.register_forward_hook(leave, always_call=True)


def install_precision(value: str, ctx: InstallContext) -> None:
    dtype = torch.bfloat16 if value == "bf16" else torch.float16
    _guard_saves(ctx)
    on_trained_module(ctx, lambda m: _autocast_forward(m, dtype, ctx), f"precision={value}", every=True)
    if value == "fp16":
        from trainspeed.patches.scaler import install_grad_scaler

        install_grad_scaler(ctx)


# ---------------------------------------------------------------- compile

def install_compile(value: str, ctx: InstallContext) -> None:
    if ctx.targets.compiled:
        ctx.note("compile: the script already compiles its model; not compiled again")
        return
    import torch._dynamo

    # A compile error falls back to eager instead of crashing the run; the fallback is
    # detected below and marks the trial failed (an eager speed must not read as compiled).
    # Compiled code (and frames dynamo gave up on) are cached per code object for the process:
    # dropped on uninstall, so the next install in this process (tests) starts clean.
    ctx.patches.call_on_undo(torch._dynamo.reset)
    ctx.patches.setattr(torch._dynamo.config, "suppress_errors", True)
    _guard_saves(ctx)

    def compile_module(module: nn.Module) -> None:
        if getattr(module, "_compiled_call_impl", None) is not None or type(module).__name__ == "OptimizedModule":
            ctx.note("compile: the model is already compiled")
            return
        _traceable_forward(module, ctx)
        try:
            # nn.Module.compile() written out into __dict__, past a wrapper's __setattr__ (see
            # _autocast_forward: a _FabricModule would hand the compiled call to the module it
            # wraps too, and each called the other until the RecursionError)
            module.__dict__["_compiled_call_impl"] = torch.compile(
                module._call_impl, mode=None if value == "default" else value)
        except Exception as exc:  # noqa: BLE001 - a compile that cannot start is a result
            ctx.note(f"failed: torch.compile could not start: {type(exc).__name__}: {exc}")
            return
        ctx.patches.call_on_undo(lambda: module.__dict__.__setitem__("_compiled_call_impl", None))
        ctx.note(f"compile: {type(module).__name__} compiled in place (mode {value})")
        _watch_fallbacks(ctx)

    on_trained_models(ctx, compile_module, f"compile={value}")


def _traceable_forward(module: nn.Module, ctx: InstallContext) -> None:
    """`module.compile()` compiles `_call_impl`, which dynamo skips as torch's own code; it then
    traces the forward that `_call_impl` calls, unless that too is torch's (nn.Sequential,
    nn.Transformer): then nothing at all is compiled, silently. A forward defined here gives
    dynamo a frame to start from (it inlines torch's forward from there)."""
    if "forward" in module.__dict__:  # precision's autocast forward (or the script's own) already is one
        return
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    module.__dict__["forward"] = forward  # past a wrapper's __setattr__ (see _autocast_forward)
    _saved_without_our_forward(module, None, ctx)
    ctx.patches.call_on_undo(lambda: module.__dict__.pop("forward", None))


def _refers_to(obj: Any, modules: dict[int, Any], depth: int = 3) -> bool:
    """Whether a saved object is, or holds in its dicts/lists/tuples, one of `modules` (or a
    module that contains one): `torch.save(model, f)`, `torch.save({"model": model}, f)`."""
    if isinstance(obj, nn.Module):
        return any(id(m) in modules for m in obj.modules())
    if depth <= 0:
        return False
    if isinstance(obj, dict):
        return any(_refers_to(v, modules, depth - 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_refers_to(v, modules, depth - 1) for v in obj)
    return False


def _saved_without_our_forward(module: nn.Module, own_forward: Any, ctx: InstallContext) -> None:
    """`torch.save(model, f)` pickles the module's __dict__, where our forward (a local function)
    cannot be pickled: pytorch/examples' word_language_model saved its whole model at the end of
    the epoch, and its compile trial died with "Can't pickle local object
    '_traceable_forward.<locals>.forward'". While a save that holds the module runs, the
    instance's forward is what the script gave it (none: the class's), so the file is the one
    the script writes unpatched and loads with its own torch.load(weights_only) allow-list."""
    _guard_saves(ctx).setdefault(id(module), (module, own_forward))  # the first is the script's


def _guard_saves(ctx: InstallContext) -> dict[int, tuple[nn.Module, Any]]:
    """The modules whose forward we replaced ({id: (module, the script's own forward)}), and
    torch.save wrapped once to hide those forwards. Called at install, before the script runs:
    the doctor's instrumentation wraps torch.save after the settings are installed and is
    undone before them, so a wrapper of ours put on top of the doctor's while the script runs
    would be undone last and put the doctor's wrapper back as torch.save (seen: a later test's
    torch.save was still the doctor's)."""
    ours: dict[int, tuple[nn.Module, Any]] | None = ctx.shared.get("own_forwards")
    if ours is None:
        ours = ctx.shared["own_forwards"] = {}

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
                if not _refers_to(obj, ours):
                    return original(obj, *args, **kwargs)
                hidden = [(m, m.__dict__.pop("forward")) for m, _ in ours.values() if "forward" in m.__dict__]
                for m, own in ours.values():
                    if own is not None:
                        m.__dict__["forward"] = own
                try:
                    return original(obj, *args, **kwargs)
                finally:
                    for m, forward in hidden:
                        m.__dict__["forward"] = forward

            return save

        ctx.patches.wrap(torch, "save", make)
    return ours


def _watch_fallbacks(ctx: InstallContext) -> None:
    """With suppress_errors, dynamo logs a failed frame and runs it eagerly: count those."""
    import logging

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.levelno >= logging.WARNING and "error" in message.lower():
                if not any(n.startswith("failed: torch.compile") for n in ctx.notes):
                    lines = [line.strip() for line in message.splitlines() if line.strip()]
                    # the exception line ("RuntimeError: ...") says why; the first says where
                    why = next((line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b", line)), lines[0])
                    ctx.note(f"failed: torch.compile fell back to eager (ran eager): {why[:200]}")

    handler = Catch()
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    ctx.patches.call_on_undo(lambda: logger.removeHandler(handler))


# ---------------------------------------------------------------- channels_last

def install_channels_last(value: bool, ctx: InstallContext) -> None:
    if not value:
        return

    def convert(module: nn.Module) -> None:
        module.to(memory_format=torch.channels_last)

        def to_channels_last(_: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(a.contiguous(memory_format=torch.channels_last)
                         if isinstance(a, torch.Tensor) and a.dim() == 4 else a for a in args)

        ctx.patches.handle(module.register_forward_pre_hook(to_channels_last))
        ctx.note(f"channels_last: {type(module).__name__} and its 4-D inputs use torch.channels_last")

    on_trained_models(ctx, convert, "channels_last")
