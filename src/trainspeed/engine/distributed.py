"""Data parallelism on PyTorch's own engine: process group, DDP / FSDP2 wrapping, reductions.

Launch with torchrun (it sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT):

    torchrun --nproc_per_node 2 -m trainspeed train gpt distributed.strategy=ddp

`data.batch_size` is per process: 2 ranks x batch b trains on 2b samples per step, the same
samples (and, without dropout, the same loss curve) as one process with batch 2b.

What lives here and why:
- `setup_distributed` opens the process group with a timeout (gloo on CPU, nccl on CUDA), so a
  dead or hung rank turns into an error on the others instead of a hang.
- `wrap_model` applies DDP or FSDP2 (`fully_shard`) before the optimizer is built (FSDP2
  replaces parameters by sharded DTensors, and the optimizer must hold those).
- Losses are all-reduced at the log interval only (`Dist.reduce_mean_`), never per step.
  Every collective issued here is timed on the host (`Dist.collective_times`), reported once
  at the end of the run.
- Checkpoints: DDP state is identical on every rank, so rank 0 writes it. FSDP checkpoints
  are sharded: every rank writes its shards with torch.distributed.checkpoint (see
  checkpoint/sharded.py), and DCP reshards them when the world size changes. A single-file
  checkpoint still loads into an FSDP model (FsdpState.load_views).
- Signal and crash saves under FSDP need every rank: `signal_agreement` and
  `crash_agreement` are the small CPU collectives by which the ranks agree on them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainspeed.errors import ConfigError, TrainspeedError


class DistributedError(TrainspeedError):
    """A collective failed: another rank died, hung past distributed.timeout_s, or the
    process group could not be formed."""


def env_world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from torchrun's environment; (0, 0, 1) without it."""
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", rank))
    world = int(os.environ.get("WORLD_SIZE", 1))
    return rank, local, world


def resolve_backend(backend: str, device: torch.device) -> str:
    """auto -> nccl for CUDA devices, gloo otherwise; nccl without CUDA is a ConfigError."""
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError(
            f"distributed.backend=nccl needs CUDA devices but this run uses {device}; "
            "use distributed.backend=auto (gloo on CPU)")
    return backend


