"""Forward hooks: the outermost `nn.Module.__call__` is the "forward" phase (or "eval").

Global forward pre/post hooks fire for every module; a depth counter keeps only the outermost
call (the model, or the loss module called next to it). A forward with grad disabled or with
the module in eval() mode opens the (sticky) "eval" phase instead.

Inside a torch.compile'd region the hooks do nothing (`is_compiling()` is constant-folded by
dynamo), so they never cause graph breaks.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules import module as module_mod

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site, format_site
from trainspeed.doctor.instrument.updates import module_class

MAX_MODULES_OBSERVED = 8
"""Top-level modules described in observations at most."""


def is_compiled(module: nn.Module) -> bool:
    """torch.compile(model) returns an OptimizedModule; model.compile() compiles in place."""
    if type(module).__name__ == "OptimizedModule":
        return True
    return getattr(module, "_compiled_call_impl", None) is not None


def _enabled_autocast_dtype(value: Any) -> str | None:
    if isinstance(value, torch.autocast) and getattr(value, "_enabled", True) \
            and getattr(value, "fast_dtype", None) is not None:
        return str(value.fast_dtype).replace("torch.", "")
    return None


def forward_autocast(module: nn.Module, max_visits: int = 16) -> str | None:
    """The dtype of an enabled torch.autocast that wraps the module's own instance forward, or
    None. accelerate's mixed precision (a Trainer with --bf16 True) sets `model.forward` to
    `convert_outputs_to_fp32(torch.autocast(...)(forward))`: autocast turns on inside the call,
    after the forward pre-hook that looks for it, and a bf16 run of transformers' run_clm.py was
    reported "fp32". Walks the wrappers breadth-first (`__wrapped__`, accelerate's
    `model_forward`, closure cells), a few levels: the wrapped forward's own decorators
    (transformers' can_return_tuple ...) lie deeper than the autocast. Reads attributes only."""
    from collections import deque

    todo, seen = deque([module.__dict__.get("forward")]), set()
    while todo and len(seen) < max_visits:
        fn = todo.popleft()
        fn = getattr(fn, "__func__", fn)  # a bound method: its function
        if fn is None or id(fn) in seen or isinstance(fn, (type, nn.Module)):
            continue
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(value, torch.autocast):
                dtype = _enabled_autocast_dtype(value)
                if dtype is not None:
                    return dtype
            elif callable(value):
                todo.append(value)
        for attr in ("__wrapped__", "model_forward"):
            inner = getattr(fn, attr, None)
            if inner is not None:
                todo.append(inner)
    return None


_MIXED = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}


def fabric_autocast(module: nn.Module) -> str | None:
    """The autocast dtype of a Lightning Fabric module's precision plugin ("bf16-mixed" ->
    "bfloat16"), or None. Fabric(precision="bf16-mixed") enters autocast inside
    _FabricModule.forward, after the forward pre-hook: the tune's patched
    examples/fabric/language_model/train.py ran 1.9-2.1x faster and was reported "fp32".
    Read from the instance's own __dict__ (the wrapper's __getattr__ passes through)."""
    strategy = module.__dict__.get("_strategy")
    precision = getattr(getattr(strategy, "precision", None), "precision", None)
    return _MIXED.get(precision) if isinstance(precision, str) else None


