"""`hf.attn_implementation`: a Hugging Face model's attention kernel (sdpa: PyTorch's fused
scaled_dot_product_attention; eager: matmul-softmax-matmul; flash_attention_2 where the
flash_attn package is installed). Passed as the keyword of `from_pretrained` / `_from_config`
(which the Auto classes call), unless the script passes its own; a model built directly from
its class gets it through `set_attn_implementation` once it is found training.
"""

from __future__ import annotations

import importlib.util
import weakref
from types import ModuleType
from typing import Any

from trainspeed.patches.context import InstallContext


def install_attn_implementation(value: str, ctx: InstallContext) -> None:
    if value == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        ctx.note("failed: hf.attn_implementation=flash_attention_2 needs the flash_attn package; not applied")
        return

    chosen_by_script: weakref.WeakSet = weakref.WeakSet()

    def patch(modeling_utils: ModuleType) -> None:
        base = getattr(modeling_utils, "PreTrainedModel", None)
        if not isinstance(base, type):
            ctx.note(f"failed: hf.attn_implementation={value}: transformers has no PreTrainedModel here; not applied")
            return
        for name in ("from_pretrained", "_from_config"):
            descriptor = base.__dict__.get(name)
            if not isinstance(descriptor, classmethod):
                continue
            function = descriptor.__func__

            def make(function: Any, name: str) -> Any:
                def loader(cls: type, *args: Any, **kwargs: Any) -> Any:
                    if "attn_implementation" in kwargs:
                        if kwargs["attn_implementation"] != value:
                            ctx.note(f"attention: the script asks {name} for "
                                     f"{kwargs['attn_implementation']!r}; kept over {value!r}")
                        model = function(cls, *args, **kwargs)
                        try:
                            chosen_by_script.add(model)  # not switched later when it trains
                        except TypeError:  # (model, loading_info) tuples
                            pass
                        return model
                    ctx.note(f"attention: {cls.__name__}.{name}(..., attn_implementation={value!r})")
                    return function(cls, *args, attn_implementation=value, **kwargs)

                loader.__wrapped__ = function  # type: ignore[attr-defined]
                return classmethod(loader)

            ctx.patches.setattr(base, name, make(function, name))

    # The module that defines PreTrainedModel, not `transformers`: the package is lazy, and
    # touching transformers.PreTrainedModel costs seconds a tokenizer-only script never pays.
    ctx.imports.add("transformers.modeling_utils", patch)

    from trainspeed.patches.model import on_trained_module

    def late(trained: Any) -> None:
        # the trained module may wrap the HF model (a LightningModule): the first one inside
        module = next((m for m in trained.modules() if callable(getattr(m, "set_attn_implementation", None))
                       and getattr(m, "config", None) is not None), trained)
        config = getattr(module, "config", None)
        current = getattr(config, "_attn_implementation", None)
        setter = getattr(module, "set_attn_implementation", None)
        if config is None or current == value or setter is None or module in chosen_by_script:
            return
        try:
            setter(value)
            ctx.note(f"attention: {type(module).__name__}.set_attn_implementation({value!r}) (was {current!r})")
        except Exception as exc:  # noqa: BLE001 - the model keeps its kernel; the trial says so
            ctx.note(f"failed: {type(module).__name__} refused attn_implementation={value!r}: {exc}")

    on_trained_module(ctx, late, f"hf.attn_implementation={value}")
