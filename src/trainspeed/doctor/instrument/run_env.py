"""Which environment variables a command the doctor suggests must carry: those that change how
torch or the script behaves. pytorch/examples' time_sequence_prediction crashes on torch.load
unless TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1; the doctor run with it set printed `trainspeed tune
... -- python train.py` without it, which crashed again as written. Repeating a variable the
user had exported anyway is harmless; leaving one out is not.

Left out: what a launcher sets for the processes it starts (torchrun's
TORCH_NCCL_ASYNC_ERROR_HANDLING: the command starts the launcher again, which sets it again); what
torch or a library sets in its own process (LIBRARY_SETS, and TORCHINDUCTOR_CACHE_DIR at
inductor's default, written at a first compile: a doctor run in a process that compiled before);
what trainspeed set itself (own_env.py: the hf recipe's HF_HUB_OFFLINE) and its own TRAINSPEED_*
(none matches); and thread counts (OMP_NUM_THREADS,
MKL_NUM_THREADS: the tune's threads knob varies them, and the threads finding names them itself)."""

from __future__ import annotations

import os
import shlex
from typing import Mapping

__all__ = ["CARRIED_NAMES", "CARRIED_PREFIXES", "PARENT_ENV", "assignments", "carried_env"]

CARRIED_PREFIXES = ("TORCH_", "PYTORCH_", "TORCHINDUCTOR_")
CARRIED_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                           "HF_DATASETS_OFFLINE", "WANDB_MODE"})
LAUNCHER_SET = frozenset({"TORCH_NCCL_ASYNC_ERROR_HANDLING"})
"""Set by torchrun's agent in every worker (local_elastic_agent.py), default 1."""


LIBRARY_SETS = frozenset({
    "TORCH_WARM_POOL",  # torch's inductor, before it starts its compile pool
    "PYTORCH_NVML_BASED_CUDA_CHECK",  # lightning.fabric and deepspeed, when imported
    "PYTORCH_ENABLE_MPS_FALLBACK",  # accelerate, on a Mac
    "PYTORCH_CNDEV_BASED_MLU_CHECK",  # transformers' MLU check
})
"""Set in the process by torch or a library the script (or an earlier run in the same process)
imported, not by the user: the rerun's imports set them again. A doctor test that ran a
Lightning script printed `PYTORCH_NVML_BASED_CUDA_CHECK=1 trainspeed tune ...` for the next one."""


def _inductor_default_cache() -> str | None:
    """Inductor's default cache folder, which it writes into TORCHINDUCTOR_CACHE_DIR of its own
    process at the first compile (cache_dir_utils.cache_dir): a value found there is torch's
    unless the user chose another."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except Exception:  # noqa: BLE001 - an older torch: nothing to tell apart
        return None
    return os.path.abspath(default_cache_dir())


PARENT_ENV = "TRAINSPEED_CARRIED_ENV"
"""The carried variables of the `trainspeed doctor` process that started a launcher, as JSON
(cli/_launchers.py): a launcher sets its own in the processes it starts (DeepSpeed's
CUDA_VISIBLE_DEVICES=0,1), which the printed command, starting the launcher again, must not."""


def carried_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (this process's) that a command rerunning the script carries;
    under a launcher, those of the doctor process that started it (PARENT_ENV)."""
    import json

    from trainspeed.own_env import SET_BY_TRAINSPEED

    environ = os.environ if environ is None else environ
    if PARENT_ENV in environ:
        try:
            parent = json.loads(environ[PARENT_ENV])
        except ValueError:
            parent = None
        if isinstance(parent, dict):
            return {str(k): str(v) for k, v in parent.items()}
    # a torchrun worker (TORCHELASTIC_RUN_ID is the agent's) got LAUNCHER_SET from the agent
    left_out = LIBRARY_SETS | SET_BY_TRAINSPEED | (LAUNCHER_SET if "TORCHELASTIC_RUN_ID" in environ else frozenset())
    cache = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache is not None and os.path.abspath(cache) == _inductor_default_cache():
        left_out |= {"TORCHINDUCTOR_CACHE_DIR"}
    return {name: value for name, value in environ.items()
            if (name.startswith(CARRIED_PREFIXES) or name in CARRIED_NAMES) and name not in left_out}


def assignments(env: Mapping[str, str]) -> str:
    """`A=1 B='x y' ` (sorted by name, shell-quoted, a space after), or "" for none."""
    return "".join(f"{name}={shlex.quote(str(value))} " for name, value in sorted(env.items()))
