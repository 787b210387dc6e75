"""Settings applied to an unchanged training script at run time (`trainspeed tune -- CMD`
trials, `trainspeed run --with best.yaml -- CMD`).

The doctor observes; these change. Each setting is a plain function that installs a patch
through the shared machinery (machinery.Patches, imports.PostImportHooks), so everything is
undone on uninstall. Where a setting applies (the training DataLoader, the trained module,
the primary optimizer) comes from the doctor's records: targets.Targets.

    applied = install_settings({"loader.num_workers": 2, "precision": "bf16"}, targets)
    try:
        runpy.run_path("train.py", run_name="__main__")
    finally:
        applied.uninstall()
    print(applied.notes)
"""

from __future__ import annotations

from typing import Any

from trainspeed.patches.settings import Applied, install_settings, settings_registry, validate_settings


def __getattr__(name: str) -> Any:
    if name == "SETTINGS":  # built lazily: the registry imports every family
        return settings_registry()
    raise AttributeError(name)


__all__ = ["Applied", "SETTINGS", "install_settings", "validate_settings"]