@dataclass(slots=True)
class Dist:
    """This process's place in the job. `active` is False for a single-process run, and then
    every method is a no-op, so the Trainer calls them unconditionally."""

    strategy: str = "none"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    backend: str | None = None
    timeout_s: float = 1800.0
    notes: list[str] = field(default_factory=list)
    collective_times: dict[str, list[float]] = field(default_factory=dict)
    """what -> [calls, seconds]: host time in each kind of collective issued through this
    object (a handful of names, so it does not grow with the steps)."""
    owned_env: list[str] = field(default_factory=list)
    """Environment variables this process set for itself (a one-process DeepSpeed run's
    RANK, WORLD_SIZE, ...), removed again by teardown."""

    @property
    def active(self) -> bool:
        return self.backend is not None

    @property
    def fsdp(self) -> bool:
        return self.active and self.strategy == "fsdp"

    @property
    def deepspeed(self) -> bool:
        return self.active and self.strategy == "deepspeed"

    @property
    def sharded_saves(self) -> bool:
        """Every rank writes its part of every checkpoint (FSDP's DCP shards, DeepSpeed's ZeRO
        partitions), so saves, signal exits and crash saves need all ranks together."""
        return self.fsdp or self.deepspeed

    # ------------------------------------------------------------ collectives
    def _guard(self, what: str, fn, *args, **kwargs):
        """Run one collective; a failure (dead peer, timeout) becomes a DistributedError that
        says which rank saw it and what to look at."""
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except TrainspeedError:
            raise
        except Exception as exc:  # noqa: BLE001 - gloo/nccl raise RuntimeError subclasses
            raise collective_error(self, what, exc) from exc
        finally:
            entry = self.collective_times.setdefault(what, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    def collective_summary(self) -> dict[str, dict[str, float]]:
        """{what: {"calls", "seconds"}} for the run's `collectives` event. Host time: on gloo
        the whole collective (it blocks); on nccl the launch plus the copy of the result to
        the host that follows it (the reductions here end in .cpu()/.item())."""
        return {what: {"calls": int(n), "seconds": round(sec, 6)}
                for what, (n, sec) in sorted(self.collective_times.items())}

    def new_cpu_group(self, what: str) -> Any:
        """A new gloo process group over all ranks (a collective: every rank calls it in the
        same order). For collectives that must not share a group with training's own: DCP's
        async save runs its collectives from a background thread."""
        if not self.active:
            return None
        import torch.distributed as dist

        return self._guard(what, dist.new_group, backend="gloo",
                           timeout=timedelta(seconds=self.timeout_s))

    def barrier(self, what: str = "barrier") -> None:
        if self.active:
            import torch.distributed as dist

            self._guard(what, dist.barrier)

    def reduce_mean_(self, tensor: torch.Tensor, what: str = "loss all-reduce") -> torch.Tensor:
        """In-place mean over ranks (one all-reduce)."""
        if self.active:
            import torch.distributed as dist

            self._guard(what, dist.all_reduce, tensor, op=dist.ReduceOp.SUM)
            tensor.div_(self.world_size)
        return tensor

    def reduce_sum_(self, tensor: torch.Tensor, what: str = "sum all-reduce") -> torch.Tensor:
        if self.active:
            import torch.distributed as dist

            self._guard(what, dist.all_reduce, tensor, op=dist.ReduceOp.SUM)
        return tensor

    def loss_reducer(self, device: torch.device):
        """For Monitor(reduce_losses=...): the mean of each step's loss over ranks, one
        all-reduce per log interval (nccl needs the values on the GPU, gloo on the CPU)."""
        if not self.active:
            return None
        where = device if self.backend == "nccl" else torch.device("cpu")

        def reduce(losses: Any) -> Any:
            t = torch.as_tensor(losses, dtype=torch.float64, device=where)
            if where.type == "cuda":
                t = t.float()  # nccl reduces float32 everywhere; a step loss needs no more
            return self.reduce_mean_(t).double().cpu().numpy()

        return reduce

    def close_monitor(self, mon: Any) -> dict[str, Any]:
        """Close every rank's Monitor so that rank 0 sees the others' files complete: the last
        (collective) flush on all ranks together, then ranks r > 0 close, then rank 0 reads
        everything into its summary."""
        if not self.active:
            return mon.close()
        mon.flush()
        summary = mon.close() if self.rank != 0 else None
        self.barrier("end-of-run barrier")
        return mon.close() if self.rank == 0 else summary

    def agree(self, values: list[int], op: str, group: Any, what: str,
              timeout_s: float | None = None) -> list[int]:
        """Element-wise MIN or MAX of small integers over ranks, on a CPU (gloo) group. A
        collective: every rank calls it at the same point. `timeout_s` bounds this one wait."""
        if not self.active:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.int64)
        reduce_op = dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX

        def run() -> None:
            work = dist.all_reduce(t, op=reduce_op, group=group, async_op=True)
            if timeout_s is None:
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=timeout_s))

        self._guard(what, run)
        return [int(v) for v in t.tolist()]

    def broadcast_object(self, obj: Any, what: str = "broadcast") -> Any:
        """Rank 0's `obj` on every rank (used for the run directory name)."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        self._guard(what, dist.broadcast_object_list, box, src=0)
        return box[0]

    def gather_objects(self, obj: Any, what: str = "gather") -> list[Any]:
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        self._guard(what, dist.all_gather_object, out, obj)
        return out

    def teardown(self) -> None:
        if self.active:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.backend = None
        for key in self.owned_env:
            os.environ.pop(key, None)
        self.owned_env = []


def collective_error(d: Dist, what: str, exc: BaseException) -> DistributedError:
    return DistributedError(
        f"rank {d.rank} of {d.world_size}: the {what} failed ({type(exc).__name__}: "
        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else 'no message'}). Another rank "
        f"probably died or stalled for longer than distributed.timeout_s={d.timeout_s:g}; its own "
        "output (torchrun prints which rank failed and its exit code) says why.")


def setup_distributed(cfg: Any, device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group torchrun prepared; returns (Dist, this rank's device).

    Not launched by torchrun (WORLD_SIZE unset or 1): single process, strategy ignored with a
    note. Launched by torchrun with strategy none: a ConfigError, since N processes would
    each train the full model on a shard of the data and overwrite one run directory."""
    d = cfg.distributed
    if d.strategy == "deepspeed":
        from trainspeed.engine.deepspeed_engine import check_compatible, one_process_env

        check_compatible(cfg)
        owned = one_process_env() if env_world()[2] <= 1 else []  # a group even for one rank
    else:
        owned = []
    rank, local, world = env_world()
    if world <= 1 and d.strategy != "deepspeed":
        out = Dist(strategy="none", timeout_s=d.timeout_s)
        task = os.environ.get("SLURM_PROCID", "0")
        if task not in ("", "0"):  # srun's task 1..: data parallel, or a sweep of separate runs
            out.notes.append(f"SLURM task {task} of an srun step trains alone: trainspeed takes data-parallel "
                             "ranks from torchrun (srun --ntasks-per-node=1 torchrun --nproc_per_node N -m "
                             "trainspeed train ...; docs/distributed.md)")
        if d.strategy != "none":
            out.notes.append(f"distributed.strategy={d.strategy} ignored: one process (launch with "
                             "torchrun --nproc_per_node N to train data-parallel)")
        return out, device
    if d.strategy == "none":
        raise ConfigError(
            f"this process is one of WORLD_SIZE={world} (launched by torchrun) but "
            "distributed.strategy is none: every rank would train alone and overwrite the same "
            "run directory. Set distributed.strategy=ddp (or fsdp, deepspeed), or launch one process.")
    if cfg.checkpoint.every_minutes is not None and d.strategy in ("fsdp", "deepspeed"):
        raise ConfigError(
            f"checkpoint.every_minutes is not supported with distributed.strategy={d.strategy}: every rank "
            "must join the save at the same step, and clocks differ between ranks. Use "
            "checkpoint.every_steps instead.")
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    backend = resolve_backend(d.backend, device)
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError("this PyTorch build has no torch.distributed; use distributed.strategy=none")
    out = Dist(strategy=d.strategy, rank=rank, local_rank=local, world_size=world,
               backend=backend, timeout_s=d.timeout_s, owned_env=owned)
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=d.timeout_s),
                                    rank=rank, world_size=world)
        except Exception as exc:  # noqa: BLE001
            raise DistributedError(
                f"rank {rank} of {world}: could not form the {backend} process group "
                f"({type(exc).__name__}: {exc}). Check MASTER_ADDR/MASTER_PORT (torchrun "
                "--rdzv-endpoint) and that every node can reach it.") from exc
    out.notes.append(f"distributed: {d.strategy} on {world} rank{'s' if world > 1 else ''} ({backend}), "
                     f"per-rank batch data.batch_size={cfg.data.batch_size}")
    return out, device


