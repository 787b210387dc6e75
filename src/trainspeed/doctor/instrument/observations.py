"""Turn what the session saw into "observation" events in events.jsonl.

Every fact a check needs is written to the run directory, so the checks run on any run
directory later (`diagnose(read_run(path))`), not only inside the doctor process.
Event shape: {"type": "observation", "data": {"kind": <kind>, ...fields}}.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from trainspeed.doctor.instrument.dataloader import available_cores
from trainspeed.doctor.instrument.files import growth, snapshot
from trainspeed.doctor.instrument.session import Session


def _device_facts(accelerator: str | None) -> dict[str, Any]:
    facts: dict[str, Any] = {"type": accelerator or "cpu", "cores": available_cores(),
                             "cuda_available": torch.cuda.is_available()}
    # Only read CUDA properties when the script initialized CUDA: the doctor must not create
    # a CUDA context for a CPU-only script.
    if accelerator == "cuda" and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        facts.update(name=props.name, capability=f"{props.major}.{props.minor}",
                     total_memory=int(props.total_memory),
                     tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32),
                     tf32_cudnn=bool(torch.backends.cudnn.allow_tf32),
                     bf16_supported=bool(torch.cuda.is_bf16_supported()))
    facts["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    return facts


def _accumulation(session: Session) -> dict[str, Any]:
    counts = session.accumulation
    total = sum(counts.values())
    if not total:
        return {"factor": None, "counts": {}}
    ordered = sorted(counts.items())
    half, seen, median = total / 2, 0, ordered[-1][0]
    for backwards, n in ordered:
        seen += n
        if seen >= half:
            median = backwards
            break
    return {"factor": median, "counts": {str(k): v for k, v in ordered}}


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
                      run_dir: Path, stopped: str, exit_code: int, max_steps: int | None) -> None:
    """Write every observation of the session as an event (call before monitor.close())."""
    def emit(kind: str, **data: Any) -> None:
        monitor.event("observation", kind=kind, **data)

    for key, obs in session.observations.items():
        data = dict(obs)
        kind = data.pop("kind")
        if key in ("compiled",):
            continue
        emit(kind, **data)
    for info in session.loaders.values():
        emit("dataloader", **info)
    emit("device", **_device_facts(session.accelerator))
    emit("accumulation", **_accumulation(session))
    emit("call_sites", rows=session.sites.top(), totals={
        cat: {kind: {"count": st.count, "seconds": st.seconds}
              for kind, st in session.sites.totals(cat).items()}
        for cat in ("sync", "log", "ckpt")
    })
    emit("checkpoint_files", **_checkpoint_files(session.checkpoint_paths))
    if files_before is not None:
        emit("files", **growth(files_before, snapshot(os.getcwd(), exclude=run_dir)))
    emit("doctor", stopped=stopped, exit_code=exit_code, steps=monitor.steps_done,
         max_steps=max_steps, compiled=bool(session.observations.get("compiled")))
