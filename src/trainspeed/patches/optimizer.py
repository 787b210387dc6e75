"""`optimizer.impl`: the loop's optimizers' fused or foreach implementation, passed as the
keyword at their construction (the doctor recorded where each optimizer that steps is built, a
GAN's two; without those sites, every optimizer built in the user's own files). An optimizer class that takes no such keyword, or
whose parameters fused cannot run on (fused needs floating-point parameters on a supported
device), is built as the script wrote it, and a note says why.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from trainspeed.patches.callers import chosen_among
from trainspeed.patches.context import InstallContext


def _where(site: tuple[str, int]) -> str:
    return f"{os.path.basename(site[0])}:{site[1]}"


def _takes(cls: type, keyword: str) -> bool:
    try:
        return keyword in inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False


def _fused_problem(opt: torch.optim.Optimizer) -> str | None:
    """Why fused cannot run on these parameters. Torch checks this only at the first step()
    (a crash mid-run), so it is checked here, at construction, instead."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = _get_fused_kernels_supported_devices()
    for group in opt.param_groups:
        for p in group["params"]:
            if p.device.type not in devices or not torch.is_floating_point(p):
                return f"fused needs floating-point parameters on {devices}, got {p.dtype} on {p.device.type}"
    return None


def install_impl(value: str, ctx: InstallContext) -> None:
    t = ctx.targets
    targets = t.optimizer_sites or ((t.optimizer_site,) if t.optimizer_site else ())
    other = "foreach" if value == "fused" else "fused"
    state = {"depth": 0}  # AdamW.__init__ calls Adam.__init__: only the outermost one decides
    noted: set[tuple[str, int]] = set()

    def wrap_class(cls: type) -> None:
        cls_init = cls.__dict__["__init__"]
        params = inspect.signature(cls_init).parameters

        def init(opt: Any, *args: Any, **kwargs: Any) -> None:
            site = chosen_among(targets) if state["depth"] == 0 else None
            if site is None or kwargs.get(value) is True:
                return _nested(cls_init, opt, args, kwargs)
            # A generator of parameters is consumed by the first try: keep it for a second.
            if args and not isinstance(args[0], (list, tuple, dict, torch.Tensor)):
                args = (list(args[0]), *args[1:])
            elif not isinstance(kwargs.get("params", []), (list, tuple, dict, torch.Tensor)):
                kwargs["params"] = list(kwargs["params"])
            chosen_kw = {**kwargs, value: True}
            if other in params:
                chosen_kw[other] = None  # both True is an error; None is the class's default
            try:
                _nested(cls_init, opt, args, chosen_kw)
                problem = _fused_problem(opt) if value == "fused" else None
            except (RuntimeError, TypeError, ValueError) as exc:
                problem = str(exc).splitlines()[0]
            if problem is None:
                ctx.note(f"optimizer.impl={value}: {type(opt).__name__} at {_where(site)} built with {value}=True")
                return None
            ctx.note(f"failed: optimizer.impl={value}: {type(opt).__name__} at {_where(site)} refused it "
                     f"({problem}); built as written")
            opt.__dict__.clear()  # a clean second construction, as the script wrote it
            return _nested(cls_init, opt, args, kwargs)

        init.__wrapped__ = cls_init  # type: ignore[attr-defined]
        ctx.patches.setattr(cls, "__init__", init)

    def _nested(cls_init: Any, opt: Any, args: tuple, kwargs: dict) -> None:
        state["depth"] += 1
        try:
            cls_init(opt, *args, **kwargs)
        finally:
            state["depth"] -= 1

    base_init = torch.optim.Optimizer.__init__

    def base(opt: Any, *args: Any, **kwargs: Any) -> None:
        # An optimizer without the keyword reaches the base class with depth 0: say so once.
        if state["depth"] == 0 and not _takes(type(opt), value):
            site = chosen_among(targets)
            if site is not None and site not in noted:
                noted.add(site)
                ctx.note(f"failed: optimizer.impl={value}: {type(opt).__name__} at {_where(site)} "
                         f"takes no {value} keyword; left as written")
        return base_init(opt, *args, **kwargs)

    base.__wrapped__ = base_init  # type: ignore[attr-defined]
    ctx.patches.setattr(torch.optim.Optimizer, "__init__", base)
    for cls in _optimizer_classes():
        if "__init__" in cls.__dict__ and _takes(cls, value):
            wrap_class(cls)


def _optimizer_classes() -> list[type]:
    """torch.optim's optimizer classes (user subclasses inherit the wrapped __init__)."""
    out = []
    for name in dir(torch.optim):
        obj = getattr(torch.optim, name)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer:
            out.append(obj)
    return out
