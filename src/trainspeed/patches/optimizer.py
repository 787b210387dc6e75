"""`optimizer.impl`: the primary optimizer's fused or foreach implementation, passed as the
keyword at its construction (the doctor recorded where it is built). An optimizer class that
takes no such keyword, or that refuses it for its parameters (fused needs a supported device
and dtype), is built as the script wrote it, and a note says why.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from trainspeed.patches.callers import in_user_files, same_site, user_caller
from trainspeed.patches.settings import InstallContext


def install_impl(value: str, ctx: InstallContext) -> None:
    target = ctx.targets.optimizer_site
    patched: dict[type, Any] = {}

    def wrap_class(cls: type) -> None:
        if cls in patched or "__init__" not in cls.__dict__:
            return
        params = inspect.signature(cls.__init__).parameters
        if value not in params:
            return
        cls_init = cls.__dict__["__init__"]

        def init(opt: Any, *args: Any, **kwargs: Any) -> None:
            site = user_caller(2)
            chosen = same_site(site, target) if target else in_user_files(site)
            if type(opt) is not cls or not chosen or kwargs.get(value) is True:
                return cls_init(opt, *args, **kwargs)
            where = f"{os.path.basename(site[0])}:{site[1]}" if site else "?"
            other = "foreach" if value == "fused" else "fused"
            chosen_kw = {**kwargs, value: True}
            if other in params:
                chosen_kw[other] = None  # both True is an error; None is the class's default
            try:
                cls_init(opt, *args, **chosen_kw)
                ctx.note(f"optimizer: {cls.__name__} at {where} built with {value}=True")
            except (RuntimeError, TypeError, ValueError) as exc:
                ctx.note(f"failed: {cls.__name__} refused {value}=True ({exc}); built as written")
                cls_init(opt, *args, **kwargs)

        init.__wrapped__ = cls_init  # type: ignore[attr-defined]
        patched[cls] = init
        ctx.patches.setattr(cls, "__init__", init)

    for cls in _optimizer_classes():
        wrap_class(cls)


def _optimizer_classes() -> list[type]:
    """torch.optim's optimizer classes (user subclasses inherit the wrapped __init__)."""
    out = []
    for name in dir(torch.optim):
        obj = getattr(torch.optim, name)
        if isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer) and obj is not torch.optim.Optimizer:
            out.append(obj)
    return out
