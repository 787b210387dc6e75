"""What `trainspeed tune` measured on a script, for the doctor's next report of that script.

The doctor predicts what is at stake ("~84 % of step time: the step waits for the DataLoader")
and names the tune that measures it; the tune measures it. Without a way back, the next doctor
run repeated a finding the tune had measured as no gain. The tune writes one small record per
working directory, `runs/tuned.json` (the tune and the doctor run a script from the same
folder), keyed by the script; the doctor adds to each finding whose `--knobs` the tune measured
what it read:

    {"schema": 1, "scripts": {"/abs/train.py": {"tunes": [{"tune": "runs/tune-train", "knobs": {
        "num_workers": [{"setting": "1", "verdict": "no measurable change", "speedup": 0.98}]},
        "command": ["python", "train.py"]}, ...]}}}

Every tune of a script is kept, newest first (a tune resumed into the same --out replaces its
own entry): the doctor prints one one-knob tune per finding, and a newcomer who ran three saw
the second drop the first's verified fused AdamW gain and the third (on a loaded machine)
reverse it. A finding shows the newest tune that measured its knobs with exactly the doctor's
flags, else the newest, naming the flags it ran otherwise; and one that read otherwise. An
entry of the first form ({"tune", "knobs", "command"}) reads as one tune.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

RECORD = Path("runs") / "tuned.json"
"""Beside the run directories (runs/ is where both write by default): never among the user's files."""
GAIN = "faster"
NO_CHANGE = "no measurable change"
LOOKS_LIKE_A_GAIN = 1.05
"""A speedup that reads as a gain beside "no gain" (1.01x does not; 3.22x does)."""
MAX_TUNES = 8
"""Tunes kept per script (the oldest go first)."""


def script_key(kind: str, name: str) -> str:
    """The script a command runs (runner.Target's kind and name): its absolute path, or the
    module of `python -m`."""
    return os.path.abspath(name) if kind == "path" else f"-m {name}"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema") == 1 else {}


def record_tune(key: str, tune_dir: str | Path, rows: Sequence[dict[str, Any]],
                root: Path | None = None, command: Sequence[str] | None = None,
                kept: dict[str, Any] | None = None) -> Path | None:
    """Record the measured rows (knob, setting, verdict, speedup, ci) of a tune of script `key`,
    run as `command` (its flags: a doctor run with others is told so); with `kept`, the tune's
    best settings, whether each row's setting is among them."""
    from trainspeed.fileio import atomic_write_text

    measured = [r for r in rows if r.get("speedup") is not None]
    if not measured:
        return None
    path = (root or Path.cwd()) / RECORD
    data = _read(path) or {"schema": 1, "scripts": {}}
    knobs: dict[str, list[dict[str, Any]]] = {}
    for r in measured:
        row = {k: r.get(k) for k in ("setting", "verdict", "speedup", "ci")}
        settings = r.get("settings")
        if kept is not None and isinstance(settings, dict) and settings:
            row["kept"] = all(k in kept and kept[k] == v for k, v in settings.items())
        knobs.setdefault(str(r["knob"]), []).append(row)
    entry: dict[str, Any] = {"tune": str(tune_dir), "knobs": knobs}
    if command is not None:
        entry["command"] = list(command)
    scripts = data.setdefault("scripts", {})
    earlier = [t for t in _tunes(scripts.get(key)) if t.get("tune") != entry["tune"]]
    scripts[key] = {"tunes": [entry, *earlier][:MAX_TUNES]}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    return path


def _tunes(entry: Any) -> list[dict[str, Any]]:
    """A script's tunes, newest first (an entry of the first form is one tune)."""
    if not isinstance(entry, dict):
        return []
    tunes = entry.get("tunes") if "tunes" in entry else [entry]
    return [t for t in tunes or [] if isinstance(t, dict) and isinstance(t.get("knobs"), dict)]


def _own_knobs(finding: dict[str, Any], applied: Sequence[str]) -> list[str]:
    """The knobs of the finding's verify command, less those a `run --with` plan applied (its
    tunes measure them first, checks/context.py), unless those are all it names."""
    from trainspeed.doctor.findings import verify_knobs

    knobs = verify_knobs(finding)
    return [k for k in knobs if k not in applied] or knobs


