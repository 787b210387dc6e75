"""Turn what the session saw into "observation" events in events.jsonl.

Every fact a check needs is written to the run directory, so the checks run on any run
directory later (`diagnose(read_run(path))`), not only inside the doctor process.
Event shape: {"type": "observation", "data": {"kind": <kind>, ...fields}}.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from trainspeed.doctor.instrument.dataloader import available_cores
from trainspeed.doctor.instrument.files import growth, snapshot
from trainspeed.doctor.instrument.session import Session
from trainspeed.telemetry.cuda_facts import cuda_device_facts


def _device_facts(accelerator: str | None) -> dict[str, Any]:
    facts: dict[str, Any] = {"type": accelerator or "cpu", "cores": available_cores(),
                             "cuda_available": torch.cuda.is_available()}
    # Only read CUDA properties when the script initialized CUDA: the doctor must not create
    # a CUDA context for a CPU-only script.
    if accelerator == "cuda":
        facts.update(cuda_device_facts())
    facts["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return facts


def _median_key(counts: Counter[int] | dict[int, int]) -> int | None:
    total = sum(counts.values())
    if not total:
        return None
    ordered = sorted(counts.items())
    half, seen = total / 2, 0
    for key, n in ordered:
        seen += n
        if seen >= half:
            return key
    return ordered[-1][0]


def _accumulation(session: Session) -> dict[str, Any]:
    """Backward passes per step outside the optimizer's step (micro-batches); backwards inside
    `optimizer.step(closure)` are closure evaluations of one batch, reported apart."""
    counts = session.accumulation
    return {"factor": _median_key(counts), "counts": {str(k): v for k, v in sorted(counts.items())},
            "closure_evaluations": _median_key(session.closure_evaluations),
            "closure_counts": {str(k): v for k, v in sorted(session.closure_evaluations.items())}}


def _updates(session: Session) -> dict[str, dict[str, Any]]:
    """Extra fields of the optimizer and model observations: each optimizer's name (the
    variable its construction line assigns), the modules it updates and its micro-batches per
    update; each model's optimizers (`trained_by`). Keyed by observation key."""
    from trainspeed.doctor.instrument.updates import assigned_name

    updates = session.updates
    extra: dict[str, dict[str, Any]] = {}
    for key, obs in session.observations.items():
        if not key.startswith("optimizer:"):
            continue
        opt = int(key.split(":", 1)[1])
        site = obs.get("site_path")
        name = assigned_name(tuple(site)) if site else None
        modules = updates.updated.get(opt, (0, []))[1]
        # what it updates of them: the Lightning GAN's generator, not the GAN that holds it
        classes = updates.over.get(opt) or [updates.classes[k] for k in modules]
        micro = updates.micro.get(opt)
        extra[key] = {"name": name or obs.get("class"), "updates": classes,
                      "micro_batches": _median_key(micro) if micro else None}
        for module in modules:
            model = extra.setdefault(f"module:{module}", {"trained_by": []})
            model["trained_by"].append(name or obs.get("class"))
    return extra


def _step_boundary(session: Session) -> dict[str, Any]:
    """What closed the steps ("optimizer", "backward", "mark", None: nothing did) and what the
    run showed, so a run without steps can say what it saw and how to mark a step."""
    dim = session.batch_dims.get(session.train_module) if session.train_module is not None else None
    return {"source": session.boundary, "forwards": session.seen["forwards"],
            "backwards": session.seen["backwards"], "optimizer_steps": session.seen["optimizer_steps"],
            "marks": session.seen["marks"], "input_batch_dim": dim,
            "unseen_forward_steps": session.unseen_forward_steps,
            # no-grad forwards that opened "eval": collecting experience (module.py) or evaluating
            "rollout_forwards": session.seen["rollout_forwards"], "eval_forwards": session.seen["eval_forwards"]}


def _loaders(session: Session) -> list[dict[str, Any]]:
    """The loaders, the training loader first with role "train". The role recorded at iter()
    time can be wrong: Lightning iterates its training loader right after the sanity-check
    validation, while that evaluation is still open. Evidence decides: the loader most of
    whose batches were fetched for training (train_batches, when recorded), else the one whose
    batch size is the training batch's."""
    infos = [dict(info) for info in session.loaders.values()]
    if not infos:
        return infos
    fetched = [i for i in infos if i.get("train_batches")]
    train = max(fetched, key=lambda i: i["train_batches"]) if fetched else None
    if train is None:
        batch = session.observations.get("batch") or {}
        sizes = {batch.get("batch_size"), batch.get("max_batch_size")} - {None}
        matching = [i for i in infos if i.get("batch_size") in sizes]
        train = next((i for i in matching if i.get("role") == "train"), matching[0] if matching else None)
    if train is None:
        return infos
    if train.get("role") != "train":
        train["recorded_role"] = train.get("role")
        train["role"] = "train"
    return [train, *(i for i in infos if i is not train)]


def _checkpoint_files(paths: set[str]) -> dict[str, Any]:
    existing = [p for p in paths if os.path.exists(p)]
    size = 0
    for p in existing:
        try:
            size += os.path.getsize(p)
        except OSError:
            pass
    return {"distinct_paths": len(paths), "existing": len(existing), "bytes": size}


def emit_observations(monitor: Any, session: Session, *, files_before: dict[str, int] | None,
                      run_dir: Path, stopped: str, exit_code: int, max_steps: int | None,
                      error: str | None = None, pythonpath: str | None = None, env: dict[str, str] | None = None,
                      ended_ranks: int = 0, said: str | None = None) -> None:
    """Write every observation of the session as an event (call before monitor.close());
    `error`: the script's exception as 'Type: first line' when it crashed; `pythonpath`: the
    PYTHONPATH entries the script's imports needed (instrument/import_path.py); `env`: the
    variables that change how torch or the script runs, as the doctor started (instrument/run_env.py),
    which every suggested command carries; `ended_ranks`: the ranks the script had started that the
    doctor ended with it (doctor/started_ranks.py); `said`: the line the script printed as it exited
    itself (doctor/script_exit.py)."""
    def emit(kind: str, **data: Any) -> None:
        monitor.event("observation", kind=kind, **data)

    extra = _updates(session)
    for key, obs in session.observations.items():
        data = dict(obs)
        kind = data.pop("kind")
        if key in ("compiled",):
            continue
        if kind == "model":
            data.setdefault("trained_by", [])
        data.update(extra.get(key, {}))
        emit(kind, **data)
    for info in _loaders(session):
        emit("dataloader", **info)
    emit("device", **_device_facts(session.accelerator))
    emit("accumulation", **_accumulation(session))
    emit("step_boundary", **_step_boundary(session))
    emit("call_sites", rows=session.sites.top(), totals={
        cat: {kind: {"count": st.count, "seconds": st.seconds}
              for kind, st in session.sites.totals(cat).items()}
        for cat in ("sync", "log", "ckpt", "lookup", "env")
    })
    emit("checkpoint_files", **_checkpoint_files(session.checkpoint_paths))
    if files_before is not None:
        emit("files", **growth(files_before, snapshot(os.getcwd(), exclude=run_dir)))
    emit("doctor", stopped=stopped, exit_code=exit_code, steps=monitor.steps_done,
         max_steps=max_steps, compiled=bool(session.observations.get("compiled")), error=error,
         **({"pythonpath": pythonpath} if pythonpath else {}), **({"env": env} if env else {}),
         **({"ended_ranks": ended_ranks} if ended_ranks else {}), **({"said": said} if said else {}))
