"""The doctor's patches use the shared install/uninstall machinery of `trainspeed.patches`."""

from trainspeed.patches.machinery import Patches

__all__ = ["Patches"]
