"""DeepSpeed checkpoints with trainspeed's guarantees: one directory per step, written by
DeepSpeed's own `engine.save_checkpoint` and published like a sharded (DCP) checkpoint.

    checkpoints/step-00000006.ds/
      deepspeed/mp_rank_00_model_states.pt             DeepSpeed's module state (ZeRO-3: one per rank)
      deepspeed/zero_pp_rank_<r>_mp_rank_00_optim_states.pt   each rank's ZeRO partition (stage >= 1)
      zero_to_fp32.py                                   DeepSpeed's own converter to one fp32 file
      trainer_state.pt     counters, sampler position, schedule, RNG, config digest (rank 0)
      trainspeed.json      marker: step, world size, ZeRO stage, every file's size. Written LAST.

Every rank calls `save_checkpoint` (a collective: each writes its partition) into the same
temp directory `.step-00000006.ds.tmp-<rank 0's pid>-<hex>/`; after DeepSpeed's closing barrier
rank 0 writes trainer_state.pt and the marker, then renames the directory into place (sharded.py
`publish`). So keep-N pruning, `latest`, auto-resume past a corrupt directory, the signal save
and the crash save (every rank agrees first) work as for FSDP, and the directory is whole or
absent. DeepSpeed writes synchronously, so checkpoint.async_save has no effect here.

Resume on another number of ranks: ZeRO stage 0 (the whole optimizer state in the module file)
loads anywhere. ZeRO 1-3 partitions are per rank, and DeepSpeed refuses them on another world
size; they are converted first with DeepSpeed's own `ds_to_universal` (rank 0, into a temp
directory beside the checkpoint, removed after) and loaded as a universal checkpoint (with two
repairs to DeepSpeed's ZeRO-3 universal load, see _repair_zero3_universal_load). Measured on the
gpt recipe: ZeRO 1, 2 and 3 resume on the uninterrupted loss curve.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.atomic import load_verified
from trainspeed.engine.checkpoint.sharded import DEEPSPEED_SUFFIX, STATE_FILE, temp_tag, verify_dir
from trainspeed.errors import CheckpointError

TAG = "deepspeed"
"""DeepSpeed's `tag`: the subdirectory of the checkpoint directory its files go into."""
MODEL_FILE = f"{TAG}/mp_rank_00_model_states.pt"
ZERO3_MODEL_FILE = f"{TAG}/zero_pp_rank_0_mp_rank_00_model_states.pt"


