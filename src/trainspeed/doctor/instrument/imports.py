"""The doctor's post-import hooks are the shared ones of `trainspeed.patches`."""

from trainspeed.patches.imports import PostImportHooks

__all__ = ["PostImportHooks"]
