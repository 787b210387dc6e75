"""Optimizer hooks: the step boundary of the diagnosed script.

`torch.optim.optimizer.register_optimizer_step_pre_hook/post_hook` are global: they fire for
every optimizer, including ones created inside Lightning or the HF Trainer. The first optimizer
that steps is the primary one; its post-hook closes a training step (and raises StopDoctor
after the requested number of steps). `zero_grad` (optimizer or module) is charged to
"optimizer" too. `Optimizer.__init__` is wrapped only to remember where each optimizer was
built (the line the script tuner's `fused=True` goes to).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.optim import optimizer as optim_mod

from trainspeed.doctor.instrument import frameworks
from trainspeed.doctor.instrument.patching import Patches

HANDOVER_MIN = 10
"""Steps in a row of one other optimizer, with the primary silent, after which it is the
primary: more than this and more than twice the longest run seen while the primary stepped
(a WGAN's critic steps 5 times per generator step, forever: never handed over)."""


def _hand_over(s: Any, opt: Any) -> None:
    """Track runs of another optimizer's steps; hand the step boundary to one that keeps
    stepping alone (layer-wise training). The step it closes holds every iteration since the
    primary's last step: marked warm-up, not a step's time.

    An optimizer that stepped again after it handed over (A, then a long block of B, then A
    again: a GAN training D and G in blocks of 20) was no finished phase: the loop alternates.
    The boundary goes back to A at once and the pair never hands over again, so every step
    closes at A's update; handing over at each block (devnag's gan_pytorch.py) made the step
    switch meaning every 20 updates and marked every 10th step warm-up."""
    key = id(opt)
    if key == s.primary_opt:
        s.other_run_max = max(s.other_run_max, s.other_run[1])
        s.other_run = (None, 0)
        return
    if s.handed_from.get(s.primary_opt) == key:  # A -> B -> A: back to A, for good
        if len(s.alternating) < 64:
            s.alternating.add(frozenset((key, s.primary_opt)))
        del s.handed_from[s.primary_opt]
        s.primary_opt, s.other_run, s.other_run_max = key, (None, 0), 0
        return
    who, run = s.other_run
    run = run + 1 if who == key else 1
    s.other_run = (key, run)
    if run > max(HANDOVER_MIN, 2 * s.other_run_max) and frozenset((key, s.primary_opt)) not in s.alternating:
        if len(s.handed_from) < 64:  # bounded: layer-wise training of hundreds of layers hands over still
            s.handed_from[key] = s.primary_opt
        s.primary_opt, s.other_run, s.other_run_max = key, (None, 0), 0
        s.mon.mark_warmup()


from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site, format_site


def describe_optimizer(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Class, fused/foreach flags and where its parameters live (setup-time cost)."""
    dtypes: set[str] = set()
    devices: set[str] = set()
    n_params = 0
    for group in opt.param_groups:
        for p in group["params"]:
            n_params += p.numel()
            dtypes.add(str(p.dtype).replace("torch.", ""))
            devices.add(p.device.type)
    defaults = getattr(opt, "defaults", {}) or {}
    return {
        "class": type(opt).__name__,
        "module": type(opt).__module__,
        "fused": defaults.get("fused"),
        "foreach": defaults.get("foreach"),
        # the implementations its constructor takes (torch.optim's keep them in defaults, set or
        # not; LBFGS and most optimizers outside torch have neither)
        "implementations": [impl for impl in ("fused", "foreach") if impl in defaults],
        "param_dtypes": sorted(dtypes),
        "devices": sorted(devices),
        "params": n_params,
        "groups": len(opt.param_groups),
    }


def install(session: Session, patches: Patches) -> None:
    built_at: dict[int, tuple[str, int]] = {}  # id(optimizer) -> construction site (bounded below)

    def make_init(original: Any) -> Any:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if session.on():
                session.updates.on_optimizer(self)  # its models are other models to other optimizers
            # a subclass's __init__ calls this through super(): torch frames are skipped, so
            # the site is the user's `torch.optim.AdamW(...)` line (or their subclass's)
            if session.on() and len(built_at) < 64:
                where = caller_site(2)
                if where is not None:
                    built_at.setdefault(id(self), where)
                    # a second optimizer built at another line (a GAN's optimizerG): known before the
                    # first step, so that step's loss is already the primary's own (session.on_update).
                    # One line building several (a wrapper's inner optimizer) waits for them to step.
                    if not session.several_optimizers and len(set(built_at.values())) > 1:
                        session.several_optimizers = True

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        return __init__

    patches.wrap(torch.optim.Optimizer, "__init__", make_init)

    def pre_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        s = session
        if not s.on():
            return None
        s.close_eval()
        key = f"optimizer:{id(opt)}"
        if key not in s.observations and len(s.observations) < 256:
            s.internal += 1
            try:
                info = describe_optimizer(opt)
                where = built_at.get(id(opt))
                info.update(site=format_site(*where) if where else None,
                            site_path=list(where) if where else None)
                s.observe(key, "optimizer", primary=s.primary_opt is None, **info)
                if s.accelerator is None and len(info["devices"]) == 1:
                    s.accelerator = info["devices"][0]
                if s.primary_opt is None:
                    s.primary_opt = id(opt)
                    fw = frameworks.detect_from_stack()
                    s.observe("framework", "framework", name=fw)
            finally:
                s.internal -= 1
        s.mon.begin("optimizer")
        return None

    def post_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        s = session
        if not s.on():
            return None
        s.mon.end("optimizer")
        if not s.opt_depth:  # not an optimizer stepped inside another's closure
            s.internal += 1
            try:
                micro = s.updates.on_update(opt)
            finally:
                s.internal -= 1
            if not s.engine_depth:
                _hand_over(s, opt)
                if id(opt) != s.primary_opt:
                    s.several_optimizers = True
                if s.several_optimizers:  # one optimizer: its step's loss is the step's, as it was
                    s.on_update(opt, micro)
            if id(opt) == s.primary_opt:
                s.step_micro = micro
        if id(opt) == s.primary_opt and not s.engine_depth:  # an engine's step closes its own step
            s.end_step(opt)  # may raise StopDoctor: the step was applied and recorded
        return None

    patches.handle(optim_mod.register_optimizer_step_pre_hook(pre_hook))
    patches.handle(optim_mod.register_optimizer_step_post_hook(post_hook))

    def make_zero_grad(original: Any) -> Any:
        def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
            s = session
            if not s.on():
                return original(self, *args, **kwargs)
            s.mon.begin("optimizer")
            try:
                return original(self, *args, **kwargs)
            finally:
                s.mon.end("optimizer")

        zero_grad.__wrapped__ = original  # type: ignore[attr-defined]
        return zero_grad

    patches.wrap(torch.optim.Optimizer, "zero_grad", make_zero_grad)
    patches.wrap(nn.Module, "zero_grad", make_zero_grad)
