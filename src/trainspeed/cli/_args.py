"""Argument types the subcommands share: what a person types is read one way, or refused with
the way to write it."""

from __future__ import annotations

import argparse
import re

_BARE_NUMBER = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*$")


def duration(text: str) -> str:
    """A duration with its unit (90s, 10m, 1h), returned as written for tune.session.parse_budget.
    A bare number is refused: `--budget 10` read as 10 seconds ran a tune that measured nothing,
    where the user meant 10 minutes."""
    if _BARE_NUMBER.match(text):
        n = text.strip()
        raise argparse.ArgumentTypeError(f"{n!r} has no unit; write {n}s, {n}m or {n}h")
    if re.match(r"^\s*-", text):
        raise argparse.ArgumentTypeError(f"{text.strip()!r} is negative; a duration is positive, e.g. 90s, 10m or 1h")
    if not re.match(r"^\s*[0-9]*\.?[0-9]+\s*[smhSMH]\s*$", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 90s, 10m or 1h")
    return text


__all__ = ["duration"]
