"""Every shell command shown in README.md and docs/*.md (issue #30), so no documented command can
break unseen.

Two tiers, both in the default run:
- every `trainspeed ...` command (also under torchrun, deepspeed, `python -m`) is read by the
  real command line: the subcommand, its options (a renamed option fails), durations, knob names,
  and for a recipe or config target the overrides, loaded and checked as `train`/`tune` load them;
- the commands a newcomer types first run for real on tiny stand-ins: placeholders (train.py,
  my.yaml, runs/a, runs/b, runs/tune-train) filled by the test, the doctor's steps cut to a few.
Other commands (make, git, benchmarks, SLURM) are checked for what the repository holds: the
make target, the benchmark script.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TINY_GPT = ["recipe.options.size=null", "recipe.options.n_layer=1", "recipe.options.n_head=2",
            "recipe.options.n_embd=32", "recipe.options.block_size=32", "data.batch_size=4",
            "recipe.options.samples_per_epoch=256", "recipe.options.val_samples=16", "run.max_steps=4",
            "eval.every_steps=null", "logging.progress=false"]
SCRIPT = """import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--epochs", type=int, default=1)
a = p.parse_args()
model = torch.nn.Linear(32, 8)
opt = torch.optim.SGD(model.parameters(), lr=a.lr)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(512, 32), torch.randn(512, 8)),
                                   batch_size=16)
for _ in range(a.epochs):
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""
NOT_COMMANDS = ("export ", "cd ", "head=", "ARGS=", "srun ", "git --git-dir", "pip install setuptools")
"""Shell set-up lines, not commands of ours: nothing in the repository to check them against."""


def shell_commands(path: Path) -> list[str]:
    """The commands of a file's bash code blocks, continuation lines joined, comments kept out."""
    out: list[str] = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
        for command in re.sub(r"\\\n\s*", " ", block).splitlines():
            if command.strip() and not command.strip().startswith("#"):
                out.append(command.strip())
    return out


COMMANDS = [(path.relative_to(ROOT).as_posix(), c) for path in DOCS for c in shell_commands(path)]


def words_of(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # OMP_NUM_THREADS=1 torchrun ...
        words.pop(0)
    return words


def trainspeed_argv(words: list[str]) -> list[str] | None:
    """The argv trainspeed gets from a command: `trainspeed X`, `python -m trainspeed X`,
    `torchrun ... -m trainspeed X`, `deepspeed ... --module trainspeed X`; None when it is not ours."""
    if words and words[0] == "trainspeed":
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] in ("-m", "--module") and words[i + 1] == "trainspeed":
            return words[i + 2:]
    return None


def _fill(argv: list[str], work: Path) -> list[str]:
    """Placeholders to the test's stand-ins: a synopsis's `<the same flags>`, a doctor run dir."""
    out = []
    for word in argv:
        if word in ("<the", "same", "flags>"):
            continue
        if word in ("RUN", "runs/doctor-train-..."):
            word = str(work / "doctor-run")
        out.append(word)
    return out


