"""Launching `trainspeed train gpt` as users do (one process, or torchrun with N) and reading
the loss curves back: shared by the distributed tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "recipe.options.size=null", "recipe.options.n_layer=2", "recipe.options.n_head=2",
    "recipe.options.n_embd=32", "recipe.options.block_size=32", "recipe.options.samples_per_epoch=512",
    "recipe.options.val_samples=32", "recipe.options.dropout=0.0",
    "run.max_steps=6", "run.torch_threads=1", "logging.every=1", "logging.warmup_steps=1",
    "logging.progress=false", "eval.at_end=false", "checkpoint.every_steps=3",
]
LOSS_RTOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(ws: Path) -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "TRAINSPEED_CACHE": str(ws / "cache"), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def cmd(ws: Path, name: str, overrides: list[str], nproc: int) -> list[str]:
    launch = [sys.executable]
    if nproc > 1:
        launch += ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                   "--master_port", str(free_port())]
    return launch + ["-m", "trainspeed", "train", "gpt", *TINY, f"run.out_dir={ws / 'runs'}",
                     f"run.name={name}", *overrides]


def train(ws: Path, name: str, *overrides: str, nproc: int = 2, report: bool = False) -> Path:
    extra = [] if report else ["--no-report"]
    proc = subprocess.run(cmd(ws, name, [*overrides, *extra], nproc), env=env(ws), cwd=ws,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = ws / "runs" / name
    run.joinpath("stdout.txt").write_text(proc.stdout)
    return run


def losses(run: Path, rank: int = 0) -> dict[int, float]:
    path = run / "steps.jsonl" if rank == 0 else run / "ranks" / f"rank{rank}" / "steps.jsonl"
    lines = path.read_text().split("\n")[:-1]  # an unterminated last line (a killed writer) is no record
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def assert_close(a: dict[int, float], b: dict[int, float]) -> None:
    assert a.keys() == b.keys()
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=LOSS_RTOL), (step, a[step], b[step])