# ------------------------------------------------------------------ wrapping
def shard_units(model: nn.Module) -> list[nn.Module]:
    """Modules FSDP2 shards separately: each element of every nn.ModuleList (transformer
    blocks, stages). Gathering one block's parameters at a time is what bounds memory."""
    units: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            units.extend(m for m in module if any(True for _ in m.parameters()))
    return units


def wrap_model(model: nn.Module, eager: nn.Module, d: Dist, device: torch.device) -> tuple[nn.Module, list[str]]:
    """(module the loop calls, notes). DDP wraps what prepare_model returned; FSDP2 shards
    the eager module in place (so it must run before the optimizer is built)."""
    if not d.active or d.strategy == "deepspeed":  # DeepSpeed wraps once the optimizer exists
        return model, []
    if d.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        return DDP(model, device_ids=ids), ["DDP: gradients all-reduced in buckets during backward"]
    from torch.distributed.fsdp import fully_shard

    units = shard_units(eager)
    for unit in units:
        fully_shard(unit)
    fully_shard(eager)
    return model, [f"FSDP2: fully_shard on {len(units)} blocks + the root module"]


def rank_run_dir(run_dir: Path, rank: int) -> Path:
    """Where rank r writes its own step records: the run directory for rank 0,
    `ranks/rank<r>/` inside it for the others (see telemetry.ranks)."""
    from trainspeed.telemetry.ranks import rank_dir

    return rank_dir(run_dir, rank)


# ------------------------------------------------------------------ FSDP state
class _FsdpModelLoader(nn.Module):
    """What restore_checkpoint loads into under FSDP: its key/shape checks see the sharded
    model's state dict (DTensors report global shapes); loading distributes the full tensors."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.__dict__["_target"] = model  # not a submodule: no `_target.` key prefix

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._target.state_dict()

    def load_state_dict(self, sd: Any, strict: bool = True, assign: bool = False):  # type: ignore[override]
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        return set_model_state_dict(self._target, sd, options=StateDictOptions(full_state_dict=True, strict=strict))


def _param_names(model: nn.Module, optimizer: Any) -> list[str]:
    """Names of the optimizer's parameters in its own order (groups, then params)."""
    from trainspeed.engine.checkpoint.state import unwrap_model, _normalize_key

    by_id = {id(p): _normalize_key(n) for n, p in unwrap_model(model).named_parameters()}
    names = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in by_id:
                raise ConfigError("the optimizer holds a parameter that is not the model's; "
                                  "build the optimizer from model.parameters()")
            names.append(by_id[id(p)])
    return names


def _keyed_by_name(sd: dict[str, Any]) -> bool:
    groups = sd.get("param_groups") or []
    return any(isinstance(p, str) for g in groups for p in g.get("params", []))


