"""The settings registry: key -> (value check, install function, description), and
`install_settings`, which validates a settings dict and installs every patch, undoing all of
them if one fails. Each setting is a plain function `install(value, ctx)` in its family's
module; `ctx` (an InstallContext, from `patches.context`) holds the shared Patches,
PostImportHooks, the Targets and the notes list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainspeed.errors import ConfigError
from trainspeed.patches.context import InstallContext
from trainspeed.patches.imports import PostImportHooks
from trainspeed.patches.machinery import Patches
from trainspeed.patches.targets import Targets

FLAG_PREFIX = "args."


@dataclass(frozen=True)
class SettingSpec:
    check: Callable[[Any], bool]
    allowed: str
    """What the value may be, for the error message."""
    install: Callable[[Any, InstallContext], None]
    help: str


def _int_at_least(n: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= n


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


def _one_of(*values: str) -> Callable[[Any], bool]:
    return lambda v: v in values


def _registry() -> dict[str, SettingSpec]:
    from trainspeed.patches import cache_checks, hf, loader, model, optimizer, runtime, whatif
    from trainspeed.patches.edited_source import install_code_edit

    return {
        "loader.num_workers": SettingSpec(_int_at_least(0), "an int >= 0", loader.install_num_workers,
                                          "workers of the training DataLoader"),
        "loader.pin_memory": SettingSpec(_bool, "true or false", loader.install_pin_memory,
                                         "pinned host memory for the training DataLoader"),
        "loader.persistent_workers": SettingSpec(_bool, "true or false", loader.install_persistent_workers,
                                                 "keep the training DataLoader's workers between epochs"),
        "loader.prefetch_factor": SettingSpec(_int_at_least(1), "an int >= 1", loader.install_prefetch_factor,
                                              "batches each worker loads ahead"),
        "precision": SettingSpec(_one_of("bf16", "fp16"), "'bf16' or 'fp16'", model.install_precision,
                                 "autocast around the trained module's forward (fp16 adds a GradScaler)"),
        "compile": SettingSpec(_one_of("default", "reduce-overhead", "max-autotune"),
                               "'default', 'reduce-overhead' or 'max-autotune'", model.install_compile,
                               "torch.compile of the trained module"),
        "channels_last": SettingSpec(_bool, "true or false", model.install_channels_last,
                                     "channels_last memory format for the trained module and its inputs"),
        "optimizer.impl": SettingSpec(_one_of("fused", "foreach"), "'fused' or 'foreach'",
                                      optimizer.install_impl, "the optimizer's fused/foreach implementation"),
        "threads": SettingSpec(_int_at_least(1), "an int >= 1", runtime.install_threads,
                               "torch.set_num_threads"),
        "cuda.tf32": SettingSpec(_bool, "true or false", runtime.install_tf32, "TF32 matmuls and convolutions"),
        "cuda.cudnn_benchmark": SettingSpec(_bool, "true or false", runtime.install_cudnn_benchmark,
                                            "cuDNN autotuning"),
        "cuda.expandable_segments": SettingSpec(_bool, "true or false", runtime.install_expandable_segments,
                                                "the CUDA caching allocator's expandable segments"),
        "runtime.cache_checks": SettingSpec(cache_checks.valid_names, "a list of module.function names",
                                            cache_checks.install_cache_checks,
                                            "functools.cache around a library's package check asked at every step"),
        "hf.attn_implementation": SettingSpec(_one_of("sdpa", "eager", "flash_attention_2"),
                                              "'sdpa', 'eager' or 'flash_attention_2'", hf.install_attn_implementation,
                                              "a Hugging Face model's attention kernel"),
        "whatif.log_every": SettingSpec(_int_at_least(2), "an int >= 2", whatif.install_log_every,
                                        "what-if: only every k-th logging call runs"),
        "whatif.save_every": SettingSpec(_int_at_least(2), "an int >= 2", whatif.install_save_every,
                                         "what-if: only every k-th torch.save writes"),
        "whatif.gc_every": SettingSpec(_int_at_least(2), "an int >= 2", whatif.install_gc_every,
                                       "what-if: only every k-th gc.collect / torch.cuda.empty_cache runs"),
        "whatif.no_gc": SettingSpec(_bool, "true or false", whatif.install_no_gc,
                                    "what-if: gc.collect / torch.cuda.empty_cache do nothing"),
        # what a what-if winner's verification runs: best.patch's edit, made in the source
        "code.log_every": SettingSpec(_int_at_least(2), "an int >= 2", install_code_edit("code.log_every"),
                                      "best.patch's edit: the logging interval times k (the source as run)"),
        "code.save_every": SettingSpec(_int_at_least(2), "an int >= 2", install_code_edit("code.save_every"),
                                       "best.patch's edit: the checkpoint interval times k (the source as run)"),
        "code.gc_every": SettingSpec(_int_at_least(2), "an int >= 2", install_code_edit("code.gc_every"),
                                     "best.patch's edit: gc.collect / empty_cache under `if step % k == 0:`"),
    }


_SETTINGS: dict[str, SettingSpec] | None = None


def settings_registry() -> dict[str, SettingSpec]:
    global _SETTINGS
    if _SETTINGS is None:
        _SETTINGS = _registry()
    return _SETTINGS


def validate_settings(settings: dict[str, Any]) -> None:
    """A ConfigError naming the key for an unknown setting (with a suggestion) or a bad value.
    `args.*` keys are the script's own flags: set on its command line, not patched."""
    from trainspeed.config_io import did_you_mean

    registry = settings_registry()
    for key, value in settings.items():
        if str(key).startswith(FLAG_PREFIX):
            continue
        spec = registry.get(key)
        if spec is None:
            guess = did_you_mean(str(key), list(registry))
            hint = f"did you mean '{guess}'? " if guess else ""
            raise ConfigError(f"unknown setting '{key}'; {hint}known settings: {', '.join(registry)} "
                              "(and args.<flag> for the script's own flags)")
        if not spec.check(value):
            raise ConfigError(f"setting {key} must be {spec.allowed}, got {value!r}")


class Applied:
    """Handle of installed settings: `uninstall()` undoes every patch; `notes` say what each
    did, or why it did nothing (some are added while the script runs)."""

    def __init__(self, ctx: InstallContext) -> None:
        self._ctx = ctx
        self.notes = ctx.notes

    def uninstall(self) -> None:
        """Undo every patch (newest first). Calling it again does nothing."""
        self._ctx.imports.uninstall()
        self._ctx.patches.undo()

    def write_notes(self, path: str | Path) -> None:
        """The notes as JSON (`{"notes": [...]}`), written atomically."""
        from trainspeed.fileio import atomic_write_text

        atomic_write_text(Path(path), json.dumps({"notes": list(self.notes)}, indent=2) + "\n")


def install_settings(settings: dict[str, Any], targets: Targets | None = None, *,
                     say: Callable[[str], None] = print) -> Applied:
    """Validate, then install every setting; on any failure undo what was installed."""
    validate_settings(settings)
    ctx = InstallContext(patches=Patches(), imports=PostImportHooks(), targets=targets or Targets(),
                         notes=[], say=say)
    ctx.imports.install()
    handle = Applied(ctx)
    try:
        registry = settings_registry()
        for key, value in settings.items():
            if not str(key).startswith(FLAG_PREFIX):
                registry[key].install(value, ctx)
    except BaseException:
        handle.uninstall()
        raise
    return handle


__all__ = ["Applied", "InstallContext", "SettingSpec", "install_settings", "settings_registry", "validate_settings"]
