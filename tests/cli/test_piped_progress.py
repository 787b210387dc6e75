"""`trainspeed tune ... | tee log`: the tables fit the log's width (test_piped_width.py), and now
the progress lines printed while it runs do too (tune/progress.py). They were single lines of
150-300 characters (what the baseline saw, how long the trials run, the closing line); now they
fold at word boundaries, every figure kept, at $COLUMNS or PIPE_WIDTH into a pipe, and at the
terminal's own width on a terminal."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from trainspeed.cli.tune import no_winner_line
from trainspeed.tune.table import result_from_json

pytestmark = pytest.mark.timeout(300)  # a tiny tune (~15 s) and its resumed rerun

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "assets" / "scripts" / "data_bound.py"
TUNE = ["tune", "--knobs", "threads,num_workers", "--budget", "1m", "--steps", "6", "--warmup-steps", "1",
        "--repeats", "1", "--verify-repeats", "0", "--max-rounds", "1", "--out", "runs/tune", "--", "python", "train.py"]
FIGURE = r"[\d.]+ ?(?:ms|s)"
TRIAL_LENGTH = re.compile(rf"the first baseline trial took [\d.]+ s: [\d.]+ s to start, \d+ steps of {FIGURE}-{FIGURE} "
                          rf"\(median {FIGURE}\); each trial runs 1 warm-up \+ 6 measured steps \(~[\d.]+ s\)")
SAW = re.compile(r"the baseline saw: training DataLoader at train\.py:\d+ \(num_workers=0\); model Sequential called at "
                 r"train\.py:\d+; SGD built at train\.py:\d+; 1 flags \(--steps\)")


def env(cwd: Path, columns: str | None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out.update({"PYTHONPATH": str(ROOT / "src"), "TRAINSPEED_CACHE": str(cwd / "cache"),
                "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    if columns is not None:
        out["COLUMNS"] = columns
    return out


def piped(cwd: Path, columns: str | None) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "trainspeed", *TUNE], cwd=cwd, env=env(cwd, columns),
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def on_terminal(cwd: Path, columns: int) -> list[str]:
    """The CLI's stdout on a pseudo-terminal `columns` wide."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "trainspeed", *TUNE], cwd=cwd, env=env(cwd, None),
                            stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=280) == 0, proc.stderr.read()[-3000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))  # rich's colours
    return text.replace("\r\n", "\n").splitlines()


def progress_of(lines: list[str]) -> list[str]:
    """The lines printed while the tune runs: up to its first table."""
    return lines[:next(i for i, line in enumerate(lines) if line.startswith("baseline: "))]


def unfolded(lines: list[str]) -> str:
    """The text as one line per word run: a folded line's parts read back with single spaces."""
    return " ".join(line.strip() for line in lines)


def test_progress_lines_fold_at_the_log_width_with_every_figure(tmp_path):
    shutil.copy(SCRIPT, tmp_path / "train.py")
    out = piped(tmp_path, "70")
    progress = progress_of(out)
    assert not [line for line in progress if len(line) > 70], progress
    text = unfolded(progress)
    assert TRIAL_LENGTH.search(text) and SAW.search(text), progress  # whole, figures and all, once read back
    folded = [line for line in progress if line.startswith("    ") and not line.lstrip()[0].isdigit()]
    assert len(folded) >= 2, progress  # those two did not fit 70 columns: they folded, indented
    results = [line for line in progress if re.fullmatch(r"    [\d.]+ ms/sample, loss [\d.]+, [\d.]+ s", line)]
    trials = [line for line in progress if re.fullmatch(r"  trial .+ \(#\d\) \.\.\.", line)]
    assert len(results) == len(trials) >= 5, progress  # every trial's own two lines, as they were
    closing = out[next(i for i, line in enumerate(out) if line.startswith("table: ")) + 1:]
    assert not [line for line in closing if len(line) > 70], closing
    said = no_winner_line(result_from_json(json.loads((tmp_path / "runs/tune/tune.json").read_text())))
    assert unfolded(closing).startswith(said + " no patch: "), (said, closing)  # the closing line, whole

    # On a terminal: its own width (here 60, $COLUMNS unset), not the log's 110. The rerun
    # resumes, so it prints what the stored trials say without running them.
    terminal = progress_of(on_terminal(tmp_path, 60))
    assert not [line for line in terminal if len(line) > 60], terminal
    assert TRIAL_LENGTH.search(unfolded(terminal)) and SAW.search(unfolded(terminal)), terminal
