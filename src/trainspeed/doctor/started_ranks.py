"""The ranks a script started itself, ended when the doctor stops the script early.

Lightning's DDP run as `python train.py` starts its other ranks as new processes of the same
command (LOCAL_RANK=1, ...). When the doctor stops rank 0 at --steps (or on SIGTERM), those
ranks are left waiting for it at their next collective: on gloo they fail with "Connection
closed by peer" and a page of traceback; on NCCL they hang until its timeout (minutes). Lightning
itself SIGKILLs them when rank 0 is interrupted; the doctor does the same when it ends the run.
A rank is told from the script's other children by a LOCAL_RANK of its own in its environment:
not this process's at its start (what forked DataLoader workers show) nor its current one (what
a helper the script starts inherits, also when the doctor set the one-process launch variables,
instrument/launch_env.py).
"""

from __future__ import annotations

__all__ = ["end_started_ranks"]


def end_started_ranks() -> int:
    """SIGKILL this process's child processes that are other ranks; how many."""
    import os

    import psutil

    me = psutil.Process()
    try:
        mine = {me.environ().get("LOCAL_RANK"), os.environ.get("LOCAL_RANK")}
    except (psutil.Error, OSError):
        return 0
    ended = 0
    for child in me.children(recursive=False):
        try:
            rank = child.environ().get("LOCAL_RANK")
            if rank is not None and rank not in mine:
                child.kill()
                ended += 1
        except (psutil.Error, OSError):  # gone already, or not ours to read
            continue
    return ended