def describe_module(module: nn.Module) -> dict[str, Any]:
    """Plain facts about a top-level module (one pass over its parameters: setup-time cost)."""
    dtypes: dict[str, int] = {}
    devices: set[str] = set()
    n_params = 0
    for p in module.parameters():
        n_params += p.numel()
        dtypes[str(p.dtype).replace("torch.", "")] = dtypes.get(str(p.dtype).replace("torch.", ""), 0) + p.numel()
        devices.add(p.device.type)
    main_dtype = max(dtypes, key=dtypes.get) if dtypes else None  # type: ignore[arg-type]
    device_type = next(iter(devices)) if len(devices) == 1 else ("mixed" if devices else None)
    autocast = None
    if device_type in ("cuda", "cpu", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(device_type):
                autocast = str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
        except (TypeError, RuntimeError, AttributeError):
            pass
    if autocast is None:
        autocast = forward_autocast(module) or fabric_autocast(module)
    return {
        "class": module_class(module),
        "params": n_params,
        "param_dtype": main_dtype,
        "device": device_type,
        "compiled": is_compiled(module),
        "data_parallel": isinstance(module, nn.DataParallel),
        "ddp": isinstance(module, nn.parallel.DistributedDataParallel),
        "autocast": autocast,
        "channels_last": None,
    }


def _first_batch_dim(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> int:
    for value in (*args, *(kwargs or {}).values()):
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            return int(value.shape[0])
    return 0


def install(session: Session, patches: Patches) -> tuple[Callable[..., None], Callable[..., None]]:
    """Returns the (pre, post) hooks, which compiled_calls.py also runs around a model compiled
    in place."""
    is_compiling = torch.compiler.is_compiling

    def pre_hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
        if is_compiling():
            return None
        s = session
        if s.fwd_depth:
            s.fwd_depth += 1
            return None
        if not s.on() or s.in_data:
            # inside DataLoader.__next__ (num_workers=0): a dataset's nn.Module transforms
            # (torchvision v2) are the data pipeline, timed as "data" by dataloader.py
            return None
        s.fwd_depth = 1
        trainable = s.module_facts_of(module)[0]
        if not torch.is_grad_enabled() or not module.training:
            if s.eval_open or not _inside_step(s) or id(module) in s.updates.modules:
                # a rollout is several such forwards in a row (one per environment step): a single
                # prediction per step on a smaller batch (time_sequence_prediction's test
                # sequences) is an evaluation
                s.rollout_run = s.rollout_run + 1 if _rollout_like(s, module, args, kwargs) else 0
                rollout = s.rollout_run >= 2
                if s.mon.steps_done:  # after the first update: a rollout before it is setup
                    s.seen["rollout_forwards" if rollout else "eval_forwards"] += 1
                s.open_eval()
                # a rollout runs until training resumes: the environments' steps between its
                # forwards are part of it (with a DDP-wrapped agent they were, without not)
                s.eval_rollout = s.eval_rollout or rollout
                s.fwd_phase = None
                return None
            # a no-grad forward, inside a training step, of a module that never trains (a
            # teacher, a target network) is the step's forward, not an evaluation; the trained
            # model itself under no_grad is one (an evaluation between fetch and forward)
        elif not trainable and not s.step_trained_forwards and not s.opt_depth:
            # a module without trainable parameters called on the batch before any model has
            # seen it (an augmentation in the loop): preparing the batch, "data"
            s.fwd_phase = "data"
            s.mon.begin("data")
            return None
        s.close_eval()
        s.rollout_run = 0
        s.fwd_phase = "forward"
        key = f"module:{id(module)}"
        if (trainable and torch.is_grad_enabled() and key not in s.observations and len(s.observations) < 256
                and _count_modules(s) < MAX_MODULES_OBSERVED):
            s.internal += 1
            try:
                info = describe_module(module)
                where = caller_site(1)  # the user's `out = model(x)`: where autocast would go
                info.update(call_site=format_site(*where) if where else None,
                            call_site_path=list(where) if where else None,
                            convolutional=any(isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)) for m in module.modules()),
                            hf_model=any(c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
                                         for c in type(module).__mro__))
                s.observe(key, "model", **info)
                if info["compiled"]:
                    s.observations.setdefault("compiled", {"kind": "compiled", "value": True})
                if s.accelerator is None and info["device"] not in (None, "mixed"):
                    s.accelerator = info["device"]
            finally:
                s.internal -= 1
        if not s.step_loader_batches:
            s.step_fwd_samples += _first_batch_dim(args, kwargs)
        s.mon.begin("forward")
        return None

    def post_hook(module: nn.Module, args: tuple[Any, ...], *rest: Any) -> None:
        if is_compiling():
            return None
        s = session
        if not s.fwd_depth:
            return None
        s.fwd_depth -= 1
        if s.fwd_depth == 0 and s.fwd_phase in ("forward", "data"):
            phase, s.fwd_phase = s.fwd_phase, None
            s.mon.end(phase)
            if phase == "forward" and rest and torch.is_grad_enabled():
                s.updates.on_output(module, rest[0])
        return None

    patches.handle(module_mod.register_module_forward_pre_hook(pre_hook))
    try:
        handle = module_mod.register_module_forward_hook(post_hook, always_call=True)
    except TypeError:  # torch without always_call: an exception in forward leaves depth > 0,
        handle = module_mod.register_module_forward_hook(post_hook)  # reset at each step
    patches.handle(handle)
    _quiet_compile_hook_warning(patches)
    return pre_hook, post_hook


def _quiet_compile_hook_warning(patches: Patches) -> None:
    """torch warns a script that calls torch.compile(module) that global module hooks fire again
    for the compiled wrapper: the hooks are the doctor's (which count the outermost call once),
    so the user's console is spared the warning about them (llama2.c --compile=True printed it)."""
    import warnings

    warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
    entry = warnings.filters[0]

    def undo() -> None:
        if entry in warnings.filters:
            warnings.filters.remove(entry)
            # the warnings caches follow the filter list (renamed in Python 3.13)
            mutated = (getattr(warnings, "_filters_mutated", None)
                       or getattr(warnings, "_filters_mutated_lock_held", None))
            if mutated is not None:
                mutated()

    patches.call_on_undo(undo)


def _inside_step(session: Session) -> bool:
    """A training step is under way: its batch was fetched, or a model trained on it, and no
    optimizer closed the step since."""
    return bool(session.step_loader_batches or session.step_trained_forwards)


def _rollout_like(session: Session, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """A no-grad forward that collects experience rather than evaluates (PPO's rollout:
    `with torch.no_grad(): action, logprob, _, value = agent(next_obs)` between updates, whose
    time read as "evaluation ... 46 % of the step, evaluate less often"): the model the optimizer
    trains, left in train() mode, in a loop that fetched no DataLoader batch, on a batch smaller
    than its training forwards' (2 environments' states against minibatches of 64). An
    evaluation calls eval(), reads a validation loader, or runs batches as large as training's."""
    if torch.is_grad_enabled() or not module.training or id(module) not in session.updates.modules:
        return False
    if session.updates.loader_batches:
        return False
    trained = (session.observations.get("batch") or {}).get("max_batch_size")
    return isinstance(trained, int) and 0 < _first_batch_dim(args, kwargs) < trained


def _count_modules(session: Session) -> int:
    return sum(1 for k in session.observations if k.startswith("module:"))