def optim_state_by_name(sd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """optimizer.state_dict() (params as indices) -> the name-keyed form of a full FSDP state."""
    if _keyed_by_name(sd):
        return sd
    return {"state": {names[int(i)]: v for i, v in sd.get("state", {}).items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in sd["param_groups"]]}


def optim_state_by_index(sd: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The name-keyed form (saved under FSDP) -> optimizer.state_dict()'s index-keyed form."""
    if not _keyed_by_name(sd):
        return sd
    index = {n: i for i, n in enumerate(names)}
    missing = [n for g in sd["param_groups"] for n in g["params"] if n not in index]
    if missing:
        raise ConfigError(f"optimizer state names parameters this model lacks: {', '.join(missing[:5])}")
    return {"state": {index[n]: v for n, v in sd.get("state", {}).items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in sd["param_groups"]]}


class OptimizerLoader:
    """What restore_checkpoint loads optimizer state into: it accepts both the index-keyed
    state of a single-process/DDP checkpoint and the name-keyed state an FSDP job saves, so
    checkpoints move between strategies and world sizes."""

    def __init__(self, model: nn.Module, optimizer: Any, *, sharded: bool) -> None:
        self.model, self.optimizer, self.sharded = model, optimizer, sharded
        self.param_groups = optimizer.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()  # restore_checkpoint compares group sizes only

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        names = _param_names(self.model, self.optimizer)
        if not self.sharded:
            self.optimizer.load_state_dict(optim_state_by_index(sd, names))
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, optim_state_by_name(sd, names),
                                 options=StateDictOptions(full_state_dict=True))


class FsdpState:
    """Model/optimizer views for loading a single-file checkpoint (full state dict, from one
    process or DDP) into a sharded model: every rank reads the whole file and keeps its shard,
    so a one-process checkpoint resumes on N FSDP ranks. (FSDP saves are sharded DCP
    directories; see checkpoint/sharded.py.)"""

    def __init__(self, model: nn.Module, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def load_views(self) -> tuple[_FsdpModelLoader, OptimizerLoader]:
        return _FsdpModelLoader(self.model), OptimizerLoader(self.model, self.optimizer, sharded=True)


def _is_collective_failure(exc: BaseException) -> bool:
    """A gloo/nccl/store failure as PyTorch raises it (DistError subclasses, or RuntimeError
    text from the backends)."""
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "nccl", "connection closed", "connection reset",
                                  "timed out", "timeout", "broken pipe", "process group"))


def clear_error(d: Dist, exc: BaseException) -> DistributedError | None:
    """A raw collective failure (e.g. inside DDP's backward all-reduce) as a DistributedError
    naming this rank and the likely cause; None for anything else (raised as it is)."""
    if d.active and not isinstance(exc, TrainspeedError) and isinstance(exc, Exception) \
            and _is_collective_failure(exc):
        return collective_error(d, "training step's collective", exc)
    return None


# ------------------------------------------------------------------ save agreements (FSDP)
def signal_agreement(d: Dist, group: Any, every: int) -> Callable[[bool, int], bool]:
    """For CheckpointSession(agree_signal=...): every `every` steps the ranks take the MAX of
    "this rank got SIGTERM/SIGINT" (one all-reduce of one integer on a CPU group, no device
    sync), so all of them save and exit at the same step boundary. torchrun signals every
    rank, but not at the same instant: without agreeing, one rank would enter the save while
    another starts the next step, and both would wait for each other until the timeout."""

    def agree(requested: bool, step: int) -> bool:
        if step % every:
            return False
        return bool(d.agree([int(requested)], "max", group, "signal agreement")[0])

    return agree


def crash_agreement(d: Dist, group: Any, timeout_s: float,
                    step_fn: Callable[[], int]) -> Callable[[BaseException], str | None]:
    """For CheckpointSession(agree_crash=...): a crash save under FSDP needs every rank's
    shards, so it runs only when every rank raised a training error (not a failed
    collective) at the same step, e.g. an exception in loss_fn raised on all ranks. A rank
    that died, or that still waits inside a training collective, never joins: after
    `timeout_s` this rank gives up and reports why instead of saving a partial checkpoint."""

    def agree(exc: BaseException) -> str | None:
        failed_collective = isinstance(exc, DistributedError) or _is_collective_failure(exc)
        step = int(step_fn())
        mine = [0 if failed_collective else 1, step, -step]
        try:
            ok, low, neg_high = d.agree(mine, "min", group, "crash agreement", timeout_s=timeout_s)
        except DistributedError as err:
            return (f"not every rank joined the crash save within {timeout_s:g} s ({err}); a rank "
                    "that died or still waits in a training collective cannot write its shards")
        if not ok:
            return "another rank failed in a collective (it lost a peer), so not every rank can write its shards"
        if low != -neg_high:
            return f"the ranks crashed at different steps ({low} to {-neg_high})"
        return None

    return agree