def check_cli(argv: list[str], work: Path) -> None:
    """Read `argv` as `trainspeed` does, up to the work: parser, options, knobs, a target's keys."""
    from trainspeed.cli import _target
    from trainspeed.cli.main import _subparser, build_parser, unknown_command, unknown_options

    parser = build_parser()
    wrong = unknown_command(parser, argv)
    assert not wrong, wrong
    try:
        args, extras = parser.parse_known_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"argparse refused it (exit {exc.code})") from None
    assert not extras, unknown_options(_subparser(parser, args.subcommand), extras)
    if args.subcommand not in ("train", "tune") or args.target is None:
        return
    from trainspeed.cli.tune import is_script_command

    if args.subcommand == "tune" and is_script_command(args.target):
        from trainspeed.tune.script_knobs import parse_script_knobs

        parse_script_knobs(args.knobs)
        return
    module = __import__(f"trainspeed.cli.{args.subcommand}", fromlist=["_add_options"])
    asked_help, overrides = _target.parse_rest(args, module._add_options, f"trainspeed {args.subcommand}")
    if args.subcommand == "tune":
        from trainspeed.tune.knobs import parse_knobs

        parse_knobs(args.knobs)
    target = args.target
    if not (target in ("gpt", "seqvae", "convnext", "hf") or target.endswith(".yaml")):
        return
    if target.endswith(".yaml"):
        target = str(work / "my.yaml") if Path(target).name == "my.yaml" else target
        if not Path(target).is_file():  # a tune's output (runs/tune-gpt/best.yaml): a config like my.yaml
            target = str(work / "my.yaml")
    variant = "naive" if getattr(args, "naive", False) else (getattr(args, "variant", None) or "fast")
    _target.load(target, [o for o in overrides if not o.startswith("distributed.deepspeed=")], variant, quiet=True)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("docs")
    (work / "train.py").write_text(SCRIPT)
    (work / "doctor-run").mkdir()
    from trainspeed.cli import _target

    cfg, _ = _target.load("gpt", TINY_GPT, "naive", quiet=True)
    (work / "my.yaml").write_text(_target.config_yaml(cfg, keep_name=False))
    return work


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_every_documented_command_is_read_as_written(where, command, work):
    if command.startswith(NOT_COMMANDS):
        return
    words = words_of(command)
    argv = trainspeed_argv(words)
    if argv is not None:
        if any(w.startswith("[") or "|" in w for w in argv):  # a synopsis: `tune [--budget 10m] ...`
            argv = [w for w in argv if not (w.startswith("[") or w.endswith("]") or "|" in w)]
            argv = argv[:1]
        check_cli(_fill(argv, work), work)
    elif words[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), f"no make target {words[1]}"
    elif words[0] == "python" and words[1].startswith("benchmarks/"):
        assert (ROOT / words[1]).is_file(), f"{words[1]} is not in the repository"
    elif words[0] == "source":  # the venv the Makefile creates
        venv = re.search(r"^VENV \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
        assert words[1] == f"{venv}/bin/activate", command
    elif words[:2] == ["pip", "install"]:
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for spec in (w for w in words[2:] if "[" in w):
            for extra in spec.split("[", 1)[1].rstrip("]").split(","):
                assert extra in extras, f"no extra {extra!r} in pyproject.toml ({command})"
    elif words[0] == "git":
        assert words[1] == "apply", command  # the tune's patch: applied in test_the_first_commands_run
    else:
        assert words[0] in ("python", "torchrun"), f"unknown kind of command in {where}: {command}"


def _run(argv: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRAINSPEED_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "trainspeed", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(600)  # a few subprocesses of seconds each; minutes on a busy 2-core machine
def test_the_first_commands_run(tmp_path):
    """README's "On your own script" and "Read a run" commands, run as printed on tiny stand-ins."""
    (tmp_path / "train.py").write_text(SCRIPT)
    readme = shell_commands(ROOT / "README.md")
    doctor = next(c for c in readme if c.startswith("trainspeed doctor -- python train.py --lr 3e-4"))
    argv = trainspeed_argv(words_of(doctor))
    for name in ("a", "b"):  # the doctor twice: runs/a and runs/b for the report commands
        res = _run([argv[0], "--steps", "12", "--out", f"runs/{name}", "--no-html", *argv[1:]], tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
    for command in (c for c in readme if c.startswith("trainspeed report runs/a")):
        res = _run(trainspeed_argv(words_of(command)), tmp_path)
        assert res.returncode == 0 and (tmp_path / "runs" / "a" / "report.html").is_file(), res.stderr[-3000:]
    for command in ("trainspeed recipes", "trainspeed tune --help-knobs"):
        assert any(command in c for path in DOCS for c in shell_commands(path)), command
        res = _run(command.split()[1:], tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("command", [
    "trainspeed doctor --stpes 100 -- python train.py",        # a renamed or mistyped option
    "trainspeed tune --budget 10 -- python train.py",           # a duration without its unit
    "trainspeed tune -- python train.py --knobs x",             # fine: the script's own flag
    "trainspeed tune --knobs precison -- python train.py",      # an unknown knob
    "trainspeed train gpt --naive run.max_stesp=200",          # an unknown key
    "trainspeed tune gpt --budget 10m data.num_wokers=2",       # an unknown key after the options
    "trainspeed trian gpt",                                     # an unknown command
])
def test_the_reading_fails_on_a_broken_command(command, work):
    argv = trainspeed_argv(words_of(command))
    if "--knobs x" in command:
        check_cli(argv, work)
        return
    with pytest.raises((AssertionError, Exception)):
        check_cli(argv, work)