class DeepSpeedIO:
    """The checkpoint writer/loader CheckpointManager.save_sharded and CheckpointSession.resume
    use under distributed.strategy=deepspeed (the same interface as sharded.ShardedIO)."""

    suffix, format = DEEPSPEED_SUFFIX, "deepspeed"
    synchronous = True  # save_checkpoint returns once written: checkpoint.async_save does not apply

    def __init__(self, engine: Any, *, world_size: int = 1, tag: str | None = None,
                 zero_stage: int = 0) -> None:
        self.engine = engine
        self.world_size = world_size
        self.zero_stage = zero_stage
        self.tag = tag or temp_tag()
        self.process_group = None
        # The file without which DeepSpeed did not finish: under ZeRO-3 every rank writes its
        # own module partition and rank 0's is the one that always exists.
        self.required_file = MODEL_FILE if zero_stage < 3 else ZERO3_MODEL_FILE

    # -- save -----------------------------------------------------------------------------------
    def state_dicts(self) -> dict[str, Any]:
        return {}  # DeepSpeed gathers its own state inside save_checkpoint

    def estimate_bytes(self) -> int:
        """About what a save writes before the first one says (a full disk's message): the
        module's weights plus, with Adam, an fp32 master copy and two moments per weight."""
        try:
            return sum(p.numel() for p in self.engine.module.parameters()) * 14
        except Exception:  # noqa: BLE001 - an estimate for a message, never a failure
            return 0

    def marker_meta(self) -> dict[str, Any]:
        return {"zero_stage": self.zero_stage}

    def start_save(self, tensors: dict[str, Any], tmp: Path, *, async_save: bool,
                   then: Callable[[], Any] | None = None) -> None:
        """Every rank: DeepSpeed writes its module file and this rank's ZeRO partition into
        `tmp`; `then` (rank 0) publishes once every rank is done (save_checkpoint ends in a
        barrier, so on return every rank's files are written)."""
        self.engine.save_checkpoint(str(tmp), tag=TAG, client_state={}, save_latest=False)
        if then is not None:
            then()

    @property
    def pending(self) -> bool:
        return False

    def wait(self) -> None:
        return None

    def close(self) -> None:
        return None

    # -- load -----------------------------------------------------------------------------------
    def load(self, path: str | Path) -> dict[str, Any]:
        """Module, optimizer partitions and DeepSpeed's own counters into the live engine;
        returns trainer_state.pt (counters, sampler, schedule, RNG) for restore_checkpoint."""
        path = Path(path)
        marker = verify_dir(path)
        fmt = marker.get("format", "dcp")
        if fmt != self.format:
            raise CheckpointError(
                f"{path} is a {fmt} checkpoint (distributed.strategy={'fsdp' if fmt == 'dcp' else fmt}); "
                "a DeepSpeed run resumes only DeepSpeed checkpoints. Resume it with the strategy that "
                "saved it, or start this run fresh (checkpoint.resume=null, auto_resume=false)")
        saved_ws = marker.get("world_size")
        saved_stage = marker.get("zero_stage", self.zero_stage)
        if saved_stage != self.zero_stage:
            raise CheckpointError(
                f"{path} was saved with ZeRO stage {saved_stage}, this run uses stage "
                f"{self.zero_stage}: DeepSpeed's optimizer partitions differ between stages. Set "
                f"distributed.zero_stage={saved_stage} to resume it")
        rest = load_verified(path / STATE_FILE)
        # ZeRO 1-3 partitions are per rank: on another number of ranks DeepSpeed loads them only
        # from its universal form (one file per parameter and state), converted here first.
        universal = saved_ws != self.world_size and self.zero_stage >= 1
        source = self._universal_copy(path) if universal else path
        try:
            self.engine._config.load_universal_checkpoint = universal  # what load_checkpoint reads
            loaded, _ = self.engine.load_checkpoint(str(source), tag=TAG, load_optimizer_states=True,
                                                    load_lr_scheduler_states=False)
            if universal and self.zero_stage == 3:
                _repair_zero3_universal_load(self.engine, source / TAG)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DeepSpeed asserts and raises RuntimeError alike
            raise CheckpointError(
                f"{path}: DeepSpeed could not load this checkpoint (saved by {saved_ws} rank(s), "
                f"ZeRO stage {saved_stage}) into this run of {self.world_size} rank(s): "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}. "
                "The model or the DeepSpeed config probably differs from the one that saved it") from exc
        finally:
            self.engine._config.load_universal_checkpoint = False
            if universal:
                _barrier()  # every rank has read the universal copy
                if _rank() == 0:
                    shutil.rmtree(source, ignore_errors=True)
        if loaded is None:
            raise CheckpointError(f"{path}: DeepSpeed found no checkpoint under {source / TAG}")
        return rest

    def _universal_copy(self, path: Path) -> Path:
        """Rank 0 converts `path`'s DeepSpeed files with DeepSpeed's own ds_to_universal into a
        temp directory beside it (the checkpoint itself stays as it was saved); every rank
        waits for it. The temp name is recognised and removed as stale if this process dies."""
        out = path.parent / f".{path.name}.tmp-{self.tag}-universal"
        if _rank() == 0:
            shutil.rmtree(out, ignore_errors=True)
            # A subprocess: the converter runs its own worker pools and prints progress bars.
            proc = subprocess.run(
                [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                 str(path / TAG), "--output_folder", str(out / TAG), "--inject_missing_state",
                 "--num_extract_workers", "1", "--num_merge_workers", "1"],
                capture_output=True, text=True)
            if proc.returncode:
                shutil.rmtree(out, ignore_errors=True)
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise CheckpointError(
                    f"{path}: converting the ZeRO partitions of {self.world_size} rank(s) to "
                    f"DeepSpeed's universal form failed ({tail[0]}); resume on the number of ranks "
                    "that saved it, or start fresh")
        _barrier()
        return out


def _repair_zero3_universal_load(engine: Any, folder: Path) -> None:
    """Undo two slips of DeepSpeed's ZeRO-3 universal load (0.19, stage3.py
    load_hp_checkpoint_state_from_checkpoint_dir_stage3), which made a resumed run drift from the
    uninterrupted one from its second step: it gives every parameter group the hyperparameters
    of group 0 (weight decay on the no-decay group), and one `step` tensor to every sub-group's
    state, so a step counts once per sub-group (Adam's bias correction runs ahead). Each group
    gets its own saved hyperparameters back, and each state its own step."""
    import torch

    inner = getattr(engine.optimizer, "optimizer", None)
    if inner is None:
        return
    saved = torch.load(folder / "zero" / "optimizer_state.pt", weights_only=False)
    groups = (saved.get("optimizer_state_dict") or {}).get("param_groups") or []
    if len(groups) == len(inner.param_groups):
        for group, kept in zip(inner.param_groups, groups):
            group.update({k: v for k, v in kept.items() if k != "params"})
    for state in inner.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.clone()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


class RefuseSingleFile:
    """What a DeepSpeed run would load a single-file checkpoint (`.pt`, from a one-process, DDP
    or earlier run) into: ZeRO keeps its own fp32 master copy of the weights, so loading only the
    module would be overwritten at the first step. Refused with the way out."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.param_groups: list[Any] = []

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.load_state_dict()  # restore_checkpoint reads it first, to compare structures
        return {}

    def load_state_dict(self, *args: Any, **kwargs: Any) -> None:
        raise CheckpointError(
            f"this checkpoint is a single file (saved without DeepSpeed); a DeepSpeed run resumes "
            f"only its own checkpoint directories (step-N.ds), since ZeRO keeps the {self.what} "
            "state in its own partitions. Resume it with the strategy that saved it, or start "
            "fresh (checkpoint.resume=null, checkpoint.auto_resume=false)")
