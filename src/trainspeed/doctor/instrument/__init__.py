"""Instrumentation of an unchanged training script: one module per hook family.

`install(session)` patches torch (and, once imported, tensorboard/wandb/deepspeed) and returns an
`Installed` whose `uninstall()` undoes every patch; tests run many doctors in one process.
"""

from __future__ import annotations

from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session, StopDoctor


class Installed:
    """Handle of the installed instrumentation."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.patches = Patches()
        self.imports = PostImportHooks()

    def uninstall(self) -> None:
        """Undo every patch; the script's run is over when this is called, so its DataLoader
        workers are stopped too (dataloader.stop_workers)."""
        from trainspeed.doctor.instrument.dataloader import stop_workers

        self.session.close()
        self.imports.uninstall()
        self.patches.undo()
        stop_workers(self.session)


def install(session: Session) -> Installed:
    """Install every hook family. On failure, whatever was installed is undone."""
    from trainspeed.doctor.instrument import (autograd, checkpoint, compiled_calls, dataloader, deepspeed,
                                              environments, flags, launch_env, logs, lookups, module, moved,
                                              optimizer, syncs, transfers)

    handle = Installed(session)
    try:
        dataloader.install(session, handle.patches)
        observe_pre, observe_post = module.install(session, handle.patches)
        train_pre = autograd.install(session, handle.patches)
        compiled_calls.install(handle.patches, pre=(train_pre, observe_pre), post=observe_post)
        optimizer.install(session, handle.patches)
        moved.install(session, handle.patches)
        syncs.install(session, handle.patches)
        lookups.install(session, handle.patches)
        transfers.install(session, handle.patches)
        checkpoint.install(session, handle.patches)
        flags.install(session, handle.patches, handle.imports)
        logs.install(session, handle.patches, handle.imports)
        deepspeed.install(session, handle.patches, handle.imports)
        launch_env.install(session, handle.patches)
        environments.install(session, handle.patches, handle.imports)
        handle.imports.install()
    except BaseException:
        handle.uninstall()
        raise
    return handle


__all__ = ["Installed", "PostImportHooks", "Session", "StopDoctor", "install"]
