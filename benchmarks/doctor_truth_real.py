"""Real open-source training scripts for benchmarks/doctor_truth.py, run unchanged.

Each is taken from its repository at a pinned commit (`git show COMMIT:PATH` from a local git
directory of the repository: --mirror DIR holds OWNER+NAME/repo, as the session's fetch leaves
it; `git clone --bare https://github.com/OWNER/NAME DIR/OWNER+NAME/repo` makes one), given small
generated data, and run through its own flags.

Its true cause is settled by measurement, not by the doctor's reading: the script runs under
the doctor with its own settings (A) and with one knob changed (B), alternated A B A B, and the
median step time of each arm is compared (the doctor's step timer, a measurement, not a
diagnosis). When B is at least WIN faster, the knob's cost is the cause (`if_won`: the findings
that name it); else the knob is not (`if_lost`). An empty tuple means "no warning-level finding
about the script", and `bound` what the report's "where the time goes" must say.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

WIN = 1.3
"""B's median step at least 1.3x faster than A's: the knob's cost is real (a shared 2-core VM
moves a median by 10-20 % between runs)."""


@dataclass(frozen=True)
class Real:
    repo: str
    """owner/name on GitHub."""
    commit: str
    files: tuple[str, ...]
    """Paths to take from the repository (the script first)."""
    script: str
    """The entry point among `files` (run from the scratch directory)."""
    args: tuple[str, ...]
    """The script's own flags for the run; {tmp} is the scratch directory."""
    data: Callable[[Path], None]
    """Writes the small generated data the flags point at."""
    knob: tuple[str, ...]
    """Flags appended for arm B (argparse: the last value of a flag wins)."""
    knob_label: str
    if_won: tuple[str, ...]
    if_lost: tuple[str, ...]
    bound_if_won: str | None = None
    bound_if_lost: str | None = None


def _words(n: int, vocab: int, seed: int) -> str:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    lines = []
    for _ in range(n // 20):
        lines.append(" ".join(rng.choice(words) for _ in range(20)))
    return "\n".join(lines) + "\n"


def wikitext(tmp: Path) -> None:
    d = tmp / "data"
    d.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.txt", 60_000), ("valid.txt", 4_000), ("test.txt", 4_000)):
        (d / name).write_text(_words(n, 2_000, hash(name) % 1000))


def names(tmp: Path) -> None:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    (tmp / "names.txt").write_text("\n".join("".join(rng.choice(letters) for _ in range(rng.randint(3, 12)))
                                             for _ in range(8_000)) + "\n")


def shakespeare_bins(tmp: Path) -> None:
    import numpy as np

    d = tmp / "data" / "gen"
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 65, 200_000, dtype=np.uint16).tofile(d / "train.bin")
    rng.integers(0, 65, 20_000, dtype=np.uint16).tofile(d / "val.bin")
    import pickle

    with open(d / "meta.pkl", "wb") as f:  # what prepare.py of shakespeare_char writes: a 65-char vocabulary
        pickle.dump({"vocab_size": 65}, f)


def char_text(tmp: Path) -> None:
    rng = random.Random(0)
    # every character of the sample chargpt draws at each 500th iteration ("O God, O God!")
    chars = "abcdefghijklmnopqrstuvwxyzOG ,!\n"
    (tmp / "input.txt").write_text("".join(rng.choice(chars) for _ in range(200_000)))


EXAMPLES = "77f55b912142e11fcfdf5b530231fb9c52f181e8"
MAKEMORE = "988aa59e4d8fefa526d06f3b453ad116258398d4"
NANOGPT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"
MINGPT = "37baab71b9abea1b76ab957409a1cc2fbfba8a26"

REAL: dict[str, Real] = {
    "real_word_language_model": Real(
        "pytorch/examples", EXAMPLES,
        ("word_language_model/main.py", "word_language_model/model.py", "word_language_model/data.py"),
        "word_language_model/main.py", ("--data", "{tmp}/data", "--epochs", "1000", "--save", "{tmp}/model.pt"),
        wikitext, ("--emsize", "100", "--nhid", "100"), "the model's width halved",
        if_won=(), if_lost=(), bound_if_won="compute"),
    "real_makemore": Real(
        "karpathy/makemore", MAKEMORE, ("makemore.py",), "makemore.py",
        ("-i", "{tmp}/names.txt", "-o", "{tmp}/out", "--max-steps", "1000000"),
        names, ("--num-workers", "0"), "num_workers 4 -> 0",
        if_won=("dataloader_workers", "data_bound"), if_lost=(), bound_if_lost="compute"),
    "real_nanogpt": Real(
        "karpathy/nanoGPT", NANOGPT, ("train.py", "model.py", "configurator.py"), "train.py",
        ("--dataset=gen", "--device=cpu", "--compile=False", "--dtype=float32", "--n_layer=2", "--n_head=2",
         "--n_embd=128", "--block_size=64", "--batch_size=8", "--gradient_accumulation_steps=2",
         "--eval_interval=100000", "--eval_iters=5", "--log_interval=1", "--max_iters=1000000",
         "--always_save_checkpoint=False", "--out_dir={tmp}/out"),
        shakespeare_bins, ("--n_embd=64",), "the model's width halved",
        if_won=(), if_lost=(), bound_if_won="compute"),
    "real_mingpt_chargpt": Real(
        "karpathy/minGPT", MINGPT,
        ("projects/chargpt/chargpt.py", "mingpt/__init__.py", "mingpt/model.py", "mingpt/trainer.py",
         "mingpt/utils.py", "mingpt/bpe.py"),
        "projects/chargpt/chargpt.py",
        ("--model.model_type=gpt-nano", "--trainer.batch_size=16", "--trainer.max_iters=1000000",
         "--system.work_dir='{tmp}/out'"),  # a quoted literal: merge_from_args literal_eval()s it
        char_text, ("--trainer.num_workers=0",), "num_workers 4 -> 0",
        if_won=("dataloader_workers", "data_bound"), if_lost=(), bound_if_lost="compute"),
}


def git_dir(mirror: Path, repo: str) -> Path:
    return mirror / repo.replace("/", "+") / "repo"


def prepare(real: Real, tmp: Path, mirror: Path) -> tuple[Path, list[str], str]:
    """(script path, its arguments, a path to put first on PYTHONPATH) in `tmp`, the scratch
    directory the script runs in: the files at the pinned commit, laid out as in the
    repository (nanoGPT exec()s configurator.py from the working directory; chargpt imports
    the mingpt package), and the generated data."""
    gd = git_dir(mirror, real.repo)
    if not gd.exists():
        raise FileNotFoundError(f"{gd}: no git directory of {real.repo} (see this module's docstring)")
    src = tmp
    for path in real.files:
        out = src / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(subprocess.run(["git", "--git-dir", str(gd), "show", f"{real.commit}:{path}"],
                                       check=True, capture_output=True).stdout)
    real.data(tmp)
    args = [a.replace("{tmp}", str(tmp)) for a in real.args]
    return src / real.script, args, str(src)
