"""How two runs of one script differ in its flags, in a few words.

The doctor shows what an earlier `trainspeed tune` of the script measured; a tune that ran the
script with other flags (another --batch-size, another model size) measured another workload,
and the reader must see which flags differ without reading two long command lines side by side.
Pure and import-light: it reads commands, never runs them.
"""

from __future__ import annotations

from typing import Sequence

from trainspeed.doctor.command_words import script_words

MAX_SHOWN = 3
"""Differences named before "+N more": a finding's line stays one line."""


def script_args(command: Sequence[str]) -> list[str]:
    """The script's own arguments: the command past the interpreter, its options and the script
    (`train.py` or `-m mod`), so `python3 train.py --lr 1` and `python train.py --lr 1` agree."""
    words = script_words(command)
    return words[2:] if words[:1] == ["-m"] else words[1:]


def same_args(a: Sequence[str], b: Sequence[str]) -> bool:
    """The two commands run their script with exactly the same arguments, in the same order."""
    return script_args(a) == script_args(b)


def _is_value(word: str) -> bool:
    """`-1e-3` is a value of the flag before it, not a flag of its own."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def _groups(args: Sequence[str]) -> dict[str, list[str]]:
    """Each flag with the words that follow it (`--lr 3e-4` -> {"--lr": ["3e-4"]}, `--x=1` alike);
    a Hydra override `model.size=big` is a flag of its own; words before any flag are under ""."""
    groups: dict[str, list[str]] = {}
    current = ""
    for word in args:
        if word.startswith("-") and len(word) > 1 and not _is_value(word):
            current, eq, value = word.partition("=")
            groups[current] = [value] if eq else []
        elif "=" in word and not word.startswith("="):
            current, _, value = word.partition("=")
            groups[current] = [value]
        else:
            groups.setdefault(current, []).append(word)
    return groups


def _shown(name: str, values: list[str]) -> str:
    return " ".join([name, *values]) if name else " ".join(values)


def flag_changes(tuned: Sequence[str], here: Sequence[str]) -> str:
    """What the tuned command ran differently from `here` (the doctor's command), briefly:
    `--emsize 1024 (here 512), --batch-size 64 (not here), without --amp`; "" where the flags
    are the same (in another order, or the interpreter differs)."""
    theirs, ours = _groups(script_args(tuned)), _groups(script_args(here))
    changes: list[str] = []
    for name, values in theirs.items():
        if name not in ours:
            changes.append(f"{_shown(name, values)} (not here)")
        elif ours[name] != values:
            changes.append(f"{_shown(name, values)} (here {' '.join(ours[name]) or 'no value'})")
    changes += [f"without {_shown(name, values)}" for name, values in ours.items() if name not in theirs]
    more = len(changes) - MAX_SHOWN
    return ", ".join(changes[:MAX_SHOWN]) + (f", +{more} more" if more > 0 else "")


__all__ = ["flag_changes", "same_args", "script_args"]
