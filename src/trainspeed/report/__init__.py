"""Reports: render run directories to the terminal (rich) and to self-contained HTML.

This layer reads run directories only; it imports `trainspeed.telemetry` and nothing above
it, so the engine, the doctor and the tuner can all render with it. matplotlib (the `report`
extra) is imported only when HTML is written.
"""

from __future__ import annotations

_LAZY = {
    "render_run": ("trainspeed.report.render", "render_run"),
    "render_compare": ("trainspeed.report.render", "render_compare"),
    "render_terminal": ("trainspeed.report.terminal", "render_terminal"),
    "render_terminal_compare": ("trainspeed.report.terminal", "render_terminal_compare"),
    "write_html": ("trainspeed.report.html", "write_html"),
    "load_run": ("trainspeed.report.load", "load_run"),
    "LoadedRun": ("trainspeed.report.load", "LoadedRun"),
    "compare_rows": ("trainspeed.report.compare", "compare_rows"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'trainspeed.report' has no attribute {name!r}")


__all__ = list(_LAZY)
