"""Who wrote a run directory, and so which verify command its user can run.

The checks name two kinds of run: a script the doctor ran (config.yaml holds its `command`;
a fix is verified by the script tuner or the doctor on that command) and an engine run of a
config naming a recipe (verified by `trainspeed tune CONFIG`). Two more kinds end with a
diagnosis since findings are computed at every run's end (telemetry/diagnosis.py):

- a script that runs its own `Monitor` loop: no config, but run_start records the process's
  command line (`argv`), so the run is diagnosed as that script's run, and its commands
  (`trainspeed tune --knobs K -- python train.py`, `trainspeed doctor -- ...`) re-run it.
  Run from a notebook or `python -c`, there is no script to re-run;
- a `Trainer` built in Python on the user's own model: config.yaml holds the TrainConfig, but
  with no `recipe.name` the tuner cannot build the model (`trainspeed tune CONFIG` refuses).

For those, a verify command that names a config (or the CONFIG.yaml placeholder), or the doctor
on the `python train.py` placeholder, is replaced by the comparison the user can run: this run against one re-run with the change, with the engine
setting the finding names (`(engine: data.num_workers=1)` in its recommendation) for a Trainer.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

from trainspeed.telemetry.rundir import RunData

NOT_SCRIPTS = frozenset({"pytest", "ipykernel_launcher", "ipykernel", "IPython", "jupyter", "code", "pdb"})
"""`python -m NAME` launchers that run something other than a training script."""

_ENGINE_HINT = re.compile(r"\(engine: ([^)]*)\)")


def recorded_argv(run: RunData) -> list[str] | None:
    """The command line the Monitor's process recorded at run_start, when it did."""
    for event in run.events_of("run_start"):
        argv = (event.get("data") or {}).get("argv")
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            return list(argv)
    return None


def script_command(argv: list[str] | None) -> list[str] | None:
    """`argv` when it runs a Python script (`python train.py ARGS`, `python -m pkg.train ARGS`)
    that can be run again; None for `python -c`, an interactive session or a test runner."""
    if not argv or len(argv) < 2:
        return None
    first = argv[1]
    if first == "-m":
        module = argv[2] if len(argv) > 2 else ""
        return argv if module and module.split(".")[0] not in NOT_SCRIPTS else None
    if first.endswith(".py") and Path(first).name not in ("ipykernel_launcher.py",):
        return argv
    return None


def is_engine_config(config: dict[str, Any]) -> bool:
    """config.yaml of a Trainer run: a dumped TrainConfig (it has a `recipe` section)."""
    return isinstance(config.get("recipe"), dict)


def as_diagnosed(run: RunData) -> RunData:
    """The run as the checks should see it: a run with no command and no engine config, whose
    process ran a script (its own Monitor loop), carries that script's command."""
    config = run.config if isinstance(run.config, dict) else {}
    if config.get("command") or is_engine_config(config):
        return run
    command = script_command(recorded_argv(run))
    if command is None:
        return run
    return dataclasses.replace(run, config={**config, "command": command})


def _needs_config_or_script(verify: str) -> bool:
    """`trainspeed tune CONFIG --knobs K` (not the script form `... -- CMD`), or a doctor command,
    which for a run with no recorded command names the `python train.py` placeholder."""
    return (verify.startswith("trainspeed tune ") and " -- " not in verify) or verify.startswith("trainspeed doctor")


_SUFFIX = re.compile(r"\(([^()]*)\)$")


def _user_loader(run: RunData, finding: dict[str, Any]) -> bool:
    """A data finding of a Trainer given a ready DataLoader: the engine's data.* do not apply."""
    if "(engine: data." not in str(finding.get("recommendation") or ""):
        return False
    for event in run.events_of("observation"):
        data = event.get("data") or {}
        if data.get("kind") == "dataloader" and data.get("role") == "train":
            return data.get("built_by") == "user"
    return False


def compare_command(run: RunData, finding: dict[str, Any]) -> str:
    """Verify by re-running with the change and comparing the two runs (with a noise interval);
    a condition the original command carried ("(on a quiet machine)") is kept."""
    hint = _ENGINE_HINT.search(str(finding.get("recommendation") or ""))
    engine = is_engine_config(run.config or {}) and not _user_loader(run, finding)
    suffix = _SUFFIX.search(str(finding.get("verify_with") or "").strip())
    if hint and engine:
        change = f"re-running with {hint.group(1)}"
    elif suffix and not suffix.group(1).startswith("after"):
        change = f"re-running {suffix.group(1)}"
    else:
        change = "the change"
    return f"trainspeed report {shlex.quote(str(run.path))} --compare NEW_RUN_DIR (after {change})"


def runnable_verify(run: RunData, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings whose verify command this run's user can run (see the module docstring)."""
    config = run.config if isinstance(run.config, dict) else {}
    if config.get("command"):
        return findings
    recipe = config.get("recipe")
    if isinstance(recipe, dict) and recipe.get("name"):
        return findings  # `trainspeed tune RUN/config.yaml` rebuilds the recipe's model
    out = []
    for finding in findings:
        verify = finding.get("verify_with")
        if isinstance(verify, str) and _needs_config_or_script(verify):
            finding = {**finding, "verify_with": compare_command(run, finding)}
        out.append(finding)
    return out


__all__ = ["as_diagnosed", "compare_command", "is_engine_config", "recorded_argv", "runnable_verify",
           "script_command"]
