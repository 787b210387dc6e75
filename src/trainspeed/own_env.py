"""Environment variables trainspeed sets in its own process (the hf recipe's HF_HUB_OFFLINE):
a command printed for the user's script must not carry them as if the user had (doctor/
instrument/run_env.py reads this). A doctor test that ran after an hf recipe test in the same
process printed `HF_HUB_OFFLINE=1 trainspeed tune ...`."""

from __future__ import annotations

import os

SET_BY_TRAINSPEED: set[str] = set()
"""Names this process set, never ones it found already set."""


def setdefault(name: str, value: str) -> None:
    """os.environ.setdefault(name, value), remembering the name when it was trainspeed's doing."""
    if name not in os.environ:
        os.environ[name] = value
        SET_BY_TRAINSPEED.add(name)