def _measured(knobs: Sequence[str], tune: dict[str, Any]) -> tuple[bool, str] | None:
    """(a gain, its figures) of what one tune measured for the knobs, or None."""
    rows = [(knob, r) for knob in knobs for r in tune["knobs"].get(knob, [])]
    if not rows:
        return None
    won = [(k, r) for k, r in rows if r.get("verdict") == GAIN]
    if not won:
        return False, _figures(rows[:4])
    # the settings that did not win beside the winners: the demo's after-run advised
    # num_workers=1 under a tuned line of num_workers=2 1.52x, and 1 had read 1.02x
    rest = [(k, r) for k, r in rows if r.get("verdict") != GAIN][:max(0, 4 - len(won))]
    return True, _figures(won[:4]) + (f" (no gain: {_figures(rest)})" if rest else "")


UNSETTLED = {"not measurable while the machine is busy": "other processes' load differed, not kept",
             "loss mismatch": "its loss differed, not kept"}
"""Verdicts that leave a figure which reads like a gain but is none, and what they say beside it:
super_resolution's doctor read 'no gain: threads=1 1.62x', the 1.62x a busy machine's, unjudged."""


def _figures(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """`num_workers=2 1.52x, num_workers=1 0.98x`, a figure no verdict judged saying why
    (`threads=1 1.62x (other processes' load differed, not kept)`)."""
    return ", ".join(f"{k}={r.get('setting')} {r.get('speedup'):.2f}x{_why_not(r)}" for k, r in rows)


def _why_not(row: dict[str, Any]) -> str:
    """Why a figure that reads like a gain is none, or was not kept; empty otherwise. A newcomer's
    doctor read "measured a gain: threads=1 5.61x" of a tune that kept nothing (its verification
    was not measurable on a busy machine), and "no gain: fused_optimizer=fused 3.22x"."""
    verdict = row.get("verdict")
    if verdict in UNSETTLED:
        return f" ({UNSETTLED[verdict]})"
    if verdict == GAIN and row.get("kept") is False:
        return " (faster alone; not kept in best.yaml)"
    if verdict == NO_CHANGE and (row.get("speedup") or 0.0) >= LOOKS_LIKE_A_GAIN:
        return " (inside the noise)"
    return ""


def _ran_as(tune: dict[str, Any], command: Sequence[str] | None) -> bool | None:
    """Whether the tune ran the script with exactly the doctor's flags; None where either command
    is unknown (a record written before tunes kept theirs, a caller without one)."""
    from trainspeed.doctor.flag_changes import same_args

    tuned = tune.get("command")
    if command is None or not isinstance(tuned, list):
        return None
    return same_args([str(a) for a in tuned], command)


def _other_flags(tune: dict[str, Any], command: Sequence[str]) -> str:
    """`, with other flags: --emsize 1024 (here 512)`: which flags, briefly (the whole command
    where they differ only in order)."""
    import shlex

    from trainspeed.doctor.flag_changes import flag_changes

    tuned = [str(a) for a in tune["command"]]
    return f", with other flags: {flag_changes(tuned, command) or '`' + shlex.join(tuned) + '`'}"


def _chosen(finding: dict[str, Any], entry: dict[str, Any], command: Sequence[str] | None,
            applied: Sequence[str]) -> tuple[list, list[int], int] | None:
    """The tunes that measured the knobs the finding's verify command names, each with what it
    read (newest first); those that ran the doctor's very `command`; and the index of the one a
    finding shows: the newest of the same command, else the newest."""
    knobs = _own_knobs(finding, applied)
    found = [(t, m) for t in _tunes(entry) for m in [_measured(knobs, t)] if m is not None]
    if not found:
        return None
    same = [i for i, (t, _) in enumerate(found) if _ran_as(t, command)]
    return found, same, same[0] if same else 0


def tuned_line(finding: dict[str, Any], entry: dict[str, Any], command: Sequence[str] | None = None,
               applied: Sequence[str] = ()) -> str | None:
    """What a tune that measured the knobs the finding's verify command names read, or None: the
    newest that ran the script with exactly the doctor's `command` (said so), else the newest,
    with the flags it ran otherwise (word_language_model's doctor run at --emsize 512 was shown
    a newer tune of --emsize 1024 as its own, over an older tune of its very command); and a
    tune that read otherwise (a gain against none)."""
    chosen = _chosen(finding, entry, command, applied)
    if chosen is None:
        return None
    found, same, at = chosen
    tune, (gain, figures) = found[at]
    line = f"trainspeed tune measured {'a gain' if gain else 'no gain'}: {figures} ({tune.get('tune')})"
    if same:
        newer_other = any(_ran_as(t, command) is False for t, _ in found[:at])
        line += ", with the same flags" + (" (a newer tune ran other flags)" if newer_other else "")
    elif _ran_as(tune, command) is False:
        line += _other_flags(tune, command or [])
    # the tune that read otherwise: of this command first, else the newest
    rest = [i for i in [*same, *range(len(found))] if i != at and found[i][1][0] != gain]
    if rest:
        other, (other_gain, other_figures) = found[rest[0]]
        when = "an earlier" if rest[0] > at else "a newer"
        flags = " of other flags" if _ran_as(other, command) is False else ""
        line += (f"; {when} tune{flags} read {'a gain' if other_gain else 'no gain'}: {other_figures} "
                 f"({other.get('tune')})")
    return line


ANY_SETTING = "*"
"""Finding.advises' setting for a knob advised at all, whatever its setting (compile, fused)."""
REFUTED = ("no measurable change", "slower")
"""Verdicts that measure a setting as no gain (stats.NO_CHANGE, stats.SLOWER): a finding that
advises it is told so. A busy machine's or a loss mismatch's figure (UNSETTLED) refutes nothing."""


def measured_advice(finding: dict[str, Any], tune: dict[str, Any], command: Sequence[str] | None = None,
                    applied: Sequence[str] = (), root: Path | None = None) -> str | None:
    """The finding's recommendation as a tune's measurement leaves it, or None where it stands:
    a setting the finding advises (Finding.advises) that the tune measured as no gain is not
    advised again; the setting of that knob that won is, or kept where this run applied the
    tune's plan; then the finding's `otherwise`. The demo's after-run, on the tune's num_workers=2,
    advised "use fewer (num_workers=1)", which that tune had read at 1.00x beside 2's 1.64x."""
    import shlex

    for knob, setting in (finding.get("advises") or {}).items():
        rows = [r for r in tune["knobs"].get(knob, []) if isinstance(r, dict) and r.get("speedup") is not None]
        # ANY_SETTING: the finding advises the knob at all (compile, fused): refuted by every row
        lost_rows = (rows if rows and all(r.get("verdict") in REFUTED for r in rows) else []) if setting == ANY_SETTING \
            else [r for r in rows if str(r.get("setting")) == str(setting) and r.get("verdict") in REFUTED]
        if not lost_rows:
            continue
        where = f"({tune.get('tune')})"
        lost = ", ".join(f"{knob}={r.get('setting')} at {r['speedup']:.2f}x ({r['verdict']})" for r in lost_rows[:3])
        won = sorted((r for r in rows if r.get("verdict") == GAIN), key=lambda r: -float(r["speedup"]))
        otherwise = finding.get("otherwise") or ""
        if not won:
            advice = f"not {knob}{'' if setting == ANY_SETTING else '=' + setting}: trainspeed tune measured {lost} {where}"
        elif knob in applied:
            advice = (f"keep the tune's {knob}: it measured {knob}={won[0]['setting']} at {won[0]['speedup']:.2f}x "
                      f"and {lost} {where}")
        else:
            advice = (f"{knob}={won[0]['setting']}, not {setting}: trainspeed tune measured it at "
                      f"{won[0]['speedup']:.2f}x and {lost} {where}")
            base = root or Path.cwd()
            plan = base / str(tune.get("tune")) / "best.yaml"  # a tune's --out: relative, or absolute
            if command and plan.is_file():
                shown = plan.relative_to(base) if plan.is_relative_to(base) else plan
                advice += f"; `trainspeed run --with {shlex.quote(str(shown))} -- {shlex.join(command)}` runs the tune's settings"
        return f"{advice}; {otherwise}" if otherwise else advice
    return None


def annotate(findings: list[dict[str, Any]], key: str, root: Path | None = None,
             command: Sequence[str] | None = None, applied: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The findings, each that a tune of script `key` measured carrying `tuned` (the line); the
    doctor's `command`, to say when the tune ran other flags; `applied`, the knobs of the
    settings a `run --with` plan applied (a finding of another knob is not shown their tune)."""
    entry = _read((root or Path.cwd()) / RECORD).get("scripts", {}).get(key)
    if not entry:
        return findings
    for f in findings:
        line = tuned_line(f, entry, command, applied)
        if line:
            f["tuned"] = line
        chosen = _chosen(f, entry, command, applied) if f.get("advises") else None
        if chosen is not None:  # the advice a tune measured as no gain, replaced by what it measured
            found, _, at = chosen
            advice = measured_advice(f, found[at][0], command, applied, root)
            if advice:
                f["recommendation"] = advice
    return findings


__all__ = ["ANY_SETTING", "RECORD", "REFUTED", "annotate", "measured_advice", "record_tune", "script_key", "tuned_line"]
