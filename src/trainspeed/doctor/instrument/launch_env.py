"""A script written for a launcher, run without one: rank 0 of 1.

`torch.distributed.init_process_group()` with the default env:// rendezvous, and
`deepspeed.initialize`, read RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from
the environment `torchrun` / `deepspeed` set. `python train.py` has none of them, and the
script stops in its rendezvous ("environment variable RANK expected"). The doctor's and the
tune's runs are one process unless they were launched under torchrun (the tune's trials always
are: one process per trial), so while the script runs, the doctor sets the one-process
environment a launcher would give (rank 0 of 1, a free local port), says so on stderr and
records it (observation "one_process_launch"): a DDP script doctored under torchrun can then be
tuned, and its verify commands run, as written. Nothing is set when any launcher or MPI
variable is there, or when the script passes its own rendezvous (a store, an init_method other
than env://, its own rank and world size).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Callable

from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.engine.deepspeed_facts import one_process_env


def add_one_process_env(patches: Patches, who: str, say: Callable[[str], None]) -> dict[str, str]:
    """Add the one-process launch environment (undone with `patches`) and say so through `say`;
    {} when a launcher's (or MPI's) environment is there already."""
    add = one_process_env()
    for key, value in add.items():
        patches.call_on_undo(lambda key=key: os.environ.pop(key, None))
        os.environ[key] = value
    if add:
        say(f"no launcher environment (RANK, WORLD_SIZE, LOCAL_RANK): {who} runs as one process "
            f"({' '.join(f'{k}={v}' for k, v in add.items())})")
    return add


def set_one_process_env(session: Session, patches: Patches, who: str) -> dict[str, str]:
    """add_one_process_env for the script's doctor run (undone at uninstall), observed."""
    # not print(): logs.py would count the doctor's own note as the script's logging
    add = add_one_process_env(patches, who, lambda text: sys.stderr.write(f"trainspeed doctor: {text}\n"))
    if add:
        session.observe("one_process_launch", "one_process_launch", added_env=add, by=who)
    return add


def _env_rendezvous(call: inspect.BoundArguments) -> bool:
    """The init_process_group call would read the launcher's variables: no store, env:// (the
    default), and no rank or world size of the script's own."""
    given = call.arguments
    return (given.get("store") is None and given.get("init_method") in (None, "env://")
            and given.get("world_size", -1) in (-1, None) and given.get("rank", -1) in (-1, None))


def _observe_group(session: Session, dist: Any) -> None:
    """The process group the script made (observation "process_group"): its size says how many
    ranks trained, beside the ranks the doctor ran in (a script that starts its own ranks, as
    Lightning's DDP does, leaves all but this one unmeasured: checks/distributed.py)."""
    try:
        session.observe("process_group", "process_group", world_size=dist.get_world_size(), rank=dist.get_rank(),
                        backend=str(dist.get_backend()))
    except Exception:  # noqa: BLE001 - a group torch could not describe: nothing to record
        pass


def install(session: Session, patches: Patches) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return

    def make(original: Any) -> Any:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            if session.enabled:
                try:
                    call = signature.bind(*args, **kwargs)
                except TypeError:  # a wrong call: torch says what is wrong with it
                    call = None
                if call is not None and _env_rendezvous(call):
                    set_one_process_env(session, patches, "torch.distributed")
            result = original(*args, **kwargs)
            if session.enabled:
                _observe_group(session, dist)
            return result

        return init_process_group

    # the script may call either name (`from torch.distributed import init_process_group`)
    patches.wrap(dist, "init_process_group", make)
    patches.wrap(dist.distributed_c10d, "init_process_group", make)
    patches.wrap(os._Environ, "__getitem__", lambda original: _make_getitem(
        lambda: session.enabled, lambda who: set_one_process_env(session, patches, who), original))


def launcher_env_reads(say: Callable[[str], None]) -> Patches:
    """The same for `trainspeed run --with best.yaml -- python train_torch.py` (no doctor
    session): the tune's own trials ran the script as rank 0 of 1, and the command it prints to
    run its winners failed with "KeyError: 'LOCAL_RANK'". Undo the returned Patches after."""
    patches = Patches()
    patches.wrap(os._Environ, "__getitem__", lambda original: _make_getitem(
        lambda: True, lambda who: add_one_process_env(patches, who, say), original))
    return patches


_RANK_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_STDLIB = os.path.dirname(os.__file__) + os.sep


def _make_getitem(enabled: Callable[[], bool], set_env: Callable[[str], dict[str, str]], original: Any) -> Any:
    """`os.environ["LOCAL_RANK"]` read by the script's own line, without a launcher: the script
    needs one (Lightning's examples/fabric/reinforcement_learning/train_torch.py reads LOCAL_RANK,
    RANK and WORLD_SIZE before its init_process_group). The doctor ran it under torchrun, and the
    tune it then named, `trainspeed tune -- python train_torch.py` (a tune's trials are one
    process), failed at once: "KeyError: 'LOCAL_RANK'". Such a read now gets the one-process
    environment, as init_process_group does. `os.environ.get("RANK", -1)` and `"RANK" in
    os.environ` (nanoGPT's test for DDP) are the standard library's reads, and libraries' reads
    are theirs: nothing is set for them, so a script that asks whether it was launched is told no."""
    def __getitem__(self: Any, key: Any) -> Any:
        try:
            return original(self, key)
        except KeyError:
            if key in _RANK_KEYS and self is os.environ and enabled() and _script_read():
                if set_env(f"the script (it reads os.environ[{key!r}])"):
                    return original(self, key)
            raise

    return __getitem__


def _script_read() -> bool:
    """The read came from the script's own line: the frame above the wrapper is neither the
    standard library (Mapping.get, __contains__) nor an installed package."""
    from trainspeed.patches.installed import installed_package

    try:
        filename = sys._getframe(2).f_code.co_filename
    except ValueError:
        return False
    return not filename.startswith(_STDLIB) and not filename.startswith("<") and installed_package(filename) is None


__all__ = ["add_one_process_env", "install", "launcher_env_reads", "set_one_process_env"]
